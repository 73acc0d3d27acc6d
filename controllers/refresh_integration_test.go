package controllers_test

import (
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// Consumers that subscribe after the last push - on a new topic for a paused flow that shows
// its consumers settled, and the first one of a flow whose pods had none - are counted within
// seconds, not at the resync (an hour in this suite): the agent pauses them on its own, and the
// status says so.
func TestIntegrationConsumerSubscribingAfterThePushIsCounted(t *testing.T) {
	const within = 15 * time.Second // the refresh period and some
	ns := namespace(t, true)
	topic := "persistent://public/default/counted-" + ns
	pod := startPod(t, ns, "worker-0", topic, testToken)
	paused := newFlow(ns, "paused", "", subflowv1.StatePaused)
	idle := newFlow(ns, "idle", "", subflowv1.StatePaused)
	idle.Spec.Subscription = "later"
	create(t, paused)
	create(t, idle)
	waitFlow(t, paused, "Ready and Paused with one consumer", func(f *subflowv1.SubscriptionFlow) bool {
		return current(f) && isTrue(f, subflowv1.ConditionReady) && isTrue(f, subflowv1.ConditionPaused) && f.Status.Consumers.Total == 1
	})
	waitFlow(t, idle, "NoMatchingConsumers", func(f *subflowv1.SubscriptionFlow) bool {
		c := condition(f, subflowv1.ConditionReady)
		return current(f) && c != nil && c.Reason == subflowv1.ReasonNoMatchingConsumers
	})

	client, err := pulsar.NewClient(pulsar.ClientOptions{URL: broker.ServiceURL(), Logger: nopLogger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	start := time.Now()
	for _, opts := range []pulsar.ConsumerOptions{
		{Topic: topic + "-new", SubscriptionName: "ingest", Type: pulsar.Shared, Name: "worker-0-new"},
		{Topic: topic, SubscriptionName: "later", Type: pulsar.Shared, Name: "worker-0-later"},
	} {
		c, err := pod.Agent.Subscribe(client, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		eventually(t, opts.Name+" paused by its agent", func() bool { return c.State() == protocol.Paused })
	}
	waitFlowWithin(t, paused, within, "both consumers counted, paused", func(f *subflowv1.SubscriptionFlow) bool {
		return f.Status.Consumers.Total == 2 && f.Status.Consumers.Halted == "2/2" && isTrue(f, subflowv1.ConditionPaused)
	})
	waitFlowWithin(t, idle, within, "its first consumer counted, paused", func(f *subflowv1.SubscriptionFlow) bool {
		return f.Status.Consumers.Total == 1 && isTrue(f, subflowv1.ConditionReady) && isTrue(f, subflowv1.ConditionPaused)
	})
	t.Logf("both flows counted the new consumers %s after they subscribed", time.Since(start).Round(time.Millisecond))
}
