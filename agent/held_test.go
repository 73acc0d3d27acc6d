package agent

import (
	"slices"
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"
)

func TestHeldQueueKeepsOrderAndDropsOnlyWhatItIsTold(t *testing.T) {
	var q heldQueue
	for seq := range 4 {
		q.push(pulsar.ConsumerMessage{Message: fakeMessage{seq: int64(seq)}}, false)
	}
	q.push(pulsar.ConsumerMessage{Message: fakeMessage{seq: 9}}, true) // a taker's, put back first
	if n := q.dropIf(func(h heldMessage) bool { return h.cm.Message.(fakeMessage).seq%2 == 1 }); n != 3 {
		t.Fatalf("dropped %d, want 3 (9, 1 and 3)", n)
	}
	var got []int64
	for cm, ok := q.pop(); ok; cm, ok = q.pop() {
		got = append(got, seqOf(t, cm.Message))
	}
	if !slices.Equal(got, []int64{0, 2}) || q.len() != 0 {
		t.Fatalf("popped %v (%d left), want 0 2", got, q.len())
	}
}
