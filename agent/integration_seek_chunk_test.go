package agent

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// A seek to an index inside a chunked message (a chunked message carries its last chunk's
// index, so any of its chunks' indexes names it) delivers that message whole first, nothing
// from before it, and leaves no chunk in the backlog: a client that receives a message's later
// chunks without its first drops them unacknowledged, so the cursor must go back to the first
// chunk. With producers interleaving their chunks the cursor goes back to where every message
// it cuts into starts, and the whole messages that end before the target are dropped.
func TestIntegrationSeekIntoAChunkedMessage(t *testing.T) {
	for _, tc := range []struct {
		name        string
		interleaved bool
		chunk       int // which chunk of the target message the index names
	}{
		{name: "first chunk", chunk: 0},
		{name: "middle chunk", chunk: 1},
		{name: "last chunk, the message's own index", chunk: chunksPerMessage - 1},
		{name: "interleaved producers, middle chunk", interleaved: true, chunk: 1},
		{name: "interleaved producers, last chunk", interleaved: true, chunk: chunksPerMessage - 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, pulsartest.Options{EntriesPerLedger: entriesPerLedger})
			topic := uniqueTopic(t)
			c := e.subscribe(t, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub"})
			const n = 12
			if tc.interleaved {
				e.produceChunked(t, topic, 0, n)
			} else {
				e.produceChunkedInOrder(t, topic, n)
			}
			indexes := map[int]int64{} // message -> its index (its last chunk's)
			var order []int            // messages by index
			for _, m := range testkit.ReceiveAndAck(t, c, n, receiveLimit) {
				indexes[seqOfMessage(t, m)] = int64(*m.Index())
				order = append(order, seqOfMessage(t, m))
			}
			slices.SortFunc(order, func(a, b int) int { return int(indexes[a] - indexes[b]) })
			poll.Eventually(t, "acks", func() bool { return e.backlog(t, topic, "sub") == 0 })

			target := order[n/2]
			index := indexes[target] - int64(chunksPerMessage-1-tc.chunk)
			if tc.interleaved && tc.chunk != chunksPerMessage-1 {
				index = indexes[target] - 1 // a later chunk; which one depends on the interleaving
			}
			res, err := c.SeekByIndex(context.Background(), index)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("seek to index %d (message %d, index %d): %+v", index, target, indexes[target], res.Positions)

			col := collectChunked(t, c)
			var want []int
			for _, m := range order {
				if indexes[m] >= index {
					want = append(want, m)
				}
			}
			poll.Eventually(t, fmt.Sprintf("messages %v and the backlog drained", want), func() bool {
				return col.count() >= len(want) && e.backlog(t, topic, "sub") == 0
			})
			select {
			case bad := <-col.bad:
				t.Fatal(bad)
			default:
			}
			got := col.seqsCopy()
			if !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))) {
				t.Fatalf("after the seek to index %d the application received %v, want %v", index, got, want)
			}
			if !tc.interleaved && got[0] != target {
				t.Fatalf("first message after the seek %d, want %d", got[0], target)
			}
		})
	}
}

// produceChunkedInOrder sends messages 0..n-1 as chunked messages from one producer, one after
// the other, so that each message's chunks are consecutive entries.
func (e *env) produceChunkedInOrder(t testing.TB, topic string, n int) {
	t.Helper()
	prod, err := e.client.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true,
		EnableChunking: true, ChunkMaxMessageSize: chunkSize})
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	for i := range n {
		if _, err := prod.Send(context.Background(), &pulsar.ProducerMessage{Payload: chunkPayload(i)}); err != nil {
			t.Fatal(err)
		}
	}
}
