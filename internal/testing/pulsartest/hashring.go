package pulsartest

import (
	"encoding/binary"
	"math/bits"
	"slices"
	"sort"
	"strconv"
)

// murmur3 is MurmurHash3 x86_32 with seed 0 and the sign bit cleared, as
// Pulsar's Murmur3_32Hash.makeHash returns it.
func murmur3(data []byte) uint32 {
	const c1, c2 = 0xcc9e2d51, 0x1b873593
	mix := func(k uint32) uint32 { return bits.RotateLeft32(k*c1, 15) * c2 }
	var h uint32
	n := len(data) &^ 3
	for i := 0; i < n; i += 4 {
		h ^= mix(binary.LittleEndian.Uint32(data[i:]))
		h = bits.RotateLeft32(h, 13)*5 + 0xe6546b64
	}
	var tail uint32
	for i, b := range data[n:] {
		tail |= uint32(b) << (8 * i)
	}
	h ^= mix(tail)
	h ^= uint32(len(data))
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h & 0x7fffffff
}

// stickyKeyRange is the selector's key hash range [1, 65535]
// (StickyKeyConsumerSelector.DEFAULT_RANGE_SIZE - 1 as its end, 0 being
// STICKY_KEY_HASH_NOT_SET): 65535 values.
const stickyKeyRange = 2<<15 - 1

// stickyKeyHash is StickyKeyConsumerSelectorUtils.makeStickyKeyHash:
// murmur3 modulo the range's size plus its start, so never 0. Both the
// keys and the consumers' ring points are hashed this way.
func stickyKeyHash(key []byte) int {
	return int(murmur3(key)%stickyKeyRange) + 1
}

// noneKey is the sticky key of a message without ordering or partition key
// (Commands.peekStickyKey).
const noneKey = "NONE_KEY"

// keySharedSelector is StickyKeyConsumerSelector: the consumer that serves a sticky key hash.
type keySharedSelector interface {
	selectConsumer(hash int) *consumer
}

// stickyKeyHashOf is StickyKeyConsumerSelector.makeStickyKeyHash of the broker's selector:
// the consistent hashing ring's [1, 65535], or the hash ranges' [0, 65535] (0 taken as 1).
func (b *Broker) stickyKeyHashOf(key []byte) int {
	if b.opts.KeySharedHashRanges {
		return hashRangeKeyHash(key)
	}
	return stickyKeyHash(key)
}

// hashRangeSize is StickyKeyConsumerSelector.DEFAULT_RANGE_SIZE, 2 << 15: the hash range
// selector's key hashes are in [0, hashRangeSize-1].
const hashRangeSize = 2 << 15

// hashRangeKeyHash is StickyKeyConsumerSelectorUtils.makeStickyKeyHash over the range
// [0, 65535]: murmur3 mod 65536, and 1 instead of 0 (STICKY_KEY_HASH_NOT_SET).
func hashRangeKeyHash(key []byte) int {
	return max(int(murmur3(key)%hashRangeSize), 1)
}

// keyHashRanges is HashRangeAutoSplitStickyKeyConsumerSelector
// (subscriptionKeySharedUseConsistentHashing=false): each consumer serves the hashes up to
// the end of its range, (previous end, end]. The first consumer takes everything (end
// 65536); each next one splits the biggest range, the first of equals in hash order, and
// takes its lower half: new end = end - (end - previous end) / 2. A leaving consumer's range
// goes to the consumer of the range above it, or, if it had the top range, to the one below,
// which then ends at 65536. It follows consumers in join order, not by name: one that comes
// back splits a range again.
type keyHashRanges struct {
	ends   []int // ascending
	owners []*consumer
}

func (r *keyHashRanges) selectConsumer(hash int) *consumer {
	i, _ := slices.BinarySearch(r.ends, hash) // ceilingEntry
	if i == len(r.ends) {
		return nil
	}
	return r.owners[i]
}

// sync adds the consumers it does not have, in join order, and removes those gone.
func (r *keyHashRanges) sync(consumers []*consumer) {
	for i := len(r.owners) - 1; i >= 0; i-- {
		if !slices.Contains(consumers, r.owners[i]) {
			r.remove(i)
		}
	}
	for _, c := range consumers {
		if !slices.Contains(r.owners, c) {
			r.add(c)
		}
	}
}

func (r *keyHashRanges) add(c *consumer) {
	if len(r.ends) == 0 {
		r.ends, r.owners = []int{hashRangeSize}, []*consumer{c}
		return
	}
	biggest, size, lower := 0, 0, 0
	for i, end := range r.ends { // findBiggestRange: strictly bigger wins
		prev := 0
		if i > 0 {
			prev = r.ends[i-1]
		}
		if end-prev > size {
			biggest, size, lower = i, end-prev, prev
		}
	}
	if size <= 1 { // ConsumerAssignException: no range left to split
		return
	}
	split := r.ends[biggest] - (r.ends[biggest]-lower)>>1
	r.ends = slices.Insert(r.ends, biggest, split)
	r.owners = slices.Insert(r.owners, biggest, c)
}

func (r *keyHashRanges) remove(i int) {
	if i == len(r.ends)-1 && i > 0 { // the top range goes to the one below, extended to the top
		r.ends = slices.Delete(r.ends, i-1, i)
		r.owners = slices.Delete(r.owners, i, i+1)
		return
	}
	r.ends = slices.Delete(r.ends, i, i+1)
	r.owners = slices.Delete(r.owners, i, i+1)
}

type ringPoint struct {
	hash int
	c    *consumer
}

// keySharedRing is ConsistentHashingStickyKeyConsumerSelector (4.x): each
// consumer puts keySharedPoints points on the ring at
// hash(name \0 nameIndex \0 i); a key goes to the first point at or after its
// hash. Keyed by consumer NAME, so a consumer that reconnects under the same
// name gets the same ranges back. On a collision the consumer that joined
// first keeps the point (hashRing.putIfAbsent); the next colliding one
// takes it when that one leaves, as rebuilding the ring in join order does.
type keySharedRing []ringPoint

const keySharedPoints = 100 // subscriptionKeySharedConsistentHashingReplicaPoints

func buildKeySharedRing(consumers []*consumer) keySharedRing {
	byHash := map[int]*consumer{}
	nameUses := map[string]int{}
	for _, c := range consumers { // join order, as points were added
		idx := nameUses[c.name] // ConsumerNameIndexTracker: same-name consumers get 0, 1, ...
		nameUses[c.name]++
		for i := 0; i < keySharedPoints; i++ {
			key := c.name + "\x00" + strconv.Itoa(idx) + "\x00" + strconv.Itoa(i)
			if h := stickyKeyHash([]byte(key)); byHash[h] == nil {
				byHash[h] = c
			}
		}
	}
	ring := make(keySharedRing, 0, len(byHash))
	for h, c := range byHash {
		ring = append(ring, ringPoint{h, c})
	}
	slices.SortFunc(ring, func(a, b ringPoint) int { return a.hash - b.hash })
	return ring
}

func (r keySharedRing) selectConsumer(hash int) *consumer {
	if len(r) == 0 {
		return nil
	}
	i := sort.Search(len(r), func(i int) bool { return r[i].hash >= hash })
	if i == len(r) {
		i = 0
	}
	return r[i].c
}

// failoverIndex is AbstractDispatcherSingleActiveConsumer.pickAndScheduleActiveConsumer
// for consumers already sorted by priority then name, of which the first n
// share the highest priority: partition index mod n on a partition, else a
// ring of 100 points per consumer at murmur3(name + j), probed with the
// murmur3 of the topic name.
func failoverIndex(sorted []*consumer, n int, partition int, topic string) int {
	if partition >= 0 {
		return partition % n
	}
	byHash := map[uint32]int{}
	for i := 0; i < n; i++ {
		for j := 0; j < 100; j++ { // CONSUMER_CONSISTENT_HASH_REPLICAS
			byHash[murmur3([]byte(sorted[i].name+strconv.Itoa(j)))] = i
		}
	}
	hashes := make([]uint32, 0, len(byHash))
	for h := range byHash {
		hashes = append(hashes, h)
	}
	slices.Sort(hashes)
	probe := murmur3([]byte(topic))
	k := sort.Search(len(hashes), func(i int) bool { return hashes[i] >= probe })
	if k == len(hashes) {
		k = 0
	}
	return byHash[hashes[k]]
}
