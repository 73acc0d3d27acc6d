package pulsartest

import (
	"context"
	"net/http"
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
)

func terminate(t *testing.T, b *Broker, topic string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, b.AdminURL()+topicPath(topic)+"/terminate", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("terminate %s: %d", topic, resp.StatusCode)
	}
}

// REACHED_END_OF_TOPIC goes to the consumers of a subscription of a terminated topic once its
// backlog is empty: at termination, after the ACK that empties it, or on the first read at the
// end - once: that failed read stays waiting in the cursor.
func TestReachedEndOfTopic(t *testing.T) {
	b := Start(t)
	if err := b.AppendEntries("ending", 2, 1); err != nil {
		t.Fatal(err)
	}
	rc := dialRaw(t, b)
	rc.subscribe("ending", "done", pb.CommandSubscribe_Exclusive, 1)
	rc.subscribe("ending", "pending", pb.CommandSubscribe_Shared, 2)
	rc.flow(1, 10)
	rc.flow(2, 10)
	testkit.Eventually(t, waitFor, "both delivered", func() bool { return len(rc.messagesFor(1)) == 2 && len(rc.messagesFor(2)) == 2 })
	rc.ackWait(1, 11, rc.messagesFor(1)...)
	rc.ackWait(2, 12, rc.messagesFor(2)[0])
	if rc.reachedEnd(1)+rc.reachedEnd(2) != 0 {
		t.Fatal("told the end before the topic was terminated")
	}

	terminate(t, b, "ending")
	testkit.Eventually(t, waitFor, "the acknowledged subscription told", func() bool { return rc.reachedEnd(1) == 1 })
	rc.roundTrip()
	if n := rc.reachedEnd(2); n != 0 {
		t.Fatalf("a subscription with an unacknowledged message was told %d times", n)
	}
	rc.ackWait(2, 13, rc.messagesFor(2)[1])
	testkit.Eventually(t, waitFor, "told after the last ack", func() bool { return rc.reachedEnd(2) == 1 })

	// The first consumer's read was waiting when the topic was terminated: it is cancelled when
	// the consumer leaves, so the next consumer's first read fails at the end and tells it;
	// that read stays waiting, so more permits tell nothing more.
	rc.send(&pb.BaseCommand{Type: pb.BaseCommand_CLOSE_CONSUMER.Enum(), CloseConsumer: &pb.CommandCloseConsumer{ConsumerId: ptr(uint64(1)), RequestId: ptr(uint64(14))}})
	rc.await("closed", func(c *pb.BaseCommand) bool { return c.GetSuccess().GetRequestId() == 14 })
	rc.subscribe("ending", "done", pb.CommandSubscribe_Exclusive, 3)
	rc.roundTrip()
	if n := rc.reachedEnd(3); n != 0 {
		t.Fatalf("a consumer without permits was told %d times", n)
	}
	rc.flow(3, 10)
	testkit.Eventually(t, waitFor, "the new consumer told on its read", func() bool { return rc.reachedEnd(3) == 1 })
	rc.flow(3, 10)
	rc.roundTrip()
	if n := rc.reachedEnd(3); n != 1 {
		t.Fatalf("the new consumer was told %d times, want once", n)
	}
	if n := rc.reachedEnd(1) + rc.reachedEnd(2); n != 2 {
		t.Fatalf("the first consumers were told %d times in all, want 2", n)
	}
}

// pulsar-client-go (through v0.21) does not handle REACHED_END_OF_TOPIC: it closes the
// connection and the consumer reconnects. Connected at termination with everything
// acknowledged, it is told at termination and again by the read after it reconnects; then
// the cursor's failed read keeps it from being told again, and it stays connected.
func TestReachedEndOfTopicGoClient(t *testing.T) {
	b := Start(t)
	rec := wirerec.StartT(t, b.ServiceURL(), wirerec.Options{RewriteLookups: true})
	cl := testkit.NewClient(t, rec.ServiceURL())
	p := testkit.NewProducer(t, cl, pulsar.ProducerOptions{Topic: "ending-go", DisableBatching: true})
	cons := testkit.Subscribe(t, cl, pulsar.ConsumerOptions{Topic: "ending-go", SubscriptionName: "sub", Type: pulsar.Exclusive})
	if _, err := p.Send(context.Background(), &pulsar.ProducerMessage{Payload: []byte("only")}); err != nil {
		t.Fatal(err)
	}
	testkit.ReceiveAndAck(t, cons, 1, waitFor)
	testkit.Eventually(t, waitFor, "ack applied", func() bool { return b.Subscription("ending-go", "sub").Backlog == 0 })
	f := wirerec.Filter{Topic: "ending-go", Subscription: "sub"}
	reached := func() int { return len(rec.Events(wirerec.Filter{}, pb.BaseCommand_REACHED_END_OF_TOPIC)) }

	terminate(t, b, "ending-go")
	testkit.Eventually(t, waitFor, "the third subscription's FLOW", func() bool {
		return len(rec.Consumers(f)) == 3 && len(rec.Flows(wirerec.Filter{Topic: "ending-go", Subscription: "sub", Since: rec.Consumers(f)[2].Session})) > 0
	})
	if err := rec.Barrier(cons); err != nil {
		t.Fatal(err)
	}
	if n := reached(); n != 2 {
		t.Fatalf("REACHED_END_OF_TOPIC sent %d times, want 2", n)
	}
	if n := len(rec.Consumers(f)); n != 3 {
		t.Fatalf("the consumer subscribed %d times, want 3 (it stays connected after the second)", n)
	}
}
