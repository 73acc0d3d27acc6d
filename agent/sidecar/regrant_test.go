package sidecar

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/protocol"
	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
)

// The permits a seek cut takes from the client are granted back to the broker at once, not
// when the client next sends something: a client that waits for those messages sends nothing.
func TestCutPermitsReachTheBrokerAtOnce(t *testing.T) {
	w := newWorld(t)
	topic := uniqueTopic(t)
	ids := produceBatch(t, newClient(t, w.brokerTU), topic, 10)

	c := dialRaw(t, w.url, true)
	c.subscribe(topic, "raw", 1)
	cons := consumerNamed(t, w.sidecar, "s", "raw")
	target := fmt.Sprintf("%d:%d:-1:5", ids[5].LedgerID(), ids[5].EntryID())
	if err := cons.FilterSeekTargets([]protocol.SeekPosition{{Partition: -1, MessageID: target}}); err != nil {
		t.Fatal(err)
	}
	c.send(flowCommand(1, 100))
	msg, _ := c.await(pb.BaseCommand_MESSAGE)
	if id := msg.GetMessage().GetMessageId(); id.GetEntryId() != uint64(ids[5].EntryID()) {
		t.Fatalf("got entry %d, want the cut entry %d", id.GetEntryId(), ids[5].EntryID())
	}
	eventually(t, "the 5 permits of the cut messages to reach the broker", func() bool {
		for _, f := range w.rec.Flows(wirerec.Filter{Topic: topic}) {
			if f.Permits == 5 {
				return true
			}
		}
		return false
	})
	if got := cons.Counts().Delivered; got != 5 {
		t.Errorf("delivered %d messages, want the 5 from the target on", got)
	}
}

// produceBatch sends n messages in one batch entry and returns their ids.
func produceBatch(t *testing.T, client pulsar.Client, topic string, n int) []pulsar.MessageID {
	t.Helper()
	// The n-th message closes the batch; no timer does before.
	p, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic, BatchingMaxMessages: uint(n), BatchingMaxPublishDelay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ids := make([]pulsar.MessageID, n)
	errs := make(chan error, n)
	for i := range n {
		p.SendAsync(context.Background(), &pulsar.ProducerMessage{Payload: fmt.Appendf(nil, "m-%d", i)},
			func(id pulsar.MessageID, _ *pulsar.ProducerMessage, err error) { ids[i] = id; errs <- err })
	}
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if ids[0].EntryID() != ids[n-1].EntryID() || ids[n-1].BatchIdx() != int32(n-1) {
		t.Fatalf("the messages went to several entries: %v .. %v", ids[0], ids[n-1])
	}
	return ids
}
