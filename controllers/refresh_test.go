package controllers

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// A halted flow, or one whose pods showed no consumer, comes back within the refresh period
// (longer for a big flow) even when its retries have backed off to a minute or it is Ready; a
// running flow with consumers waits for the resync; a flow without pods for a pod event.
func TestRequeueRefreshesTheCountsThatMatter(t *testing.T) {
	ready := []metav1.Condition{{Type: subflowv1.ConditionReady, Status: metav1.ConditionTrue}}
	pods := func(n int) []podOutcome { return make([]podOutcome, n) }
	for _, c := range []struct {
		name   string
		status subflowv1.SubscriptionFlowStatus
		pods   int
		want   time.Duration
	}{
		{"no consumer yet, retries backed off", subflowv1.SubscriptionFlowStatus{EffectiveState: subflowv1.StateRunning,
			Pods: subflowv1.PodCounts{Matched: 2, Synced: 2}}, 2, statusRefresh},
		{"paused and Ready", subflowv1.SubscriptionFlowStatus{EffectiveState: subflowv1.StatePaused, Conditions: ready,
			Pods: subflowv1.PodCounts{Matched: 2, Synced: 2}, Consumers: subflowv1.ConsumerCounts{Total: 2, Paused: 2}}, 2, statusRefresh},
		{"paused, 10 000 pods", subflowv1.SubscriptionFlowStatus{EffectiveState: subflowv1.StatePaused, Conditions: ready,
			Pods: subflowv1.PodCounts{Matched: 10000, Synced: 10000}, Consumers: subflowv1.ConsumerCounts{Total: 10000, Paused: 10000}}, 10000, 100 * time.Second},
		{"running with consumers", subflowv1.SubscriptionFlowStatus{EffectiveState: subflowv1.StateRunning, Conditions: ready,
			Pods: subflowv1.PodCounts{Matched: 2, Synced: 2}, Consumers: subflowv1.ConsumerCounts{Total: 2, Running: 2}}, 2, time.Hour},
		{"paused, no pod answered", subflowv1.SubscriptionFlowStatus{EffectiveState: subflowv1.StatePaused, Conditions: ready}, 0, time.Hour},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &SubscriptionFlowReconciler{Resync: time.Hour}
			flow := &subflowv1.SubscriptionFlow{Status: c.status}
			for range 8 { // backed off to a minute
				r.retries.next(flowKey(flow))
			}
			got := r.requeue(flow, observation{Effective: Effective{State: c.status.EffectiveState}, Outcomes: pods(c.pods), Now: time.Now()})
			if got.RequeueAfter != c.want {
				t.Fatalf("requeue after %s, want %s", got.RequeueAfter, c.want)
			}
		})
	}
}
