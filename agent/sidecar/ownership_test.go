package sidecar

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/protocol"
	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
)

// collector receives and acknowledges in the background what a consumer gets, until the
// test ends.
type collector struct {
	mu   sync.Mutex
	got  []pulsar.Message
	done chan struct{}
}

func collect(t *testing.T, c pulsar.Consumer) *collector {
	ctx, cancel := context.WithCancel(context.Background())
	col := &collector{done: make(chan struct{})}
	go func() {
		defer close(col.done)
		for {
			m, err := c.Receive(ctx)
			if err != nil {
				return
			}
			_ = c.Ack(m)
			col.mu.Lock()
			col.got = append(col.got, m)
			col.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-col.done })
	return col
}

func (col *collector) values() []string {
	col.mu.Lock()
	defer col.mu.Unlock()
	out := make([]string, len(col.got))
	for i, m := range col.got {
		out[i] = string(m.Payload())
	}
	return out
}

func (col *collector) keys() map[string]bool {
	col.mu.Lock()
	defer col.mu.Unlock()
	out := map[string]bool{}
	for _, m := range col.got {
		out[m.Key()] = true
	}
	return out
}

func produceKeyed(t *testing.T, c pulsar.Client, topic, round string, keys []string) []string {
	t.Helper()
	p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var values []string
	for _, k := range keys {
		v := round + "-" + k
		if _, err := p.Send(context.Background(), &pulsar.ProducerMessage{Key: k, Payload: []byte(v)}); err != nil {
			t.Fatal(err)
		}
		values = append(values, v)
	}
	return values
}

func valuesOfKeys(values []string, keys map[string]bool) []string {
	var out []string
	for _, v := range values {
		_, k, _ := strings.Cut(v, "-")
		if keys[k] {
			out = append(out, v)
		}
	}
	return out
}

// Key_Shared, a pause keeps the paused consumer's hash ranges: its sibling goes on with its own
// keys and gets none of the paused consumer's, and the broker-side consumer is neither closed
// nor subscribed again; resumed, the paused consumer gets its keys.
func TestKeySharedRangesStayWhilePaused(t *testing.T) {
	w := newWorld(t)
	topic := uniqueTopic(t)
	opts := func(name string) pulsar.ConsumerOptions {
		return pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s", Name: name, Type: pulsar.KeyShared, ReceiverQueueSize: 10}
	}
	a := collect(t, subscribe(t, newClient(t, w.url), opts("a")))
	b := collect(t, subscribe(t, newClient(t, w.url), opts("b")))
	var keys []string
	for i := range 24 {
		keys = append(keys, fmt.Sprintf("k%d", i))
	}
	producer := newClient(t, w.url)
	first := produceKeyed(t, producer, topic, "r1", keys)
	eventually(t, "both consumers to take the first round", func() bool {
		return len(missing(first, append(a.values(), b.values()...))) == 0
	})
	aKeys, bKeys := a.keys(), b.keys()
	if len(aKeys) == 0 || len(bKeys) == 0 {
		t.Skipf("the broker gave every key to one consumer (a %d, b %d)", len(aKeys), len(bKeys))
	}

	ca := consumerNamed(t, w.sidecar, "s", "a")
	setState(t, ca, protocol.Paused)
	mark := w.rec.Mark()
	second := produceKeyed(t, producer, topic, "r2", keys)
	eventually(t, "b to take its keys of the second round", func() bool {
		return len(missing(valuesOfKeys(second, bKeys), b.values())) == 0
	})
	if leaked := common(valuesOfKeys(second, aKeys), append(a.values(), b.values()...)); len(leaked) > 0 {
		t.Errorf("messages of the paused consumer's keys were delivered: %v", leaked)
	}
	onWire := wirerec.Filter{Subscription: "s", ConsumerName: "a", Since: mark}
	if n := len(w.rec.Consumers(onWire)) + len(w.rec.Events(onWire, pb.BaseCommand_CLOSE_CONSUMER)); n > 0 {
		t.Errorf("the paused consumer was closed or subscribed again on the broker (%d commands)", n)
	}

	setState(t, ca, protocol.Running)
	eventually(t, "a to take its keys after resume", func() bool {
		return len(missing(valuesOfKeys(second, aKeys), a.values())) == 0
	})
}

// Failover, a pause keeps the active consumer active: what is produced meanwhile is held for
// it, the standby gets nothing and no ACTIVE_CONSUMER_CHANGE moves the subscription.
func TestFailoverActiveStaysWhilePaused(t *testing.T) {
	w := newWorld(t)
	topic := uniqueTopic(t)
	opts := func(name string) pulsar.ConsumerOptions {
		return pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s", Name: name, Type: pulsar.Failover, ReceiverQueueSize: 10}
	}
	cols := map[string]*collector{
		"a": collect(t, subscribe(t, newClient(t, w.url), opts("a"))),
		"b": collect(t, subscribe(t, newClient(t, w.url), opts("b"))),
	}
	producer := newClient(t, w.url)
	first := produceUnbatched(t, producer, topic, "r1", 0, 10)
	eventually(t, "the first round to be consumed", func() bool {
		return len(missing(first, append(cols["a"].values(), cols["b"].values()...))) == 0
	})
	active, standby := "a", "b"
	if len(cols["b"].values()) > len(cols["a"].values()) {
		active, standby = "b", "a"
	}
	standbyBefore := len(cols[standby].values())

	c := consumerNamed(t, w.sidecar, "s", active)
	// The client refills its permits after the application took the first round; a pause
	// before that refill reached the broker would leave it nothing to send under them.
	awaitBrokerCredit(t, w, "s", active)
	setState(t, c, protocol.Paused)
	mark := w.rec.Mark()
	second := produceUnbatched(t, producer, topic, "r2", 0, 10)
	eventually(t, "the broker to send the active consumer what it had permits for", func() bool { return c.Counts().Held > 0 })
	if n := len(cols[standby].values()) - standbyBefore; n > 0 {
		t.Errorf("the standby received %d messages while the active consumer was paused", n)
	}
	if changes := w.rec.Events(wirerec.Filter{Subscription: "s", Since: mark}, pb.BaseCommand_ACTIVE_CONSUMER_CHANGE); len(changes) > 0 {
		t.Errorf("the active consumer changed during the pause: %+v", changes)
	}

	setState(t, c, protocol.Running)
	eventually(t, "the active consumer to take the second round after resume", func() bool {
		return len(missing(second, append(cols[active].values(), cols[standby].values()...))) == 0
	})
}
