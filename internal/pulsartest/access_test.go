package pulsartest

import (
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/internal/testkit"
)

// AbstractDispatcherMultipleConsumers.getNextConsumer (ConsumerPrioritySelector.select; consumerList
// kept sorted by priority level by PersistentDispatcherMultipleConsumers.addConsumer): a Shared
// subscription dispatches to the lowest priority level while a consumer of it has permits, round
// robin within the level. A priority-1 consumer that joined first gets nothing while two
// priority-0 consumers have room.
func TestSharedDispatchHonoursPriorityLevel(t *testing.T) {
	b := Start(t)
	c := newClient(t, b)
	opts := func(name string, level int) pulsar.ConsumerOptions {
		return pulsar.ConsumerOptions{Topic: "prio", SubscriptionName: "sub", Type: pulsar.Shared, Name: name, PriorityLevel: level}
	}
	low := testkit.Subscribe(t, c, opts("low", 1))
	high := []pulsar.Consumer{testkit.Subscribe(t, c, opts("high-a", 0)), testkit.Subscribe(t, c, opts("high-b", 0))}
	testkit.Eventually(t, waitFor, "three consumers granted", func() bool { return len(b.Flows("prio", "sub")) >= 3 })
	testkit.Produce(t, testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "prio", DisableBatching: true}), "m", 10)

	got := map[string]int{}
	drain(t, append(high, low), func(i int, m pulsar.Message) bool {
		got[[]string{"high-a", "high-b", "low"}[i]]++
		return got["high-a"]+got["high-b"]+got["low"] == 10
	})
	if got["low"] != 0 || got["high-a"] == 0 || got["high-b"] == 0 {
		t.Fatalf("received per consumer %v: want all 10 shared by high-a and high-b, none for low", got)
	}
}

// ServerCnx.handleProducer: a PRODUCER with initial_subscription_name creates that subscription,
// durable at InitialPosition.Earliest (PersistentTopic.createSubscription), before the producer
// is added. A dead-letter producer sets it from DLQPolicy.InitialSubscriptionName, so a dead
// letter produced before anyone subscribes to the dead-letter topic waits there for that
// subscription, even for a consumer that starts at Latest.
func TestInitialSubscriptionKeepsDeadLetters(t *testing.T) {
	b := Start(t)
	c := newClient(t, b)
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{
		Topic: "work", SubscriptionName: "sub", Type: pulsar.Shared, NackRedeliveryDelay: 50 * time.Millisecond,
		DLQ: &pulsar.DLQPolicy{MaxDeliveries: 1, DeadLetterTopic: "work-dlq", InitialSubscriptionName: "dead"},
	})
	testkit.Produce(t, testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "work", DisableBatching: true}), "m", 1)
	cons.Nack(testkit.Receive(t, cons, 1, waitFor)[0])
	testkit.Eventually(t, waitFor, "the dead letter stored", func() bool { return b.Subscription("work-dlq", "dead").Backlog == 1 })

	dlq := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "work-dlq", SubscriptionName: "dead", Type: pulsar.Shared})
	if got := payloads(testkit.Receive(t, dlq, 1, waitFor)); got[0] != "m-0" {
		t.Fatalf("dead-letter subscription received %q, want m-0", got)
	}
}
