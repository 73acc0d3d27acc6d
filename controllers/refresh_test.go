package controllers

import (
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

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
				r.memory.nextRetry(flowKey(flow))
			}
			got := r.requeue(flow, observation{Effective: Effective{State: c.status.EffectiveState}, Outcomes: pods(c.pods), Now: time.Now()})
			if got.RequeueAfter != c.want {
				t.Fatalf("requeue after %s, want %s", got.RequeueAfter, c.want)
			}
		})
	}
}

// The refresh period shares the controller's budget among the flows refreshed: each gets the
// same period, 10 s at least and one second per 100 of its own pods, so that all of them
// together push at most the budget a second.
func TestRefreshPeriodSharesTheBudget(t *testing.T) {
	for _, c := range []struct {
		name                string
		pods, total, budget int
		want                time.Duration
	}{
		{"one small flow", 10, 10, 200, statusRefresh},
		{"2000 pods fit the budget in 10 s", 10, 2000, 200, statusRefresh},
		{"one pod more stretches every flow", 10, 2001, 200, 10005 * time.Millisecond},
		{"1000 paused flows of 10 pods", 10, 10000, 200, 50 * time.Second},
		{"a 10 000-pod flow alone: its own bound", 10000, 10000, 200, 100 * time.Second},
		{"a larger budget", 10, 10000, 1000, statusRefresh},
		{"no budget given", 10, 10, 0, statusRefresh},
	} {
		if got := refreshPeriod(c.pods, c.total, c.budget); got != c.want {
			t.Errorf("%s: %d pods of %d, budget %d/s: period %s, want %s", c.name, c.pods, c.total, c.budget, got, c.want)
		}
	}
	// Any fleet: the flows' refresh pushes a second add up to at most the budget.
	fleet := []int{1, 3, 10, 10, 50, 99, 100, 250, 1000, 4000, 10000}
	for _, budget := range []int{1, 50, 200, 5000} {
		total := 0
		for _, pods := range fleet {
			total += pods
		}
		rate := 0.0
		for _, pods := range fleet {
			rate += float64(pods) / refreshPeriod(pods, total, budget).Seconds()
		}
		if rate > float64(budget)+1e-9 {
			t.Errorf("budget %d/s: the flows refresh %.1f pods a second", budget, rate)
		}
	}
}

// The reconciler learns the fleet from the flows it refreshes: 1000 paused flows of 10 pods
// each come back every 50 s (200 pushes a second together, not 1000), and as they resume or
// go the others come back sooner again.
func TestRequeueSharesTheRefreshBudgetAmongFlows(t *testing.T) {
	r := &SubscriptionFlowReconciler{Resync: time.Hour}
	ready := []metav1.Condition{{Type: subflowv1.ConditionReady, Status: metav1.ConditionTrue}}
	flowStatus := func(state subflowv1.FlowState) subflowv1.SubscriptionFlowStatus {
		return subflowv1.SubscriptionFlowStatus{EffectiveState: state, Conditions: ready, Pods: subflowv1.PodCounts{Matched: 10, Synced: 10},
			Consumers: subflowv1.ConsumerCounts{Total: 10}}
	}
	requeue := func(i int, state subflowv1.FlowState) time.Duration {
		flow := &subflowv1.SubscriptionFlow{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprint("flow-", i)}, Status: flowStatus(state)}
		return r.requeue(flow, observation{Effective: Effective{State: state}, Outcomes: make([]podOutcome, 10), Now: time.Now()}).RequeueAfter
	}
	for i := range 1000 {
		requeue(i, subflowv1.StatePaused)
	}
	if got := requeue(0, subflowv1.StatePaused); got != 50*time.Second {
		t.Errorf("1000 paused flows of 10 pods: refreshed every %s, want 50s", got)
	}
	if got := r.answersFresh(subflowv1.StatePaused, 10); got != 50*time.Second {
		t.Errorf("their answers are reused for %s, want the refresh period, 50s", got)
	}
	for i := range 900 {
		requeue(i, subflowv1.StateRunning)
	}
	if got := requeue(999, subflowv1.StatePaused); got != statusRefresh {
		t.Errorf("100 paused flows left: refreshed every %s, want %s", got, statusRefresh)
	}
	r.forget(types.NamespacedName{Namespace: "ns", Name: "flow-999"})
	if got := r.memory.refreshedSum(); got != 99*10 {
		t.Errorf("a forgotten flow's pods still counted: %d pods refreshed, want %d", got, 99*10)
	}
}
