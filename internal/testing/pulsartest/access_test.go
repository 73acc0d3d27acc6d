package pulsartest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"google.golang.org/protobuf/proto"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
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

// AbstractTopic.incrementTopicEpochIfNeeded and handleProducerRemoved: an Exclusive producer
// keeps the topic to itself - a second Exclusive one is refused with ProducerFenced ("Topic has
// an existing exclusive producer"), a Shared one with ProducerBusy - and a WaitForExclusive one
// is answered PRODUCER_SUCCESS with producer_ready=false and made ready when the exclusive
// producer goes. An ExclusiveWithFencing producer (pulsar-client-go has no such option: sent
// raw) closes the existing producers; the fenced one reconnects, is refused with ProducerFenced
// and gives up, so its sends fail.
func TestProducerAccessModes(t *testing.T) {
	b := Start(t)
	c := newClient(t, b)
	create := func(mode pulsar.ProducerAccessMode) (pulsar.Producer, error) {
		return c.CreateProducer(pulsar.ProducerOptions{Topic: "access", ProducerAccessMode: mode, SendTimeout: 2 * time.Second})
	}
	first, err := create(pulsar.ProducerAccessModeExclusive)
	if err != nil {
		t.Fatal(err)
	}
	for mode, want := range map[pulsar.ProducerAccessMode]string{pulsar.ProducerAccessModeExclusive: "ProducerFenced", pulsar.ProducerAccessModeShared: "ProducerBusy"} {
		if p, err := create(mode); err == nil || !strings.Contains(err.Error(), want) {
			if p != nil {
				p.Close()
			}
			t.Fatalf("producer of mode %d beside an exclusive one: error %v, want %s", mode, err, want)
		}
	}

	created := make(chan pulsar.Producer, 1)
	go func() {
		p, err := create(pulsar.ProducerAccessModeWaitForExclusive)
		if err != nil {
			t.Errorf("WaitForExclusive: %v", err)
		}
		created <- p
	}()
	testkit.Eventually(t, waitFor, "the waiting producer queued", func() bool { return b.waitingProducers("access") == 1 })
	select {
	case <-created:
		t.Fatal("WaitForExclusive producer created while the exclusive one is connected")
	default:
	}
	first.Close()
	var waiter pulsar.Producer
	select {
	case waiter = <-created:
	case <-time.After(waitFor):
		t.Fatal("WaitForExclusive producer not created after the exclusive one closed")
	}
	if waiter == nil {
		t.FailNow()
	}
	testkit.Produce(t, waiter, "w", 1)
	waiter.Close()

	holder, err := create(pulsar.ProducerAccessModeExclusive)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()

	rc := dialRaw(t, b)
	rc.send(&pb.BaseCommand{Type: pb.BaseCommand_PRODUCER.Enum(), Producer: &pb.CommandProducer{
		Topic: proto.String("access"), ProducerId: proto.Uint64(1), RequestId: proto.Uint64(1),
		ProducerAccessMode: pb.ProducerAccessMode_ExclusiveWithFencing.Enum(),
	}})
	if ps := rc.await("the fencing producer's answer", func(c *pb.BaseCommand) bool {
		return c.GetType() == pb.BaseCommand_PRODUCER_SUCCESS || c.GetType() == pb.BaseCommand_ERROR
	}).GetProducerSuccess(); ps == nil || !ps.GetProducerReady() {
		t.Fatalf("fencing producer not admitted: %v", ps)
	}
	testkit.Eventually(t, waitFor, "the fenced producer closed", func() bool {
		_, err := holder.Send(context.Background(), &pulsar.ProducerMessage{Payload: []byte("late")})
		return errors.Is(err, pulsar.ErrProducerFenced) || errors.Is(err, pulsar.ErrProducerClosed)
	})
}

// waitingProducers counts the WaitForExclusive producers queued on a topic.
func (b *Broker) waitingProducers(topic string) int {
	n := 0
	for _, t := range b.topicsNamed(topic) {
		t.mu.Lock()
		n += len(t.waiting)
		t.mu.Unlock()
	}
	return n
}
