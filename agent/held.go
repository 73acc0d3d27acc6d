package agent

import (
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// heldQueue is what the gate holds for the application: messages taken from the client while
// it was closed, or put back by a taker it closed on, oldest first.
type heldQueue struct{ items []heldMessage }

// heldMessage is a message taken from the client while the gate was closed.
type heldMessage struct {
	cm pulsar.ConsumerMessage
	at time.Time
}

func (q *heldQueue) len() int { return len(q.items) }

// push holds cm last, or first when front (a message a taker had in hand is older than any
// the queue still has).
func (q *heldQueue) push(cm pulsar.ConsumerMessage, front bool) {
	h := heldMessage{cm: cm, at: time.Now()}
	if front {
		q.items = append([]heldMessage{h}, q.items...)
	} else {
		q.items = append(q.items, h)
	}
}

// has reports whether a copy of the message id is held.
func (q *heldQueue) has(id pulsar.MessageID) bool {
	k := keyOf(id)
	for _, h := range q.items {
		if keyOf(h.cm.Message.ID()) == k {
			return true
		}
	}
	return false
}

// pop takes the oldest held message.
func (q *heldQueue) pop() (pulsar.ConsumerMessage, bool) {
	if len(q.items) == 0 {
		return pulsar.ConsumerMessage{}, false
	}
	cm := q.items[0].cm
	q.items[0] = heldMessage{}
	q.items = q.items[1:]
	return cm, true
}

// dropIf drops the held messages drop says so of, keeping the others in order, and returns
// how many it dropped.
func (q *heldQueue) dropIf(drop func(heldMessage) bool) int {
	kept := q.items[:0]
	for _, h := range q.items {
		if !drop(h) {
			kept = append(kept, h)
		}
	}
	dropped := len(q.items) - len(kept)
	clear(q.items[len(kept):])
	q.items = kept
	return dropped
}

// partitionSet names partitions as the client numbers them (a non-partitioned topic is 0);
// nil names every partition.
type partitionSet map[int32]bool

func newPartitionSet(partitions []int32) partitionSet {
	if partitions == nil {
		return nil
	}
	set := partitionSet{}
	for _, p := range partitions {
		set[max(p, 0)] = true
	}
	return set
}

func (s partitionSet) has(p int32) bool { return s == nil || s[p] }
