package wirerec

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/internal/testing/pulsartest"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// The recorder sees the same FLOW commands, in the same order, as the broker
// that handles them, whether the broker advertises the proxy or the proxy
// rewrites lookups.
func TestFlowsMatchTheBrokersRecord(t *testing.T) {
	t.Run("advertised", func(t *testing.T) {
		b, p := startPair(t)
		flowsMatch(t, b, p)
		for _, c := range p.Connections() {
			if c.ProxiedTo != "" {
				t.Fatalf("connection %+v routed through the proxy mechanism: want direct use of the advertised proxy", c)
			}
		}
		for _, e := range p.Events(Filter{}, pb.BaseCommand_LOOKUP_RESPONSE) {
			if e.Rewritten {
				t.Fatalf("lookup answer rewritten: %+v", e)
			}
		}
	})
	t.Run("rewritten", func(t *testing.T) {
		b, p := startRewritingPair(t)
		flowsMatch(t, b, p)
		if !slices.ContainsFunc(p.Connections(), func(c Connection) bool { return c.ProxiedTo == strings.TrimPrefix(b.ServiceURL(), "pulsar://") }) {
			t.Fatalf("no connection routed through the proxy to the broker: %+v", p.Connections())
		}
	})
}

func flowsMatch(t *testing.T, b *pulsartest.Broker, p *Proxy) {
	c := testkit.NewClient(t, p.ServiceURL())
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "flows", SubscriptionName: "sub", Name: "alpha", ReceiverQueueSize: 4})
	prod := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "flows", DisableBatching: true})
	testkit.ProduceAsync(t, prod, "m", 20, nil)
	testkit.ReceiveAndAck(t, cons, 20, waitFor)
	barrier(t, p, cons)

	// Closing freezes both records: the broker has handled every FLOW queued
	// before the close when it answers it, and one queued after it is marked.
	cons.Close()
	brokerFlows := b.Flows("flows", "sub")
	var wireFlows []Event
	for _, f := range p.Flows(Filter{Topic: "flows", Subscription: "sub"}) {
		if !f.AfterClose {
			wireFlows = append(wireFlows, f)
		}
	}
	if len(wireFlows) != len(brokerFlows) {
		t.Fatalf("recorded %d FLOWs, broker handled %d", len(wireFlows), len(brokerFlows))
	}
	if len(brokerFlows) < 3 {
		t.Fatalf("want the initial grant and refills, broker saw %+v", brokerFlows)
	}
	var sum int64
	for i, bf := range brokerFlows {
		wf := wireFlows[i]
		if wf.Permits != bf.Permits || wf.Consumer.ID != bf.ConsumerID || wf.Consumer.Name != bf.ConsumerName || wf.Dir != FromClient {
			t.Fatalf("FLOW %d: recorded %+v (consumer %+v), broker %+v", i, wf, *wf.Consumer, bf)
		}
		sum += int64(bf.Permits)
	}
	var wireSum int64
	for _, f := range wireFlows {
		wireSum += int64(f.Permits)
	}
	if wireSum != sum {
		t.Fatalf("recorded %d permits, broker granted %d", wireSum, sum)
	}
	if got := p.Delivered(Filter{Topic: "persistent://public/default/flows"}); got != 20 {
		t.Fatalf("Delivered = %d, want 20", got)
	}
	subs := p.Consumers(Filter{Subscription: "sub"})
	if len(subs) != 1 || subs[0].Name != "alpha" || subs[0].SubType != "Exclusive" || subs[0].Topic != "persistent://public/default/flows" {
		t.Fatalf("consumers %+v", subs)
	}
}

// Batches arrive intact, broker-entry metadata included: the client computes
// Message.Index() from bytes the proxy forwarded, and the recorder counts
// each entry's messages.
func TestBatchesAndEntryMetadataPassUnchanged(t *testing.T) {
	b, p := startPair(t)
	c := testkit.NewClient(t, p.ServiceURL())
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "batches", SubscriptionName: "sub"})
	prod := testkit.NewProducer(t, c, pulsar.ProducerOptions{
		Topic: "batches", BatchingMaxMessages: 10, BatchingMaxPublishDelay: time.Hour, BatchingMaxSize: 1 << 20,
	})
	testkit.ProduceAsync(t, prod, "m", 30, nil)
	msgs := testkit.ReceiveAndAck(t, cons, 30, waitFor)
	for i, m := range msgs {
		if string(m.Payload()) != fmt.Sprintf("m-%d", i) {
			t.Fatalf("message %d is %q", i, m.Payload())
		}
		if m.Index() == nil || *m.Index() != uint64(i) {
			t.Fatalf("message %d: index %v, want %d", i, m.Index(), i)
		}
	}
	barrier(t, p, cons)
	entries := p.Messages(Filter{Subscription: "sub"})
	if len(entries) != 3 {
		t.Fatalf("want 3 entries of 10, recorded %d: %+v", len(entries), entries)
	}
	for i, e := range entries {
		if e.Messages != 10 || e.EntryIndex == nil || *e.EntryIndex != uint64(10*i+9) || e.Dir != FromBroker {
			t.Fatalf("entry %d recorded as %+v", i, e)
		}
	}
	if got, want := p.Delivered(Filter{Subscription: "sub"}), int(b.Subscription("batches", "sub").Dispatched); got != want || got != 30 {
		t.Fatalf("Delivered = %d, broker dispatched %d", got, want)
	}
}

// A payload much larger than any read buffer crosses the proxy intact.
func TestLargeMessagePassesIntact(t *testing.T) {
	_, p := startPair(t)
	c := testkit.NewClient(t, p.ServiceURL())
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "large", SubscriptionName: "sub"})
	prod := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "large", DisableBatching: true})
	payload := bytes.Repeat([]byte("0123456789abcdef"), 256<<10) // 4 MiB
	if _, err := prod.Send(context.Background(), &pulsar.ProducerMessage{Payload: payload}); err != nil {
		t.Fatal(err)
	}
	m := testkit.ReceiveAndAck(t, cons, 1, waitFor)[0]
	if !bytes.Equal(m.Payload(), payload) {
		t.Fatalf("payload of %d bytes came back as %d bytes, different", len(payload), len(m.Payload()))
	}
	barrier(t, p, cons)
	if entries := p.Messages(Filter{Subscription: "sub"}); len(entries) != 1 || entries[0].Size <= len(payload) {
		t.Fatalf("recorded %+v", entries)
	}
	if sends := p.Events(Filter{}, pb.BaseCommand_SEND); len(sends) != 1 || sends[0].Size <= len(payload) {
		t.Fatalf("recorded SENDs %+v", sends)
	}
}

// SUBSCRIBE, ACK, REDELIVER, SEEK and CLOSE_CONSUMER in both directions are
// recorded against the consumer, and a seek's reconnect is a new
// subscription of the same consumer id on the same connection.
func TestConsumerCommandsRecorded(t *testing.T) {
	_, p := startPair(t)
	c := testkit.NewClient(t, p.ServiceURL())
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{
		Topic: "commands", SubscriptionName: "sub", Name: "beta", Type: pulsar.Shared,
		ReceiverQueueSize: 10, NackRedeliveryDelay: 50 * time.Millisecond,
	})
	prod := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "commands", DisableBatching: true})
	testkit.ProduceAsync(t, prod, "m", 3, nil)

	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	first, err := cons.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cons.Nack(first)
	testkit.Eventually(t, waitFor, "REDELIVER recorded", func() bool {
		return len(p.Events(Filter{ConsumerName: "beta"}, pb.BaseCommand_REDELIVER_UNACKNOWLEDGED_MESSAGES)) > 0
	})
	testkit.ReceiveAndAck(t, cons, 3, waitFor) // the two others and the redelivered one, acked
	testkit.Eventually(t, waitFor, "ACKs recorded with every id they list", func() bool {
		acked := map[MessageID]bool{}
		for _, e := range p.Events(Filter{ConsumerName: "beta"}, pb.BaseCommand_ACK) {
			if len(e.IDs) != e.Messages {
				return false
			}
			for _, id := range e.IDs {
				acked[id] = true
			}
		}
		return len(acked) == 3
	})

	beforeSeek := p.Mark()
	if err := cons.Seek(first.ID()); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, waitFor, "re-subscribed with a fresh grant", func() bool {
		return p.Permits(Filter{ConsumerName: "beta", Since: beforeSeek}) == 10
	})
	seeks := p.Events(Filter{ConsumerName: "beta", Since: beforeSeek}, pb.BaseCommand_SEEK)
	if len(seeks) != 1 || seeks[0].MessageID.Ledger != uint64(first.ID().LedgerID()) || seeks[0].MessageID.Entry != uint64(first.ID().EntryID()) {
		t.Fatalf("SEEK recorded as %+v, want %v", seeks, first.ID())
	}
	closes := p.Events(Filter{ConsumerName: "beta", Since: beforeSeek}, pb.BaseCommand_CLOSE_CONSUMER)
	if len(closes) != 1 || closes[0].Dir != FromBroker {
		t.Fatalf("broker's CLOSE_CONSUMER recorded as %+v", closes)
	}
	subs := p.Consumers(Filter{ConsumerName: "beta"})
	if len(subs) != 2 || subs[0].ConsumerKey != subs[1].ConsumerKey || subs[1].SubType != "Shared" {
		t.Fatalf("want two subscriptions of one consumer key, got %+v", subs)
	}

	cons.Close()
	closes = p.Events(Filter{ConsumerName: "beta"}, pb.BaseCommand_CLOSE_CONSUMER)
	if last := closes[len(closes)-1]; last.Dir != FromClient || last.Consumer.Session != subs[1].Session {
		t.Fatalf("client's CLOSE_CONSUMER recorded as %+v", last)
	}
}

// A connection the broker drops shows up as a closed connection and the
// consumer's return as a new subscription on a new connection, with its
// own initial grant.
func TestBrokerDropIsANewConnection(t *testing.T) {
	b, p := startPair(t)
	c := testkit.NewClient(t, p.ServiceURL())
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "drop", SubscriptionName: "sub", Name: "gamma", ReceiverQueueSize: 7})
	barrier(t, p, cons)
	before := p.Consumers(Filter{ConsumerName: "gamma"})
	mark := p.Mark()

	b.DropConnections()
	testkit.Eventually(t, waitFor, "consumer back on a new connection", func() bool {
		return len(p.Consumers(Filter{ConsumerName: "gamma", Since: mark})) == 1 && p.Permits(Filter{ConsumerName: "gamma", Since: mark}) == 7
	})
	after := p.Consumers(Filter{ConsumerName: "gamma", Since: mark})[0]
	if after.Conn == before[0].Conn || after.ID != before[0].ID {
		t.Fatalf("before %+v, after %+v: want a new connection and the same consumer id", before, after)
	}
	for _, conn := range p.Connections() {
		if conn.ID == before[0].Conn && (conn.Closed.IsZero() || conn.ClosedFrom != FromBroker) {
			t.Fatalf("dropped connection recorded as %+v", conn)
		}
	}
	// The producer is created only now: pulsar-client-go v0.19 races (-race)
	// between a producer's reconnect (grabCnx) and its sends.
	prod := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "drop", DisableBatching: true})
	testkit.ProduceAsync(t, prod, "after", 2, nil)
	testkit.ReceiveAndAck(t, cons, 2, waitFor)
}

// Many clients at once: every consumer's record is its own.
func TestManyConnectionsConcurrently(t *testing.T) {
	b, p := startPair(t)
	const clients, perClient = 8, 40
	var wg sync.WaitGroup
	errs := make(chan error, 2*clients)
	for i := range clients {
		topic := fmt.Sprintf("many-%d", i)
		c := testkit.NewClient(t, p.ServiceURL())
		cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", ReceiverQueueSize: 5})
		prod := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: topic, BatchingMaxMessages: 4})
		wg.Go(func() {
			for j := range perClient {
				prod.SendAsync(context.Background(), &pulsar.ProducerMessage{Payload: fmt.Appendf(nil, "%d", j)},
					func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
						if err != nil {
							errs <- err
						}
					})
			}
			if err := prod.Flush(); err != nil {
				errs <- err
			}
		})
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), waitFor)
			defer cancel()
			for range perClient {
				m, err := cons.Receive(ctx)
				if err != nil {
					errs <- fmt.Errorf("%s: %w", topic, err)
					return
				}
				cons.AckID(m.ID())
			}
			if err := p.Barrier(cons); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i := range clients {
		topic := fmt.Sprintf("many-%d", i)
		if got := p.Delivered(Filter{Topic: topic}); got != perClient {
			t.Errorf("%s: delivered %d, want %d", topic, got, perClient)
		}
		testkit.Eventually(t, waitFor, topic+": recorded permits equal the broker's", func() bool {
			var granted int64
			for _, f := range b.Flows(topic, "sub") {
				granted += int64(f.Permits)
			}
			return p.Permits(Filter{Topic: topic}) == granted
		})
	}
	// Each client has its own connection, and the record keeps them apart.
	seen := map[uint64]string{}
	for i := range clients {
		topic := fmt.Sprintf("many-%d", i)
		subs := p.Consumers(Filter{Topic: topic})
		if len(subs) != 1 || seen[subs[0].Conn] != "" {
			t.Fatalf("%s: consumers %+v, connections already seen %v", topic, subs, seen)
		}
		seen[subs[0].Conn] = topic
	}
}

// Without RewriteLookups, a broker that advertises its own address takes the
// client around the proxy; the recorder says so instead of staying silent.
func TestBypassIsReported(t *testing.T) {
	b := pulsartest.Start(t)
	p, err := Start(b.ServiceURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	c := testkit.NewClient(t, p.ServiceURL())
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "bypass", SubscriptionName: "sub"})
	if err := p.Check(); err == nil || !strings.Contains(err.Error(), "bypasses the recorder") {
		t.Fatalf("Check() = %v, want a bypass report", err)
	}
	if err := p.Barrier(cons); err == nil {
		t.Fatal("barrier passed for a consumer that does not go through the proxy")
	}
	if flows := p.Flows(Filter{}); len(flows) != 0 {
		t.Fatalf("recorded FLOWs of a bypassing consumer: %+v", flows)
	}
}

// A partitioned topic's base name selects every partition's consumer.
func TestPartitionedTopicByBaseName(t *testing.T) {
	b, p := startPair(t)
	if err := b.CreatePartitionedTopic("parts", 3); err != nil {
		t.Fatal(err)
	}
	c := testkit.NewClient(t, p.ServiceURL())
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "parts", SubscriptionName: "sub", ReceiverQueueSize: 6})
	prod := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "parts", DisableBatching: true})
	testkit.ProduceAsync(t, prod, "m", 12, nil)
	testkit.ReceiveAndAck(t, cons, 12, waitFor)
	barrier(t, p, cons)

	subs := p.Consumers(Filter{Topic: "parts"})
	if len(subs) != 3 {
		t.Fatalf("want one consumer per partition, got %+v", subs)
	}
	if got := p.Delivered(Filter{Topic: "parts"}); got != 12 {
		t.Fatalf("delivered %d, want 12", got)
	}
	if got := p.Delivered(Filter{Topic: "persistent://public/default/parts-partition-1"}) + p.Delivered(Filter{Topic: "parts-partition-0"}) + p.Delivered(Filter{Topic: "public/default/parts-partition-2"}); got != 12 {
		t.Fatalf("partitions delivered %d in all, want 12", got)
	}
	if got := p.Delivered(Filter{Topic: "part"}); got != 0 {
		t.Fatalf("a prefix of the name matched %d messages", got)
	}
}

// With Keep, only the named types stay in the record, but commands of a
// subscription are still attributed to it and its SUBSCRIBE is still known.
func TestKeepHoldsOnlyTheNamedTypes(t *testing.T) {
	_, p := startRewritingPairKeeping(t, pb.BaseCommand_FLOW)
	c := testkit.NewClient(t, p.ServiceURL())
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "kept", SubscriptionName: "sub", Name: "kept-1", ReceiverQueueSize: 4})
	prod := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "kept", DisableBatching: true})
	testkit.ProduceAsync(t, prod, "m", 10, nil)
	testkit.ReceiveAndAck(t, cons, 10, waitFor)
	barrier(t, p, cons)
	all := p.Events(Filter{})
	flows := 0
	for _, e := range all {
		if e.Type == pb.BaseCommand_GET_LAST_MESSAGE_ID {
			continue // the barrier's
		}
		flows++
		if e.Type != pb.BaseCommand_FLOW {
			t.Fatalf("kept a %s event: %+v", e.Type, e)
		}
		if e.Consumer == nil || e.Consumer.Name != "kept-1" || e.Consumer.Subscription != "sub" {
			t.Fatalf("FLOW not attributed to its subscription: %+v", e.Consumer)
		}
	}
	if flows == 0 {
		t.Fatal("no FLOW kept")
	}
	if subs := p.Consumers(Filter{Subscription: "sub"}); len(subs) != 1 {
		t.Fatalf("consumers %+v, want the one SUBSCRIBE", subs)
	}
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
}
