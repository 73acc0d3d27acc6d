package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// flowEvents counts the events recorded about a flow, by reason (repeats included).
func flowEvents(t *testing.T, ns, name string) map[string]int {
	t.Helper()
	var list eventsv1.EventList
	if err := k8s.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, e := range list.Items {
		if e.Regarding.Kind != "SubscriptionFlow" || e.Regarding.Name != name {
			continue
		}
		counts[e.Reason]++
		if e.Series != nil {
			counts[e.Reason] += int(e.Series.Count) - 1
		}
	}
	return counts
}

func waitEvent(t *testing.T, ns, name, reason string, want int) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d %s event(s)", want, reason), func() bool { return flowEvents(t, ns, name)[reason] >= want },
		func() string { return fmt.Sprint(flowEvents(t, ns, name)) })
	if got := flowEvents(t, ns, name)[reason]; got != want {
		t.Fatalf("%d %s events, want %d: %v", got, reason, want, flowEvents(t, ns, name))
	}
}

// TestEventsArePairedAndNotRepeated: Paused and Resumed once per transition, not on every
// reconcile; Stalled absent while False.
func TestEventsArePairedAndNotRepeated(t *testing.T) {
	ns := namespace(t, true)
	topic := "events-" + ns
	startPod(t, ns, "worker-0", topic, testToken)
	flow := newFlow(ns, "events", topic, subflowv1.StatePaused)
	create(t, flow)
	got := waitFlow(t, flow, "Paused", func(f *subflowv1.SubscriptionFlow) bool { return isTrue(f, subflowv1.ConditionPaused) })
	waitEvent(t, ns, "events", "Paused", 1)
	if condition(got, subflowv1.ConditionStalled) != nil || condition(got, subflowv1.ConditionReconciling) != nil {
		t.Fatalf("Stalled or Reconciling present on a Ready flow: %+v", got.Status.Conditions)
	}
	for range 3 {
		poke(t, flow)
	}
	waitFlow(t, flow, "reconciled after the pokes", func(f *subflowv1.SubscriptionFlow) bool { return isTrue(f, subflowv1.ConditionReady) })
	patchFlow(t, flow, `{"spec":{"state":"Running"}}`)
	waitEvent(t, ns, "events", "Resumed", 1)
	if n := flowEvents(t, ns, "events")["Paused"]; n != 1 {
		t.Fatalf("%d Paused events after reconciles that changed nothing, want 1", n)
	}
	patchFlow(t, flow, `{"spec":{"state":"Paused"}}`)
	waitEvent(t, ns, "events", "Paused", 2)
	if n := flowEvents(t, ns, "events")["AgentUnreachable"] + flowEvents(t, ns, "events")["SeekFailed"]; n != 0 {
		t.Fatalf("warning events on a healthy flow: %v", flowEvents(t, ns, "events"))
	}
}

// TestStoppedBeatsPausedAcrossFlows: two flows on one consumer, the most restrictive wins and
// the conflict is reported; the override's reason shows in the Paused condition.
func TestStoppedBeatsPausedAcrossFlows(t *testing.T) {
	ns := namespace(t, true)
	topic := "two-" + ns
	p := startPod(t, ns, "worker-0", topic, testToken)
	paused := newFlow(ns, "paused", topic, subflowv1.StatePaused)
	create(t, paused)
	eventually(t, "paused", func() bool { return p.Consumer.State() == protocol.Paused })
	stopped := newFlow(ns, "stopped", topic, subflowv1.StateRunning)
	stopped.Annotations = map[string]string{subflowv1.OverrideStateAnnotation: "Stopped",
		subflowv1.OverrideReasonAnnotation: "INC-42 database failover"}
	create(t, stopped)
	got := waitFlow(t, stopped, "Stopped", func(f *subflowv1.SubscriptionFlow) bool { return isTrue(f, subflowv1.ConditionPaused) })
	if p.Consumer.State() != protocol.Stopped {
		t.Fatalf("consumer %s, want Stopped", p.Consumer.State())
	}
	if c := condition(got, subflowv1.ConditionPaused); !strings.Contains(c.Message, "INC-42 database failover") {
		t.Fatalf("Paused message %q lacks the override reason", c.Message)
	}
	poke(t, paused) // its next reconcile reports what the agent answers
	waitFlow(t, paused, "the conflict reported", func(f *subflowv1.SubscriptionFlow) bool {
		return len(f.Status.Agents) == 1 && strings.Contains(f.Status.Agents[0].Message, "stopped")
	})
	patchFlow(t, stopped, `{"metadata":{"annotations":{"subflow.dev/override-state":null}}}`)
	eventually(t, "back to Paused", func() bool { return p.Consumer.State() == protocol.Paused })
}
