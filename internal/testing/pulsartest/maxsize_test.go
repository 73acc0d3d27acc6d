package pulsartest

import (
	"context"
	"errors"
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// maxMessageSize: CONNECTED announces it, pulsar-client-go refuses a larger message itself,
// and the broker's frame decoder takes frames up to maxMessageSize + 10 KiB counting the size
// field: a longer one closes the connection, unanswered.
func TestMaxMessageSize(t *testing.T) {
	const maxSize = 64 << 10
	b := Start(t, Options{MaxMessageSize: maxSize})
	rc := dialRaw(t, b)
	connected := rc.await("CONNECTED", func(c *pb.BaseCommand) bool { return c.GetType() == pb.BaseCommand_CONNECTED })
	if got := connected.GetConnected().GetMaxMessageSize(); got != maxSize {
		t.Fatalf("CONNECTED max_message_size = %d, want %d", got, maxSize)
	}

	p := testkit.NewProducer(t, newClient(t, b), pulsar.ProducerOptions{Topic: "sized", DisableBatching: true})
	if _, err := p.Send(context.Background(), &pulsar.ProducerMessage{Payload: make([]byte, maxSize+1)}); !errors.Is(err, pulsar.ErrMessageTooLarge) {
		t.Errorf("send of %d bytes: %v, want the client's ErrMessageTooLarge", maxSize+1, err)
	}
	if _, err := p.Send(context.Background(), &pulsar.ProducerMessage{Payload: make([]byte, maxSize-1024)}); err != nil {
		t.Errorf("send under the limit: %v", err)
	}

	rc.producer("sized", 1, "raw")
	limit := maxSize + 10*1024 - 4
	rc.sendFrameOfSize(1, 0, "raw", limit)
	testkit.Eventually(t, waitFor, "the longest frame answered", func() bool { return rc.answerTo(1, 0) != "" })
	if got := rc.answerTo(1, 0); got != "receipt" {
		t.Fatalf("a frame of %d bytes: %s, want a receipt", limit, got)
	}
	rc.sendFrameOfSize(1, 1, "raw", limit+1)
	testkit.Eventually(t, waitFor, "the connection closed", rc.closed)
	if got := rc.answerTo(1, 1); got != "" {
		t.Fatalf("a frame one byte too long was answered: %s", got)
	}
	if st := adminStats(t, b, "sized"); st.MsgInCounter != 2 {
		t.Errorf("msgInCounter %d, want 2 (the client's small message and the longest frame)", st.MsgInCounter)
	}
}
