package agent

import (
	"context"
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// metricsAgent is an agent of the test's env exporting to its own registry.
func metricsAgent(t testing.TB, e *env) (*Agent, *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	return newTestAgent(t, Options{Name: "metrics", AdminURL: e.adminURL, Registerer: reg}), reg
}

const receivedWhilePaused = "subflow_agent_received_while_paused_total"

// subflow_agent_received_while_paused_total counts the messages the client handed to the gate
// while it was closed: a zero-queue consumer's permit granted before the pause brings exactly
// one (held, delivered after resume); messages produced while paused without a permit, and the
// delivery after resume, count nothing.
func TestIntegrationReceivedWhilePausedCountsZeroQueueArrival(t *testing.T) {
	e := newEnv(t)
	a, reg := metricsAgent(t, e)
	topic := uniqueTopic(t)
	c := e.subscribeThrough(t, a, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", EnableZeroQueueConsumer: true})
	// A Receive that gives up leaves its fetch, and the permit it granted, in flight.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := c.Receive(ctx); done <- err }()
	poll.Eventually(t, "the fetch's permit on the wire", func() bool { return e.permits(topic, "sub", 0) == 1 })
	cancel()
	if err := <-done; err == nil {
		t.Fatal("received from an empty topic")
	}
	c.Pause()
	if got := testkit.MetricSum(t, reg, receivedWhilePaused); got != 0 {
		t.Fatalf("%s = %v before any message, want 0", receivedWhilePaused, got)
	}
	e.produce(t, topic, 0, 4, 1)
	poll.Eventually(t, "the permit's message held", func() bool { return c.Status().HeldMessages == 1 })
	e.barrier(t, c)
	if got, st := testkit.MetricSum(t, reg, receivedWhilePaused), c.Status().ReceivedWhilePaused; got != 1 || st != 1 {
		t.Fatalf("%s = %v (status %d), want exactly 1: one permit, one message", receivedWhilePaused, got, st)
	}
	if d := e.delivered(topic, "sub", 0); d != 1 {
		t.Fatalf("%d messages on the wire while paused, want 1", d)
	}
	c.Resume()
	if got := seqOfMessage(t, testkit.ReceiveAndAck(t, c, 4, receiveLimit)[0]); got != 0 {
		t.Fatalf("first message after resume %d, want the held 0", got)
	}
	if got := testkit.MetricSum(t, reg, receivedWhilePaused); got != 1 {
		t.Fatalf("%s = %v after resume, want still 1", receivedWhilePaused, got)
	}
}

// A queued consumer's gate takes nothing from the client while closed: messages buffered
// before the pause and those a reconnect brings into the client while paused stay in the
// client, so the counter stays 0 while the held gauge shows the buffered ones.
func TestIntegrationReceivedWhilePausedStaysZeroForQueuedConsumer(t *testing.T) {
	e := newEnv(t)
	a, reg := metricsAgent(t, e)
	topic := uniqueTopic(t)
	c := e.subscribeThrough(t, a, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", ReceiverQueueSize: queueSize})
	c.Pause()
	e.produce(t, topic, 0, 50, 1)
	poll.Eventually(t, "the first grant spent", func() bool { return e.grantSpent(topic, "sub", 1) })
	sessions := e.sessionCount(topic, "sub")
	e.dropConnections()
	poll.Eventually(t, "the grant after the reconnect spent", func() bool {
		return e.sessionCount(topic, "sub") > sessions && e.grantSpent(topic, "sub", 1)
	})
	e.barrier(t, c)
	if got, st := testkit.MetricSum(t, reg, receivedWhilePaused), c.Status().ReceivedWhilePaused; got != 0 || st != 0 {
		t.Fatalf("%s = %v (status %d), want 0", receivedWhilePaused, got, st)
	}
	c.Resume()
	testkit.ReceiveAndAck(t, c, 50, receiveLimit)
	if got := testkit.MetricSum(t, reg, receivedWhilePaused); got != 0 {
		t.Fatalf("%s = %v after resume, want 0", receivedWhilePaused, got)
	}
}

const seekProbes = "subflow_agent_seek_probes_total"

// subflow_agent_seek_probes_total grows by exactly the admin calls each seek made
// (SeekResult.Probes), with PIP-415 or by binary search, and for a seek that fails.
func TestIntegrationSeekProbesCounterMovesByEachSeeksProbes(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts pulsartest.Options
	}{
		{"pip415", pulsartest.Options{EntriesPerLedger: 16}},
		{"binarySearch", pulsartest.Options{EntriesPerLedger: 16, DisableIndexLookup: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.opts)
			a, reg := metricsAgent(t, e)
			topic := uniqueTopic(t)
			c := e.subscribeThrough(t, a, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub"})
			e.produce(t, topic, 0, 200, 4)
			var total int
			for _, index := range []int64{0, 37, 150, 199, 5000} {
				res, err := c.SeekByIndex(context.Background(), index)
				if err != nil {
					t.Fatal(err)
				}
				if res.Probes < 2 {
					t.Fatalf("seek to %d: %d probes", index, res.Probes)
				}
				total += res.Probes
				if got := testkit.MetricSum(t, reg, seekProbes); got != float64(total) {
					t.Fatalf("after the seek to %d: %s = %v, want %d (the sum of SeekResult.Probes)", index, seekProbes, got, total)
				}
			}
		})
	}
	t.Run("failed seek", func(t *testing.T) {
		e := newEnv(t, pulsartest.Options{DisableIndexMetadata: true})
		a, reg := metricsAgent(t, e)
		topic := uniqueTopic(t)
		c := e.subscribeThrough(t, a, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub"})
		e.produce(t, topic, 0, 10, 1)
		res, err := c.SeekByIndex(context.Background(), 3)
		if err == nil || res == nil || res.Probes == 0 {
			t.Fatalf("seek without index metadata: %+v, %v; want a failure after some probes", res, err)
		}
		if got := testkit.MetricSum(t, reg, seekProbes); got != float64(res.Probes) {
			t.Fatalf("%s = %v, want %d", seekProbes, got, res.Probes)
		}
	})
}
