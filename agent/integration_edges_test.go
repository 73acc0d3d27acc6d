package agent

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// A zero-queue consumer paused and resumed 100 times with a Receive waiting keeps at most one
// permit outstanding; paused, it takes the one message that permit brings and holds it, and the
// client's shared connection keeps working for a producer and another consumer.
func TestIntegrationZeroQueuePauseCyclesKeepOnePermit(t *testing.T) {
	e := newEnv(t)
	topic := uniqueTopic(t)
	c := e.subscribe(t, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", EnableZeroQueueConsumer: true})
	col := collect(t, c)
	p, err := e.client.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true, SendTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	send := func(i int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := p.Send(ctx, &pulsar.ProducerMessage{Payload: []byte(strconv.Itoa(i))}); err != nil {
			t.Fatalf("send %d on the consumer's client: %v", i, err)
		}
	}
	const cycles = 100
	for i := range cycles {
		c.Pause()
		c.Resume()
		send(i)
		eventually(t, "message "+strconv.Itoa(i), func() bool { return col.count() == i+1 })
	}
	eventually(t, "at most one permit outstanding", func() bool {
		st := e.broker.Subscription(topic, "sub")
		return len(st.Consumers) == 1 && st.Consumers[0].Permits <= 1
	})

	c.Pause()
	for i := cycles; i < cycles+3; i++ {
		send(i)
	}
	other := uniqueTopic(t) + "-other"
	raw, err := e.client.Subscribe(pulsar.ConsumerOptions{Topic: other, SubscriptionName: "sub"})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	e.produce(t, other, 0, 1, 1)
	receiveN(t, raw, 1)
	eventually(t, "the granted permit's message held", func() bool { return c.Status().HeldMessages == 1 })
	st := e.broker.Subscription(topic, "sub")
	if st.Consumers[0].Permits != 0 || st.Dispatched != cycles+1 {
		t.Fatalf("while paused: %d permits outstanding, %d dispatched; want 0 and %d", st.Consumers[0].Permits, st.Dispatched, cycles+1)
	}
	if n := col.count(); n != cycles {
		t.Fatalf("%d messages reached the application while paused", n-cycles)
	}
	c.Resume()
	eventually(t, "every message after resume", func() bool { return col.count() == cycles+3 })
	col.stop()
	if !slices.IsSorted(col.seqs) || len(col.distinct()) != cycles+3 {
		t.Fatalf("out of order or duplicated: %v", col.seqs)
	}
}

// Nacks made while paused are deferred: nothing is redelivered or dead-lettered and no FLOW
// goes out while paused; after resume they are issued (and, past MaxDeliveries, dead-lettered).
func TestIntegrationNacksWhilePausedDeadLetterNothing(t *testing.T) {
	e := newEnv(t)
	topic := uniqueTopic(t)
	dlq := topic + "-DLQ"
	dlqReader, err := e.client.Subscribe(pulsar.ConsumerOptions{Topic: dlq, SubscriptionName: "dlq"})
	if err != nil {
		t.Fatal(err)
	}
	defer dlqReader.Close()
	const n = 30
	c := e.subscribe(t, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Type: pulsar.Shared,
		NackRedeliveryDelay: 20 * time.Millisecond, DLQ: &pulsar.DLQPolicy{MaxDeliveries: 1, DeadLetterTopic: dlq}})
	e.produce(t, topic, 0, n, 1)
	var got []pulsar.Message
	for range n {
		m, err := c.Receive(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m)
	}
	c.Pause()
	flowsAtPause := len(e.broker.Flows(topic, "sub"))
	for _, m := range got {
		c.Nack(m)
	}
	waitNackDelays(t, e, 2)
	st := e.broker.Subscription(topic, "sub")
	if st.Dispatched != n || len(e.broker.Flows(topic, "sub")) != flowsAtPause {
		t.Fatalf("while paused: %d dispatched (want %d), %d FLOWs after the pause (want 0)",
			st.Dispatched, n, len(e.broker.Flows(topic, "sub"))-flowsAtPause)
	}
	if dl := e.broker.Subscription(dlq, "dlq"); dl.Backlog != 0 || dl.Dispatched != 0 {
		t.Fatalf("dead-lettered while paused: %+v", dl)
	}
	if d := c.DeferredNacks(); d != n {
		t.Fatalf("%d deferred nacks, want %d", d, n)
	}

	c.Resume()
	if got := receiveN(t, dlqReader, n); len(got) != n { // each dead letter once
		t.Fatalf("%d dead letters after resume, want %d", len(got), n)
	}
}

// waitNackDelays waits until a canary consumer on the same client has had a nacked message
// redelivered `times` times, so that a nack made before, with the same or a shorter delay,
// would have been redelivered by now.
func waitNackDelays(t *testing.T, e *env, times int) {
	t.Helper()
	topic := uniqueTopic(t) + "-canary"
	canary, err := e.client.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "canary", NackRedeliveryDelay: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer canary.Close()
	e.produce(t, topic, 0, 1, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for range times + 1 {
		m, err := canary.Receive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		canary.Nack(m)
	}
}

// Close ends the consumer: Run and SetState refuse with ErrConsumerClosed, the state is
// Stopped and not connected.
func TestIntegrationCloseReportsStopped(t *testing.T) {
	e := newEnv(t)
	topic := uniqueTopic(t)
	c := e.subscribe(t, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub"})
	c.Pause()
	c.Close()
	if err := c.Run(); !errors.Is(err, ErrConsumerClosed) {
		t.Fatalf("Run after Close = %v, want ErrConsumerClosed", err)
	}
	if err := c.SetState(context.Background(), protocol.Running, 1); !errors.Is(err, ErrConsumerClosed) {
		t.Fatalf("SetState after Close = %v, want ErrConsumerClosed", err)
	}
	c.Resume()
	if st := c.Status(); st.State != protocol.Stopped || st.Connected || c.State() != protocol.Stopped {
		t.Fatalf("status after Close: %+v", st)
	}
	eventually(t, "the consumer gone from the broker", func() bool {
		return len(e.broker.Subscription(topic, "sub").Consumers) == 0
	})
}

// Unsubscribe while paused deletes the subscription and closes the consumer for good: no later
// Run or controller push re-creates the subscription.
func TestIntegrationUnsubscribeWhilePausedCloses(t *testing.T) {
	e := newEnv(t)
	topic := uniqueTopic(t)
	c := e.subscribe(t, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub"})
	c.Pause()
	errc := make(chan error, 1)
	go func() { _, err := c.Receive(context.Background()); errc <- err }()
	if err := c.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if st := c.Status(); st.State != protocol.Stopped || st.Connected {
		t.Fatalf("status after Unsubscribe: %+v", st)
	}
	if err := <-errc; !errors.Is(err, ErrConsumerClosed) {
		t.Fatalf("a blocked Receive returned %v, want ErrConsumerClosed", err)
	}
	if err := c.SetState(context.Background(), protocol.Running, 1); !errors.Is(err, ErrConsumerClosed) {
		t.Fatalf("SetState after Unsubscribe = %v", err)
	}
	if err := c.Run(); !errors.Is(err, ErrConsumerClosed) {
		t.Fatalf("Run after Unsubscribe = %v", err)
	}
	if cur := e.broker.Subscription(topic, "sub").Cursors; len(cur) != 0 {
		t.Fatalf("the subscription still exists: %+v", cur)
	}
	if len(e.agent.Consumers()) != 0 {
		t.Fatal("the agent still lists the unsubscribed consumer")
	}
}

// A reconnect while paused: the broker sends again every message the gate holds (they are not
// acknowledged). The application still gets each message once, where the raw client, whose
// channel keeps what it buffered across a reconnect, delivers those twice.
func TestIntegrationReconnectWhilePausedDeliversHeldOnce(t *testing.T) {
	// The client itself drops redelivered copies of what precedes its queue when the queue is
	// not empty at the reconnect; with few messages everything sits in the channel and only
	// the gate can tell.
	for _, n := range []int{1, 5, 50} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			const queue = 20
			e := newEnv(t)
			topic := uniqueTopic(t)
			c := e.subscribe(t, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", ReceiverQueueSize: queue})
			ch := c.Chan() // the application does not read yet
			e.produce(t, topic, 0, n, 1)
			eventually(t, "messages held at a pause", func() bool {
				c.Pause()
				if c.Status().HeldMessages >= int64(min(n, channelCapacity)) {
					return true
				}
				c.Resume()
				return false
			})
			held := c.Status().HeldMessages
			reconnect(t, e, topic, queue)
			c.Resume()
			got := map[int]int{}
			for len(got) < n {
				select {
				case cm := <-ch:
					got[seqOfMessage(t, cm.Message)]++
					if err := c.Ack(cm.Message); err != nil {
						t.Fatal(err)
					}
				case <-time.After(15 * time.Second):
					t.Fatalf("only %d of %d messages after resume", len(got), n)
				}
			}
			eventually(t, "every ack on the broker", func() bool { return e.broker.Subscription(topic, "sub").Acked >= int64(n) })
			if _, err := c.GetLastMessageIDs(); err != nil { // a round trip behind anything dispatched
				t.Fatal(err)
			}
			dups := duplicatesIn(got, ch)
			rawDups := rawDuplicatesAfterReconnect(t, e, n, queue)
			t.Logf("%d messages, %d held at pause; duplicates after a reconnect: agent %d, raw client %d", n, held, dups, rawDups)
			if dups != 0 || dups > rawDups {
				t.Fatalf("%d messages delivered twice (raw client: %d): %v", dups, rawDups, got)
			}
		})
	}
}

// reconnect drops every client connection and waits for the subscription's consumer to be
// back with its initial grant spent.
func reconnect(t *testing.T, e *env, topic string, queue int) {
	t.Helper()
	before := e.broker.Subscription(topic, "sub")
	old, redeliver := before.Consumers[0].Conn, min(before.Backlog, int64(queue))
	e.broker.DropConnections()
	eventually(t, "the consumer reconnected and sent the unacknowledged messages again", func() bool {
		st := e.broker.Subscription(topic, "sub")
		return len(st.Consumers) == 1 && st.Consumers[0].Conn != old && st.Consumers[0].Dispatched >= redeliver
	})
}

// duplicatesIn counts repeated deliveries, including any still waiting on ch.
func duplicatesIn(got map[int]int, ch <-chan pulsar.ConsumerMessage) int {
	for {
		select {
		case cm := <-ch:
			n, _ := strconv.Atoi(string(cm.Message.Payload()))
			got[n]++
			continue
		default:
		}
		break
	}
	dups := 0
	for _, k := range got {
		dups += k - 1
	}
	return dups
}

// rawDuplicatesAfterReconnect runs the same scenario with the raw client and its default
// channel: an application that is not reading when the connection drops.
func rawDuplicatesAfterReconnect(t *testing.T, e *env, n, queue int) int {
	t.Helper()
	topic := uniqueTopic(t) + "-raw"
	raw, err := e.client.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", ReceiverQueueSize: queue})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	e.produce(t, topic, 0, n, 1)
	// Wait until the client pushed what its channel takes (the application is not reading).
	eventually(t, "the raw client's channel filled", func() bool { return len(raw.Chan()) >= min(n, channelCapacity) })
	reconnect(t, e, topic, queue)
	got := map[int]int{}
	for _, m := range receiveN(t, raw, n) {
		got[seqOfMessage(t, m)]++
	}
	for len(got) < n {
		got[seqOfMessage(t, receiveN(t, raw, 1)[0])]++
	}
	eventually(t, "every raw ack on the broker", func() bool { return e.broker.Subscription(topic, "sub").Acked >= int64(n) })
	if _, err := raw.GetLastMessageIDs(); err != nil {
		t.Fatal(err)
	}
	return duplicatesIn(got, raw.Chan())
}

// dispatcherMaxReadBatchSize is the Java broker's default: one read of a single-active or
// classic Key_Shared dispatcher takes up to min(permits, 100) ENTRIES, whatever each holds.
const dispatcherMaxReadBatchSize = 100

// reconnectBound is what one reconnect while paused can bring into the client: the client
// re-grants its receiver queue (queue permits); the broker reads up to min(queue, 100) entries
// per read and debits each entry's message count afterwards, so with batches of up to
// `batch` messages the last read can overshoot by (batch-1) messages per entry.
func reconnectBound(queue, batch int) int {
	return queue + min(queue, dispatcherMaxReadBatchSize)*(batch-1)
}

// Batching and a reconnect while paused: the client grants its receiver queue once, and the
// broker may answer that grant with whole batch entries. Measured here: the permits granted
// (at most the queue) and the messages that reached the client (within reconnectBound; a real
// broker can reach the bound, the test broker sends fewer); none reaches the application.
func TestIntegrationReconnectWhilePausedWithBatches(t *testing.T) {
	const queue, batch = 10, 10
	e := newEnv(t)
	topic := uniqueTopic(t)
	c := e.subscribe(t, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", ReceiverQueueSize: queue})
	col := collect(t, c)
	flowsAtPause := pausedAfterQuiescence(t, e, topic, c, col, 20)
	e.produce(t, topic, 20, 300, batch)
	reconnect(t, e, topic, queue)
	eventually(t, "the reconnected grant spent", func() bool {
		st := e.broker.Subscription(topic, "sub")
		return len(st.Consumers) == 1 && st.Consumers[0].Permits <= 0
	})
	if _, err := c.GetLastMessageIDs(); err != nil {
		t.Fatal(err)
	}
	st := e.broker.Subscription(topic, "sub")
	permits := flowPermits(e.broker.Flows(topic, "sub"), flowsAtPause)
	got := st.Consumers[0].Dispatched
	t.Logf("after one reconnect while paused: %d permits granted, %d messages sent to the client (bound %d with batches of %d)",
		permits, got, reconnectBound(queue, batch), batch)
	if permits > queue || got > int64(reconnectBound(queue, batch)) {
		t.Fatalf("%d permits (max %d), %d messages (bound %d)", permits, queue, got, reconnectBound(queue, batch))
	}
	if n := col.count(); n != 20 {
		t.Fatalf("%d messages reached the application while paused", n-20)
	}
	c.Resume()
	eventually(t, "every message after resume", func() bool { return len(col.distinct()) == 320 })
}
