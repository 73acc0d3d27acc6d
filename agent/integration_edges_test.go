package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/protocol"
	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
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
		poll.Eventually(t, "message "+strconv.Itoa(i), func() bool { return col.count() == i+1 })
	}
	poll.Eventually(t, "at most one permit outstanding", func() bool {
		live := e.liveSessions(topic, "sub")
		return len(live) == 1 && live[0].outstanding() <= 1
	})

	c.Pause()
	for i := cycles; i < cycles+3; i++ {
		send(i)
	}
	other := uniqueTopic(t) + "-other"
	raw := e.subscribeRaw(t, pulsar.ConsumerOptions{Topic: other, SubscriptionName: "sub"})
	e.produce(t, other, 0, 1, 1)
	testkit.ReceiveAndAck(t, raw, 1, receiveLimit)
	poll.Eventually(t, "the granted permit's message held", func() bool { return c.Status().HeldMessages == 1 })
	e.barrier(t, c)
	live := e.liveSessions(topic, "sub")
	if len(live) != 1 || live[0].outstanding() != 0 || e.delivered(topic, "sub", 0) != cycles+1 {
		t.Fatalf("while paused: sessions %+v, %d dispatched; want 0 permits outstanding and %d dispatched", live, e.delivered(topic, "sub", 0), cycles+1)
	}
	if n := col.count(); n != cycles {
		t.Fatalf("%d messages reached the application while paused", n-cycles)
	}
	c.Resume()
	poll.Eventually(t, "every message after resume", func() bool { return col.count() == cycles+3 })
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
	dlqReader := e.subscribeRaw(t, pulsar.ConsumerOptions{Topic: dlq, SubscriptionName: "dlq"})
	const n = 30
	c := e.subscribe(t, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Type: pulsar.Shared,
		NackRedeliveryDelay: 20 * time.Millisecond, DLQ: &pulsar.DLQPolicy{MaxDeliveries: 1, DeadLetterTopic: dlq}})
	e.produce(t, topic, 0, n, 1)
	var got []pulsar.Message
	for range n {
		got = append(got, receiveOne(t, c))
	}
	c.Pause()
	atPause := e.mark()
	for _, m := range got {
		c.Nack(m)
	}
	waitNackDelays(t, e, 2)
	e.barrier(t, c)
	if d, f := e.delivered(topic, "sub", 0), e.flows(topic, "sub", atPause); d != n || len(f) != 0 {
		t.Fatalf("while paused: %d dispatched (want %d), %d FLOWs after the pause (want 0)", d, n, len(f))
	}
	if r := e.wire.Events(wirerec.Filter{Topic: topic, Subscription: "sub"}, pb.BaseCommand_REDELIVER_UNACKNOWLEDGED_MESSAGES); len(r) != 0 {
		t.Fatalf("redelivery requested while paused: %+v", r)
	}
	if b, d := e.backlog(t, dlq, "dlq"), e.delivered(dlq, "dlq", 0); b != 0 || d != 0 {
		t.Fatalf("dead-lettered while paused: backlog %d, %d dispatched on the dead-letter topic", b, d)
	}
	if d := c.nacks.count(); d != n {
		t.Fatalf("%d deferred nacks, want %d", d, n)
	}

	c.Resume()
	if got := testkit.ReceiveAndAck(t, dlqReader, n, receiveLimit); len(got) != n { // each dead letter once
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
	if err := controlled(c).SetState(context.Background(), protocol.Running, 1); !errors.Is(err, ErrConsumerClosed) {
		t.Fatalf("SetState after Close = %v, want ErrConsumerClosed", err)
	}
	c.Resume()
	if st := c.Status(); st.State != protocol.Stopped || st.Connected || c.State() != protocol.Stopped {
		t.Fatalf("status after Close: %+v", st)
	}
	poll.Eventually(t, "the consumer gone from the broker", func() bool {
		st, ok := e.stats(t, topic, "sub", false)
		return ok && len(st.Consumers) == 0
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
	if err := recvWithin(t, "the blocked Receive to return", errc); !errors.Is(err, ErrConsumerClosed) {
		t.Fatalf("a blocked Receive returned %v, want ErrConsumerClosed", err)
	}
	if err := controlled(c).SetState(context.Background(), protocol.Running, 1); !errors.Is(err, ErrConsumerClosed) {
		t.Fatalf("SetState after Unsubscribe = %v", err)
	}
	if err := c.Run(); !errors.Is(err, ErrConsumerClosed) {
		t.Fatalf("Run after Unsubscribe = %v", err)
	}
	if st, ok := e.stats(t, topic, "sub", false); ok {
		t.Fatalf("the subscription still exists: %+v", st)
	}
	if len(e.agent.consumersNow()) != 0 {
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
			poll.Eventually(t, "messages held at a pause", func() bool {
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
			poll.Eventually(t, "every ack on the broker", func() bool { return e.backlog(t, topic, "sub") == 0 })
			e.barrier(t, c) // a round trip behind anything dispatched
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
	redeliver, sessions := min(e.backlog(t, topic, "sub"), int64(queue)), e.sessionCount(topic, "sub")
	e.dropConnections()
	back := poll.Until(func() bool {
		live := e.liveSessions(topic, "sub")
		return e.sessionCount(topic, "sub") > sessions && len(live) == 1 && live[0].delivered >= redeliver
	})
	if back {
		return
	}
	for _, s := range e.sessions(topic, "sub") {
		t.Logf("session %+v", s)
	}
	ss := e.sessions(topic, "sub")
	for _, ev := range e.wire.Events(wirerec.Filter{Conn: ss[len(ss)-1].Conn}) {
		t.Logf("event %d %s %s consumer %v permits %d msgs %d %s", ev.Seq, ev.Dir, ev.Type, ev.Consumer != nil, ev.Permits, ev.Messages, ev.Error)
	}
	t.Fatalf("timed out after %v waiting for the consumer to reconnect and get the %d unacknowledged messages again", poll.Within, redeliver)
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
	raw := e.subscribeRaw(t, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", ReceiverQueueSize: queue})
	e.produce(t, topic, 0, n, 1)
	// Wait until the client pushed what its channel takes (the application is not reading).
	poll.Eventually(t, "the raw client's channel filled", func() bool { return len(raw.Chan()) >= min(n, channelCapacity) })
	reconnect(t, e, topic, queue)
	got := map[int]int{}
	for _, m := range testkit.ReceiveAndAck(t, raw, n, receiveLimit) {
		got[seqOfMessage(t, m)]++
	}
	for len(got) < n {
		got[seqOfMessage(t, testkit.ReceiveAndAck(t, raw, 1, receiveLimit)[0])]++
	}
	poll.Eventually(t, "every raw ack on the broker", func() bool { return e.backlog(t, topic, "sub") == 0 })
	e.barrier(t, raw)
	return duplicatesIn(got, raw.Chan())
}

// Read sizes of a broker with its default configuration (Java ServiceConfiguration).
const (
	// dispatcherMaxReadBatchSize: one read of a single-active (Exclusive, Failover) dispatcher
	// takes up to min(permits, 100) ENTRIES, whatever each holds
	// (PersistentDispatcherSingleActiveConsumer.calculateToRead); a Key_Shared read is as large
	// and counts a consumer's permits per entry (PersistentStickyKeyDispatcherMultipleConsumers.
	// filterAndGroupEntriesForDispatching: "permits are for entries/batches").
	dispatcherMaxReadBatchSize = 100
	// dispatcherMaxRoundRobinBatchSize: a Shared dispatcher gives a consumer
	// max(min(messages, permits, 20) / average batch size, 1) entries per turn
	// (PersistentDispatcherMultipleConsumers.trySendMessagesToConsumers).
	dispatcherMaxRoundRobinBatchSize = 20
)

// reconnectBound is the most messages one reconnect while paused can bring into the client with
// a receiver queue of `queue` and batch entries of up to `batch` messages. The client grants
// `queue` permits once. The broker reads while the consumer has permits and debits each entry's
// message count only after sending it, so only its last read overshoots, by at most (batch-1)
// messages for each entry that read could take: min(queue, 100) entries for a single-active or
// Key_Shared dispatcher, min(queue, 20) for Shared. Shared divides by the average batch size of
// the read, so with equal batches it overshoots by at most one entry: queue + batch - 1.
func reconnectBound(subType pulsar.SubscriptionType, queue, batch int, equalBatches bool) int {
	if subType != pulsar.Shared {
		return queue + min(queue, dispatcherMaxReadBatchSize)*(batch-1)
	}
	if equalBatches {
		return queue + batch - 1
	}
	return queue + min(queue, dispatcherMaxRoundRobinBatchSize)*(batch-1)
}

// Batching and a reconnect while paused: the client grants its receiver queue once, and the
// broker answers that grant with whole batch entries. Measured on the wire, against a broker
// with the default read sizes: the permits granted after the pause (at most the queue) and the
// messages the broker sent the reconnected consumer (within reconnectBound); none reaches the
// application, and everything arrives after resume.
func TestIntegrationReconnectWhilePausedWithBatches(t *testing.T) {
	cases := []struct {
		subType      pulsar.SubscriptionType
		queue, batch int
	}{
		{pulsar.Exclusive, 10, 10},
		{pulsar.Exclusive, 150, 10}, // more permits than one read's 100 entries
		{pulsar.Failover, 10, 10},
		{pulsar.KeyShared, 10, 10},
		{pulsar.Shared, 10, 10},
		{pulsar.Shared, 10, 3}, // the last entry overshoots
	}
	for _, tc := range cases {
		name := fmt.Sprintf("%s/queue=%d/batch=%d", subTypeName(tc.subType), tc.queue, tc.batch)
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			topic := uniqueTopic(t)
			c := e.subscribe(t, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Type: tc.subType, ReceiverQueueSize: tc.queue})
			col := collect(t, c)
			const first = 20
			e.produce(t, topic, 0, first, 1)
			poll.Eventually(t, "the first messages", func() bool { return col.count() == first })
			poll.Eventually(t, "their acks", func() bool { return e.backlog(t, topic, "sub") == 0 })
			c.Pause()
			atPause := e.mark()
			bound := reconnectBound(tc.subType, tc.queue, tc.batch, true)
			total := first + 2*bound
			total -= (total - first) % tc.batch // whole batches
			e.produce(t, topic, first, total-first, tc.batch)
			reconnect(t, e, topic, tc.queue)
			poll.Eventually(t, "the reconnected grant spent", func() bool { return e.grantSpent(topic, "sub", 1) })
			e.barrier(t, c)
			live := e.liveSessions(topic, "sub")
			permits := e.permits(topic, "sub", atPause)
			t.Logf("%s: after one reconnect while paused: %d permits granted, %d messages sent to the client (bound %d)",
				name, permits, live[0].delivered, bound)
			if permits > int64(tc.queue) || live[0].delivered > int64(bound) {
				t.Fatalf("%d permits (max %d), %d messages (bound %d)", permits, tc.queue, live[0].delivered, bound)
			}
			if n := col.count(); n != first {
				t.Fatalf("%d messages reached the application while paused", n-first)
			}
			c.Resume()
			poll.Eventually(t, "every message after resume", func() bool { return len(col.distinct()) == total })
		})
	}
}

func subTypeName(t pulsar.SubscriptionType) string {
	return [...]string{pulsar.Exclusive: "Exclusive", pulsar.Shared: "Shared", pulsar.Failover: "Failover", pulsar.KeyShared: "KeyShared"}[t]
}

// A nack made before the pause whose delay ends during it is neither redelivered nor
// dead-lettered while paused, and no FLOW or redelivery request goes out; on resume it takes
// effect after what was left of its delay at the pause.
func TestIntegrationNackBeforePauseWaitsForResume(t *testing.T) {
	e := newEnv(t)
	topic := uniqueTopic(t)
	dlq := topic + "-DLQ"
	dlqReader := e.subscribeRaw(t, pulsar.ConsumerOptions{Topic: dlq, SubscriptionName: "dlq"})
	const n, delay = 10, 2 * time.Second
	c := e.subscribe(t, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Type: pulsar.Shared,
		NackRedeliveryDelay: delay, DLQ: &pulsar.DLQPolicy{MaxDeliveries: 1, DeadLetterTopic: dlq}})
	e.produce(t, topic, 0, n, 1)
	var got []pulsar.Message
	for range n {
		got = append(got, receiveOne(t, c))
	}
	firstNack := time.Now()
	for _, m := range got {
		c.Nack(m)
	}
	lastNack := time.Now()
	// Paused part-way through the delay, and kept paused well past its end.
	for time.Since(lastNack) < delay/4 {
		if r := e.wire.Events(wirerec.Filter{Topic: topic, Subscription: "sub"}, pb.BaseCommand_REDELIVER_UNACKNOWLEDGED_MESSAGES); len(r) > 0 {
			t.Fatalf("redelivery requested %v after the nacks, before their delay of %v", r[0].Time.Sub(firstNack), delay)
		}
		time.Sleep(time.Millisecond)
	}
	pauseStart := time.Now()
	c.Pause()
	pauseEnd := time.Now()
	atPause := e.mark()
	watchNoRedelivery(t, e, topic, dlq, atPause, lastNack.Add(delay+delay/2))
	e.barrier(t, c)
	if f := e.flows(topic, "sub", atPause); len(f) != 0 {
		t.Fatalf("%d FLOWs while paused: %+v", len(f), f)
	}
	if d := c.nacks.count(); d != n {
		t.Fatalf("%d nacks kept while paused, want %d", d, n)
	}

	resumeStart := time.Now()
	c.Resume()
	if got := testkit.ReceiveAndAck(t, dlqReader, n, receiveLimit); len(got) != n {
		t.Fatalf("%d dead letters after resume, want %d", len(got), n)
	}
	r := e.wire.Events(wirerec.Filter{Topic: topic, Subscription: "sub"}, pb.BaseCommand_REDELIVER_UNACKNOWLEDGED_MESSAGES)
	if len(r) == 0 {
		t.Fatal("no redelivery request on the wire after resume")
	}
	// What was left at the pause: at least delay-(pauseEnd-firstNack), at most
	// delay-(pauseStart-lastNack), give or take the client tracker's tick.
	after := r[0].Time.Sub(resumeStart)
	lo, hi := delay-pauseEnd.Sub(firstNack)-50*time.Millisecond, delay-pauseStart.Sub(lastNack)+time.Second
	if after < lo || after > hi {
		t.Fatalf("redelivery requested %v after resume, want the remaining delay, between %v and %v", after, lo, hi)
	}
}

// watchNoRedelivery watches a paused consumer until `until` and fails at once when a
// redelivery request, a redelivered message or a dead letter shows on the wire.
func watchNoRedelivery(t *testing.T, e *env, topic, dlq string, since wirerec.Mark, until time.Time) {
	t.Helper()
	for time.Now().Before(until) {
		f := wirerec.Filter{Topic: topic, Subscription: "sub", Since: since}
		if r := e.wire.Events(f, pb.BaseCommand_REDELIVER_UNACKNOWLEDGED_MESSAGES); len(r) > 0 {
			t.Fatalf("redelivery requested while paused: %+v", r[0])
		}
		if d := e.delivered(topic, "sub", since); d != 0 {
			t.Fatalf("%d messages redelivered while paused", d)
		}
		if d := e.delivered(dlq, "dlq", 0); d != 0 {
			t.Fatalf("%d messages dead-lettered while paused", d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
