package pulsartest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"
)

const waitFor = 20 * time.Second

func newClient(t testing.TB, b *Broker) pulsar.Client {
	t.Helper()
	return newClientOf(t, b.ServiceURL())
}

// newClientOf connects a client to a service URL: a broker's or a recorder's.
func newClientOf(t testing.TB, url string) pulsar.Client {
	t.Helper()
	c, err := pulsar.NewClient(pulsar.ClientOptions{
		URL:               url,
		OperationTimeout:  15 * time.Second,
		ConnectionTimeout: 5 * time.Second,
		Logger:            log.DefaultNopLogger(),
	})
	if err != nil {
		t.Fatalf("new client: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

func newProducer(t testing.TB, c pulsar.Client, opts pulsar.ProducerOptions) pulsar.Producer {
	t.Helper()
	p, err := c.CreateProducer(opts)
	if err != nil {
		t.Fatalf("create producer on %s: %v", opts.Topic, err)
	}
	t.Cleanup(p.Close)
	return p
}

func subscribe(t testing.TB, c pulsar.Client, opts pulsar.ConsumerOptions) pulsar.Consumer {
	t.Helper()
	cons, err := c.Subscribe(opts)
	if err != nil {
		t.Fatalf("subscribe %s/%s: %v", opts.Topic, opts.SubscriptionName, err)
	}
	t.Cleanup(cons.Close)
	return cons
}

// produce sends n messages "<prefix>-<i>" synchronously.
func produce(t testing.TB, p pulsar.Producer, prefix string, n int) []pulsar.MessageID {
	t.Helper()
	ids := make([]pulsar.MessageID, 0, n)
	for i := 0; i < n; i++ {
		id, err := p.Send(context.Background(), &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("%s-%d", prefix, i))})
		if err != nil {
			t.Fatalf("send %s-%d: %v", prefix, i, err)
		}
		ids = append(ids, id)
	}
	return ids
}

// produceAsync sends n messages with SendAsync so that batching groups them,
// then flushes and waits for every receipt.
func produceAsync(t testing.TB, p pulsar.Producer, prefix string, n int, key func(int) string) {
	t.Helper()
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		msg := &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("%s-%d", prefix, i))}
		if key != nil {
			msg.Key = key(i)
		}
		p.SendAsync(context.Background(), msg, func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) { errs <- err })
	}
	if err := p.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Fatalf("send: %v", err)
		}
	}
}

// receive takes n messages, acking each unless ack is false.
func receive(t testing.TB, c pulsar.Consumer, n int, ack bool) []pulsar.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	out := make([]pulsar.Message, 0, n)
	for len(out) < n {
		m, err := c.Receive(ctx)
		if err != nil {
			t.Fatalf("received %d of %d: %v", len(out), n, err)
		}
		if ack {
			if err := c.Ack(m); err != nil {
				t.Fatalf("ack: %v", err)
			}
		}
		out = append(out, m)
	}
	return out
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

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
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
