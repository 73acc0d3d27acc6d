package pulsartest

import (
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// activeConsumerName names the single active consumer of an Exclusive or
// Failover subscription (PersistentSubscription.getStats), and is absent on
// Shared.
func TestStatsActiveConsumerName(t *testing.T) {
	b := Start(t, Options{ActiveConsumerFailoverDelay: -1})
	c := newClient(t, b)
	testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "act", SubscriptionName: "ex", Name: "only", Type: pulsar.Exclusive})
	testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "act", SubscriptionName: "fo", Name: "a", Type: pulsar.Failover})
	testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "act", SubscriptionName: "fo", Name: "b", Type: pulsar.Failover})
	testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "act", SubscriptionName: "sh", Name: "s", Type: pulsar.Shared})
	if got := subStats(t, b, "act", "ex").ActiveConsumerName; got != "only" {
		t.Errorf("Exclusive activeConsumerName %q", got)
	}
	if got := subStats(t, b, "act", "sh").ActiveConsumerName; got != "" {
		t.Errorf("Shared activeConsumerName %q, want none", got)
	}
	// The Failover one is whichever the broker chose; the stats agree with it.
	full := "persistent://public/default/act"
	b.st.mu.Lock()
	tp := b.st.topics[full]
	b.st.mu.Unlock()
	tp.mu.Lock()
	want := tp.subs["fo"].active.name
	tp.mu.Unlock()
	if got := subStats(t, b, "act", "fo").ActiveConsumerName; got != want || (got != "a" && got != "b") {
		t.Errorf("Failover activeConsumerName %q, broker chose %q", got, want)
	}
}

// earliestMsgPublishTimeInBacklog is the entry timestamp (the broker's, as
// message TTL compares it) of the first unacknowledged entry, and -1 once
// the backlog is empty.
func TestStatsEarliestTimeIsTheBrokerTimestamp(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Now())
	clock.Step(-time.Hour) // the broker's time differs from the producer's
	b := startWithClock(t, clock, Options{})
	c := newClient(t, b)
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "early", SubscriptionName: "sub"})
	if got := subStats(t, b, "early", "sub").EarliestMsgPublishTimeInBacklog; got != -1 {
		t.Fatalf("empty backlog: %d, want -1", got)
	}
	stored := clock.Now().UnixMilli()
	p := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "early", DisableBatching: true})
	testkit.Produce(t, p, "m", 1)
	clock.Step(time.Minute)
	testkit.Produce(t, p, "m", 1)
	if got := subStats(t, b, "early", "sub").EarliestMsgPublishTimeInBacklog; got != stored {
		t.Fatalf("earliest %d, want the first entry's broker timestamp %d", got, stored)
	}
	testkit.ReceiveAndAck(t, cons, 2, waitFor)
	testkit.Eventually(t, waitFor, "the earliest time -1 after every message was acknowledged", func() bool {
		return subStats(t, b, "early", "sub").EarliestMsgPublishTimeInBacklog == -1
	})
}
