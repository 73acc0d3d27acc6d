package pulsartest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

func TestSeekByMessageID(t *testing.T) {
	b := Start(t, Options{EntriesPerLedger: 4})
	c := newClient(t, b)
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "seek-id", SubscriptionName: "sub", ReceiverQueueSize: 10})
	p := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "seek-id", DisableBatching: true})
	ids := testkit.Produce(t, p, "m", 10)
	testkit.ReceiveAndAck(t, cons, 10, waitFor)
	seekAt := time.Now()
	if err := cons.Seek(ids[3]); err != nil {
		t.Fatalf("seek: %v", err)
	}
	// The seek id itself is delivered again and discarded by the client.
	if got := payloads(testkit.ReceiveAndAck(t, cons, 6, waitFor)); got[0] != "m-4" || got[5] != "m-9" {
		t.Fatalf("after seek got %v", got)
	}
	// The broker disconnected the consumer; it reconnected with a fresh grant.
	if !slices.ContainsFunc(b.Flows("seek-id", "sub"), func(f Flow) bool { return f.Time.After(seekAt) && f.Permits == 10 }) {
		t.Fatalf("no fresh initial grant after seek: %+v", b.Flows("seek-id", "sub"))
	}
	checkInvariant(t, b)
}

func TestSeekByTime(t *testing.T) {
	for _, partitions := range []int{0, 3} {
		t.Run(fmt.Sprintf("partitions=%d", partitions), func(t *testing.T) {
			b := Start(t)
			if partitions > 0 {
				if err := b.CreatePartitionedTopic("seek-time", partitions); err != nil {
					t.Fatal(err)
				}
			}
			c := newClient(t, b)
			cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "seek-time", SubscriptionName: "sub"})
			p := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "seek-time", DisableBatching: true})
			testkit.Produce(t, p, "old", 6)
			// Publish the new messages in a later millisecond than the old ones.
			mark := time.UnixMilli(lastBrokerTime(b, "seek-time") + 1)
			testkit.Eventually(t, waitFor, "the clock passes the mark", func() bool { return time.Now().After(mark) })
			testkit.Produce(t, p, "new", 3)
			testkit.ReceiveAndAck(t, cons, 9, waitFor)

			if err := cons.SeekByTime(mark); err != nil {
				t.Fatalf("seek by time: %v", err)
			}
			got := payloads(testkit.ReceiveAndAck(t, cons, 3, waitFor))
			slices.Sort(got)
			if !slices.Equal(got, []string{"new-0", "new-1", "new-2"}) {
				t.Fatalf("after seek by time got %v", got)
			}
			expectNothing(t, cons, 200*time.Millisecond)
			checkInvariant(t, b)
		})
	}
}

// lastBrokerTime is the latest broker timestamp over the topic's partitions.
func lastBrokerTime(b *Broker, topic string) int64 {
	var last int64
	for _, t := range b.topicsNamed(topic) {
		t.mu.Lock()
		if n := len(t.entries); n > 0 {
			last = max(last, t.entries[n-1].brokerTime)
		}
		t.mu.Unlock()
	}
	return last
}

func TestReaderWithStartMessageID(t *testing.T) {
	b := Start(t)
	c := newClient(t, b)
	p := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "reader", DisableBatching: true})
	ids := testkit.Produce(t, p, "m", 10)

	for _, inclusive := range []bool{false, true} {
		r, err := c.CreateReader(pulsar.ReaderOptions{Topic: "reader", StartMessageID: ids[5], StartMessageIDInclusive: inclusive})
		if err != nil {
			t.Fatal(err)
		}
		want := "m-6"
		if inclusive {
			want = "m-5"
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		m, err := r.Next(ctx)
		cancel()
		if err != nil || string(m.Payload()) != want {
			t.Fatalf("inclusive=%v: first message %v, %v; want %s", inclusive, m, err, want)
		}
		r.Close()
	}

	r, err := c.CreateReader(pulsar.ReaderOptions{Topic: "reader", StartMessageID: pulsar.EarliestMessageID()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	n := 0
	for r.HasNext() {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		_, err := r.Next(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 10 {
		t.Fatalf("reader from earliest read %d messages", n)
	}
}

func TestZeroQueueConsumerAsksOnePermitPerReceive(t *testing.T) {
	b := Start(t)
	c := newClient(t, b)
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "zero", SubscriptionName: "sub", EnableZeroQueueConsumer: true})
	testkit.Produce(t, testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "zero"}), "m", 3)
	testkit.ReceiveAndAck(t, cons, 3, waitFor)
	flows := b.Flows("zero", "sub")
	if len(flows) != 3 {
		t.Fatalf("want 3 flows, got %+v", flows)
	}
	for _, f := range flows {
		if f.Permits != 1 {
			t.Fatalf("zero-queue flow of %d permits", f.Permits)
		}
	}
}

func TestClientFlowSequence(t *testing.T) {
	b := Start(t)
	c := newClient(t, b)
	p := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "flows"})
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "flows", SubscriptionName: "sub", ReceiverQueueSize: 10})
	testkit.Eventually(t, waitFor, "initial grant", func() bool { return len(b.Flows("flows", "sub")) == 1 })
	if f := b.Flows("flows", "sub")[0]; f.Permits != 10 || f.ConsumerName == "" || f.Conn == 0 {
		t.Fatalf("initial flow %+v", f)
	}
	testkit.Produce(t, p, "m", 100)
	testkit.ReceiveAndAck(t, cons, 100, waitFor)
	flows := b.Flows("flows", "sub")
	granted := 0
	for i, f := range flows {
		granted += int(f.Permits)
		if i > 0 && f.Permits != 5 {
			t.Fatalf("refill %d is %d permits, want half the queue: %+v", i, f.Permits, flows)
		}
	}
	if granted < 100 {
		t.Fatalf("granted %d permits for 100 messages", granted)
	}
	checkInvariant(t, b)
}
