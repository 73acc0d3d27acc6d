package chaos

import (
	"strconv"
	"strings"
	"sync"

	"github.com/apache/pulsar-client-go/pulsar"
)

// bitset is a growable set of small non-negative integers.
type bitset struct{ words []uint64 }

func (b *bitset) add(i int64) bool {
	w := int(i / 64)
	for len(b.words) <= w {
		b.words = append(b.words, 0)
	}
	mask := uint64(1) << (i % 64)
	had := b.words[w]&mask != 0
	b.words[w] |= mask
	return !had
}

func (b *bitset) has(i int64) bool {
	w := int(i / 64)
	return w < len(b.words) && b.words[w]&(uint64(1)<<(i%64)) != 0
}

// prefix is the first integer not in the set: every smaller one is in it.
func (b *bitset) prefix() int64 {
	for w, word := range b.words {
		if word != ^uint64(0) {
			for bit := range 64 {
				if word&(uint64(1)<<bit) == 0 {
					return int64(w*64 + bit)
				}
			}
		}
	}
	return int64(len(b.words) * 64)
}

// ledger records what was produced and what reached the applications, per subscription.
type ledger struct {
	mu         sync.Mutex
	produced   map[string]int64              // topic -> messages 0..n-1 stored
	ids        map[string][]pulsar.MessageID // topic -> where message n was stored
	delivered  map[string]map[string]*bitset // subscription -> topic -> message numbers
	indexes    map[string]map[string]*bitset // subscription -> partition topic -> broker-entry indexes
	deliveries map[string]int64              // subscription -> deliveries, duplicates included
}

func newLedger() *ledger {
	return &ledger{produced: map[string]int64{}, ids: map[string][]pulsar.MessageID{}, delivered: map[string]map[string]*bitset{},
		indexes: map[string]map[string]*bitset{}, deliveries: map[string]int64{}}
}

func payload(topic string, n int64) []byte { return []byte(topic + "|" + strconv.FormatInt(n, 10)) }

// paddedPayload is payload(topic, n) grown to size bytes, for messages the producer chunks.
func paddedPayload(topic string, n int64, size int) []byte {
	p := append(payload(topic, n), '|')
	for len(p) < size {
		p = append(p, 'x')
	}
	return p
}

func parsePayload(p []byte) (topic string, n int64, ok bool) {
	topic, num, found := strings.Cut(string(p), "|")
	if !found {
		return "", 0, false
	}
	num, _, _ = strings.Cut(num, "|") // padding
	n, err := strconv.ParseInt(num, 10, 64)
	return topic, n, err == nil
}

// setProduced records that messages 0..n of topic are stored on the broker, n at id.
func (l *ledger) setProduced(topic string, n int64, id pulsar.MessageID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.produced[topic] = n + 1
	if int64(len(l.ids[topic])) == n {
		l.ids[topic] = append(l.ids[topic], id)
	}
}

// producedID is where message n of topic was stored, nil when not recorded.
func (l *ledger) producedID(topic string, n int64) pulsar.MessageID {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n < 0 || n >= int64(len(l.ids[topic])) {
		return nil
	}
	return l.ids[topic][n]
}

// deliver records a message handed to an application of subscription sub.
func (l *ledger) deliver(sub string, msg pulsar.Message) {
	topic, n, ok := parsePayload(msg.Payload())
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.deliveries[sub]++
	set(l.delivered, sub, topic).add(n)
	if idx := msg.Index(); idx != nil {
		set(l.indexes, sub, msg.Topic()).add(int64(*idx))
	}
}

func set(m map[string]map[string]*bitset, a, b string) *bitset {
	inner := m[a]
	if inner == nil {
		inner = map[string]*bitset{}
		m[a] = inner
	}
	s := inner[b]
	if s == nil {
		s = &bitset{}
		inner[b] = s
	}
	return s
}

// deliveredPrefix is the first broker-entry index of partitionTopic not yet delivered to sub:
// a seek to any index up to it loses nothing.
func (l *ledger) deliveredPrefix(sub, partitionTopic string) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return set(l.indexes, sub, partitionTopic).prefix()
}

// missing counts the produced messages of topics that sub has not received, with a few examples.
func (l *ledger) missing(sub string, topics []string) (int64, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var count int64
	var examples []string
	for _, t := range topics {
		got := set(l.delivered, sub, t)
		for n := range l.produced[t] {
			if !got.has(n) {
				count++
				if len(examples) < 5 {
					examples = append(examples, string(payload(t, n)))
				}
			}
		}
	}
	return count, examples
}

// missingIDs is where the produced messages of topic that sub has not received were stored
// (those whose id was recorded).
func (l *ledger) missingIDs(sub, topic string) []pulsar.MessageID {
	l.mu.Lock()
	defer l.mu.Unlock()
	got := set(l.delivered, sub, topic)
	var out []pulsar.MessageID
	for n, id := range l.ids[topic] {
		if !got.has(int64(n)) && id != nil {
			out = append(out, id)
		}
	}
	return out
}

// totals returns produced messages, deliveries (with duplicates) and distinct deliveries.
func (l *ledger) totals() (produced, deliveries, distinct int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, n := range l.produced {
		produced += n
	}
	for _, d := range l.deliveries {
		deliveries += d
	}
	for _, topics := range l.delivered {
		for _, s := range topics {
			for _, w := range s.words {
				for ; w != 0; w &= w - 1 {
					distinct++
				}
			}
		}
	}
	return produced, deliveries, distinct
}
