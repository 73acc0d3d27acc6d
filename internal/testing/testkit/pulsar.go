package testkit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"
)

// NewClient connects a client to a service URL (a broker's or a wire recorder's) with a
// 15-second operation timeout, a 5-second connection timeout and no log, and closes it when
// the test ends.
func NewClient(t testing.TB, url string) pulsar.Client {
	t.Helper()
	return Client(t, pulsar.ClientOptions{
		URL:               url,
		OperationTimeout:  15 * time.Second,
		ConnectionTimeout: 5 * time.Second,
	})
}

// Client connects a client with opts, silent unless opts names a logger, and closes it when
// the test ends.
func Client(t testing.TB, opts pulsar.ClientOptions) pulsar.Client {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = log.DefaultNopLogger()
	}
	c, err := pulsar.NewClient(opts)
	return closedAtEnd(t, c, err, "new client for "+opts.URL)
}

// NewProducer creates a producer and closes it when the test ends.
func NewProducer(t testing.TB, c pulsar.Client, opts pulsar.ProducerOptions) pulsar.Producer {
	t.Helper()
	p, err := c.CreateProducer(opts)
	return closedAtEnd(t, p, err, "create producer on "+opts.Topic)
}

// Subscribe subscribes and closes the consumer when the test ends.
func Subscribe(t testing.TB, c pulsar.Client, opts pulsar.ConsumerOptions) pulsar.Consumer {
	t.Helper()
	cons, err := c.Subscribe(opts)
	return closedAtEnd(t, cons, err, "subscribe "+opts.Topic+"/"+opts.SubscriptionName)
}

// closedAtEnd fails t with what and err when err is set, and otherwise closes v when the test
// ends.
func closedAtEnd[T interface{ Close() }](t testing.TB, v T, err error, what string) T {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	t.Cleanup(v.Close)
	return v
}

// Produce sends n messages "<prefix>-0" to "<prefix>-<n-1>" one at a time, each waiting for its
// receipt, and returns their IDs.
func Produce(t testing.TB, p pulsar.Producer, prefix string, n int) []pulsar.MessageID {
	t.Helper()
	ids := make([]pulsar.MessageID, 0, n)
	for i := range n {
		id, err := p.Send(context.Background(), &pulsar.ProducerMessage{Payload: fmt.Appendf(nil, "%s-%d", prefix, i)})
		if err != nil {
			t.Fatalf("send %s-%d: %v", prefix, i, err)
		}
		ids = append(ids, id)
	}
	return ids
}

// ProduceUnbatched connects a client to url and sends n messages "<prefix>-0" to
// "<prefix>-<n-1>" to topic as Produce does, one entry each, so that dispatch follows the
// messages one by one; the client and its producer close when the test ends.
func ProduceUnbatched(t testing.TB, url, topic, prefix string, n int) []pulsar.MessageID {
	t.Helper()
	c := NewClient(t, url)
	return Produce(t, NewProducer(t, c, pulsar.ProducerOptions{Topic: topic, DisableBatching: true}), prefix, n)
}

// ProduceAsync sends n messages "<prefix>-0" to "<prefix>-<n-1>" with SendAsync, so that a
// batching producer groups them, keyed by key(i) unless key is nil; then it flushes and waits
// for every receipt.
func ProduceAsync(t testing.TB, p pulsar.Producer, prefix string, n int, key func(i int) string) {
	t.Helper()
	errs := make(chan error, n)
	for i := range n {
		msg := &pulsar.ProducerMessage{Payload: fmt.Appendf(nil, "%s-%d", prefix, i)}
		if key != nil {
			msg.Key = key(i)
		}
		p.SendAsync(context.Background(), msg, func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) { errs <- err })
	}
	if err := p.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatalf("send: %v", err)
		}
	}
}

// Receive takes n messages from c without acknowledging them, and fails t unless all n came
// within the given time.
func Receive(t testing.TB, c pulsar.Consumer, n int, within time.Duration) []pulsar.Message {
	t.Helper()
	return receive(t, c, n, within, false)
}

// ReceiveAndAck takes n messages from c and acknowledges each, and fails t unless all n came
// within the given time.
func ReceiveAndAck(t testing.TB, c pulsar.Consumer, n int, within time.Duration) []pulsar.Message {
	t.Helper()
	return receive(t, c, n, within, true)
}

func receive(t testing.TB, c pulsar.Consumer, n int, within time.Duration, ack bool) []pulsar.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	out := make([]pulsar.Message, 0, n)
	for len(out) < n {
		m, err := c.Receive(ctx)
		if err != nil {
			t.Fatalf("received %d of %d messages within %v: %v", len(out), n, within, err)
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

// ReceiveInBackground hands every message c receives to got, acknowledging it first when ack
// is set, from a goroutine that runs until stop is called or the test ends. stop returns once
// the goroutine has ended; calling it again does nothing more.
func ReceiveInBackground(t testing.TB, c pulsar.Consumer, ack bool, got func(pulsar.Message)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := c.Receive(ctx)
			if err != nil {
				return
			}
			if ack {
				_ = c.Ack(m)
			}
			got(m)
		}
	}()
	stop = func() {
		cancel()
		<-done
	}
	t.Cleanup(stop)
	return stop
}
