package pulsartest

import (
	"context"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

const waitFor = 20 * time.Second

func newClient(t testing.TB, b *Broker) pulsar.Client {
	t.Helper()
	return testkit.NewClient(t, b.ServiceURL())
}

// expectNothing asserts that no message arrives within a short window.
func expectNothing(t testing.TB, c pulsar.Consumer, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if m, err := c.Receive(ctx); err == nil {
		t.Fatalf("unexpected message %q", m.Payload())
	}
}

func payloads(msgs []pulsar.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = string(m.Payload())
	}
	return out
}

func checkInvariant(t testing.TB, b *Broker) {
	t.Helper()
	if err := b.CheckPermitInvariant(); err != nil {
		t.Fatal(err)
	}
}

// drain receives from several consumers in turn, acking each message, until
// done returns true; it fails the test after waitFor.
func drain(t testing.TB, consumers []pulsar.Consumer, done func(i int, m pulsar.Message) bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for time.Now().Before(deadline) {
		for i, cons := range consumers {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			m, err := cons.Receive(ctx)
			cancel()
			if err != nil {
				continue
			}
			_ = cons.Ack(m)
			if done(i, m) {
				return
			}
		}
	}
	t.Fatal("timed out draining consumers")
}
