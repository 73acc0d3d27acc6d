package pulsartest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

func TestExclusiveRefusesSecondConsumer(t *testing.T) {
	b := Start(t)
	c := newClient(t, b)
	testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "excl", SubscriptionName: "sub", Type: pulsar.Exclusive})
	second, err := c.Subscribe(pulsar.ConsumerOptions{Topic: "excl", SubscriptionName: "sub", Type: pulsar.Exclusive})
	if err == nil {
		second.Close()
		t.Fatal("second exclusive consumer was accepted")
	}
	if !strings.Contains(err.Error(), "ConsumerBusy") {
		t.Fatalf("want ConsumerBusy, got %v", err)
	}
}

func TestSharedSpreadsMessagesByPermits(t *testing.T) {
	b := Start(t)
	c := newClient(t, b)
	opts := pulsar.ConsumerOptions{Topic: "shared", SubscriptionName: "sub", Type: pulsar.Shared, ReceiverQueueSize: 5}
	first := testkit.Subscribe(t, c, opts)
	second := testkit.Subscribe(t, c, opts)
	testkit.Eventually(t, waitFor, "both consumers granted permits", func() bool { return len(b.Flows("shared", "sub")) >= 2 })
	p := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "shared", DisableBatching: true})
	testkit.Produce(t, p, "m", 40)
	got := map[string]bool{}
	counts := [2]int{}
	drain(t, []pulsar.Consumer{first, second}, func(i int, m pulsar.Message) bool {
		got[string(m.Payload())] = true
		counts[i]++
		return len(got) == 40
	})
	if counts[0] == 0 || counts[1] == 0 {
		t.Fatalf("shared dispatch went to one consumer only: %v", counts)
	}
	checkInvariant(t, b)
}

func TestFailoverDispatchesToOneActiveConsumer(t *testing.T) {
	b := Start(t, Options{ActiveConsumerFailoverDelay: -1})
	c := newClient(t, b)
	opts := pulsar.ConsumerOptions{Topic: "failover", SubscriptionName: "sub", Type: pulsar.Failover}
	byName := map[string]pulsar.Consumer{}
	for _, name := range []string{"a", "b"} {
		opts.Name = name
		byName[name] = testkit.Subscribe(t, c, opts)
	}
	// Which one is active is the broker's choice (a hash ring of the names
	// probed with the topic name), not the join order.
	activeName := activeConsumer(t, b, "failover", "sub")
	standbyName := map[string]string{"a": "b", "b": "a"}[activeName]
	active, standby := byName[activeName], byName[standbyName]
	p := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "failover"})
	testkit.Produce(t, p, "m", 10)
	testkit.ReceiveAndAck(t, active, 10, waitFor)
	expectNothing(t, standby, 200*time.Millisecond)

	// Closing the active consumer hands the subscription to the standby.
	active.Close()
	testkit.Produce(t, p, "n", 5)
	if got := payloads(testkit.ReceiveAndAck(t, standby, 5, waitFor)); got[0] != "n-0" {
		t.Fatalf("standby got %v", got)
	}
	checkInvariant(t, b)
}

// activeConsumer waits until the subscription has an active consumer and
// returns its name.
func activeConsumer(t testing.TB, b *Broker, topic, sub string) string {
	t.Helper()
	var name string
	testkit.Eventually(t, waitFor, "an active consumer", func() bool {
		for _, cs := range b.Subscription(topic, sub).Consumers {
			if cs.Active {
				name = cs.Name
				return true
			}
		}
		return false
	})
	return name
}

func TestKeySharedKeepsAKeyOnOneConsumer(t *testing.T) {
	b := Start(t)
	c := newClient(t, b)
	opts := pulsar.ConsumerOptions{Topic: "keyed", SubscriptionName: "sub", Type: pulsar.KeyShared}
	consumers := []pulsar.Consumer{testkit.Subscribe(t, c, opts), testkit.Subscribe(t, c, opts)}
	testkit.Eventually(t, waitFor, "both consumers granted permits", func() bool { return len(b.Flows("keyed", "sub")) >= 2 })
	p := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "keyed", DisableBatching: true})
	for i := 0; i < 60; i++ {
		if _, err := p.Send(context.Background(), &pulsar.ProducerMessage{Key: fmt.Sprintf("k%d", i%6), Payload: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
	}
	owner := map[string]int{}
	total := 0
	drain(t, consumers, func(i int, m pulsar.Message) bool {
		total++
		if prev, ok := owner[m.Key()]; ok && prev != i {
			t.Fatalf("key %s went to consumers %d and %d", m.Key(), prev, i)
		}
		owner[m.Key()] = i
		return total == 60
	})
	checkInvariant(t, b)
}

func TestPartitionedTopic(t *testing.T) {
	b := Start(t)
	if err := b.CreatePartitionedTopic("parts", 3); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, b)
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "persistent://public/default/parts", SubscriptionName: "sub", Type: pulsar.Shared})
	p := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "parts", DisableBatching: true})
	for i := 0; i < 30; i++ {
		if _, err := p.Send(context.Background(), &pulsar.ProducerMessage{Key: fmt.Sprint(i), Payload: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
	}
	msgs := testkit.ReceiveAndAck(t, cons, 30, waitFor)
	partitions := map[string]bool{}
	for _, m := range msgs {
		partitions[m.Topic()] = true
	}
	if len(partitions) != 3 {
		t.Fatalf("messages came from %d partitions: %v", len(partitions), partitions)
	}
	flowTopics := map[string]bool{}
	for _, f := range b.Flows("parts", "sub") {
		flowTopics[f.Topic] = true
	}
	if len(flowTopics) != 3 {
		t.Fatalf("flows of the base name cover %v", flowTopics)
	}
	if got := len(b.Flows("parts-partition-1", "sub")); got == 0 {
		t.Fatal("no flows recorded for one partition")
	}
	testkit.Eventually(t, waitFor, "aggregated backlog drained", func() bool { return b.Subscription("parts", "sub").Backlog == 0 })
	if st := b.Subscription("parts", "sub"); len(st.Consumers) != 3 || st.Acked != 30 {
		t.Fatalf("aggregated stats %+v", st)
	}
	checkInvariant(t, b)
}

func TestBatchingAndIndexAcrossLedgers(t *testing.T) {
	for _, batching := range []bool{false, true} {
		t.Run(fmt.Sprintf("batching=%v", batching), func(t *testing.T) {
			b := Start(t, Options{EntriesPerLedger: 3})
			c := newClient(t, b)
			cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "idx", SubscriptionName: "sub"})
			p := testkit.NewProducer(t, c, pulsar.ProducerOptions{
				Topic: "idx", DisableBatching: !batching,
				BatchingMaxMessages: 4, BatchingMaxPublishDelay: time.Hour,
			})
			testkit.ProduceAsync(t, p, "m", 20, nil)
			msgs := testkit.ReceiveAndAck(t, cons, 20, waitFor)
			ledgers := map[int64]bool{}
			batched := false
			for i, m := range msgs {
				if string(m.Payload()) != fmt.Sprintf("m-%d", i) {
					t.Fatalf("message %d is %q", i, m.Payload())
				}
				if m.Index() == nil || *m.Index() != uint64(i) {
					t.Fatalf("message %d has index %v", i, m.Index())
				}
				if m.BrokerPublishTime() == nil {
					t.Fatalf("message %d has no broker publish time", i)
				}
				ledgers[m.ID().LedgerID()] = true
				batched = batched || m.ID().BatchSize() > 1
			}
			if len(ledgers) < 2 {
				t.Fatalf("20 messages stayed in %d ledger(s)", len(ledgers))
			}
			if batched != batching {
				t.Fatalf("batched=%v, want %v", batched, batching)
			}
			// A batch entry is acknowledged once all its messages are.
			testkit.Eventually(t, waitFor, "backlog drained", func() bool { return b.Subscription("idx", "sub").Backlog == 0 })
			if st := b.Subscription("idx", "sub"); st.Acked != 20 {
				t.Fatalf("acked %d messages", st.Acked)
			}
		})
	}
}

func TestNoIndexMetadata(t *testing.T) {
	b := Start(t, Options{DisableIndexMetadata: true})
	c := newClient(t, b)
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "noidx", SubscriptionName: "sub"})
	testkit.Produce(t, testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "noidx"}), "m", 2)
	for _, m := range testkit.ReceiveAndAck(t, cons, 2, waitFor) {
		if m.Index() != nil {
			t.Fatalf("index %d without index metadata", *m.Index())
		}
	}
}

func TestUnackedMessagesOfClosedConsumerAreRedelivered(t *testing.T) {
	b := Start(t)
	c := newClient(t, b)
	opts := pulsar.ConsumerOptions{Topic: "redeliver", SubscriptionName: "sub", Type: pulsar.Shared, ReceiverQueueSize: 4}
	first := testkit.Subscribe(t, c, opts)
	p := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "redeliver", DisableBatching: true})
	testkit.Produce(t, p, "m", 3)
	testkit.Receive(t, first, 3, waitFor)
	first.Close()

	second := testkit.Subscribe(t, c, opts)
	msgs := testkit.ReceiveAndAck(t, second, 3, waitFor)
	for _, m := range msgs {
		// Re-queueing a closed consumer's messages is not a redelivery
		// (PersistentDispatcherMultipleConsumers.removeConsumer does not call
		// incrementAndGetRedeliveryCount).
		if m.RedeliveryCount() != 0 {
			t.Fatalf("%s redelivery count %d", m.Payload(), m.RedeliveryCount())
		}
	}
	testkit.Eventually(t, waitFor, "backlog drained", func() bool { return b.Subscription("redeliver", "sub").Backlog == 0 })
	checkInvariant(t, b)
}

func TestNackRedelivers(t *testing.T) {
	b := Start(t)
	c := newClient(t, b)
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{
		Topic: "nack", SubscriptionName: "sub", Type: pulsar.Shared, NackRedeliveryDelay: 50 * time.Millisecond,
	})
	testkit.Produce(t, testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "nack"}), "m", 1)
	m := testkit.Receive(t, cons, 1, waitFor)[0]
	cons.Nack(m)
	again := testkit.ReceiveAndAck(t, cons, 1, waitFor)[0]
	if string(again.Payload()) != "m-0" || again.RedeliveryCount() != 1 {
		t.Fatalf("redelivered %q count %d", again.Payload(), again.RedeliveryCount())
	}
}

func TestDurableCursorSurvivesResubscribe(t *testing.T) {
	b := Start(t)
	c := newClient(t, b)
	opts := pulsar.ConsumerOptions{Topic: "durable", SubscriptionName: "sub"}
	cons := testkit.Subscribe(t, c, opts)
	p := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "durable"})
	ids := testkit.Produce(t, p, "m", 10)
	testkit.ReceiveAndAck(t, cons, 4, waitFor)
	testkit.Eventually(t, waitFor, "acks applied", func() bool { return b.Subscription("durable", "sub").Acked == 4 })
	st := b.Subscription("durable", "sub")
	if len(st.Cursors) != 1 || st.Cursors[0].MarkDeletePosition != fmt.Sprintf("%d:%d", ids[3].LedgerID(), ids[3].EntryID()) {
		t.Fatalf("cursor %+v after acking 4 of %v", st.Cursors, ids)
	}
	cons.Close()
	again := testkit.Subscribe(t, c, opts)
	if got := payloads(testkit.ReceiveAndAck(t, again, 6, waitFor)); !slices.Equal(got[:1], []string{"m-4"}) {
		t.Fatalf("resumed at %v", got)
	}
}

func TestUnsubscribeDropsTheCursor(t *testing.T) {
	b := Start(t)
	c := newClient(t, b)
	p := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "unsub"})
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "unsub", SubscriptionName: "sub"})
	testkit.Produce(t, p, "m", 3)
	if err := cons.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if st := b.Subscription("unsub", "sub"); st.Backlog != 0 || len(st.Cursors) != 0 {
		t.Fatalf("subscription still there: %+v", st)
	}
	// A new subscription starts at the end again (initial position latest).
	again := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "unsub", SubscriptionName: "sub"})
	testkit.Produce(t, p, "n", 1)
	if got := payloads(testkit.ReceiveAndAck(t, again, 1, waitFor)); got[0] != "n-0" {
		t.Fatalf("got %v", got)
	}
}

func TestRegexConsumerFindsTopics(t *testing.T) {
	b := Start(t)
	if err := b.CreatePartitionedTopic("re-parted", 2); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, b)
	p1 := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "re-plain"})
	p2 := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "re-parted"})
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{
		TopicsPattern: "persistent://public/default/re-.*", SubscriptionName: "sub",
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest,
	})
	testkit.Produce(t, p1, "plain", 2)
	testkit.Produce(t, p2, "parted", 2)
	got := payloads(testkit.ReceiveAndAck(t, cons, 4, waitFor))
	slices.Sort(got)
	if !slices.Equal(got, []string{"parted-0", "parted-1", "plain-0", "plain-1"}) {
		t.Fatalf("regex consumer got %v", got)
	}
}

func TestProducerNameIsExclusiveOnATopic(t *testing.T) {
	b := Start(t)
	c := newClient(t, b)
	testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "named", Name: "p"})
	if p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: "named", Name: "p", SendTimeout: time.Second}); err == nil {
		p.Close()
		t.Fatal("a second producer with the same name was accepted")
	}
}
