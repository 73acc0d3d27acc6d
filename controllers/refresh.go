package controllers

import (
	"time"

	"k8s.io/apimachinery/pkg/types"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// An agent applies the rules it holds to a consumer that subscribes after the last push (a new
// topic, a re-subscribe), but the controller learns of that consumer only from the answer to a
// push, and a pod whose answer showed it done is not pushed again within the resync period
// (4.9). So the flows whose counts matter most are asked again sooner: a halted flow (how many
// consumers are paused is what it reports) and a flow whose pods showed no consumer at all
// (NoMatchingConsumers until one subscribes). They are reconciled every refresh period and
// their pods' settled answers are reused only that long. The period grows with the flow's pods
// so that a refresh costs a flow at most refreshPodsPerSecond pushes a second, and with the
// pods of every flow refreshed so that all of them together cost at most the controller's
// budget (--refresh-pushes-per-second): a fleet paused for an incident would otherwise be
// pushed to continuously, all of it every 10 s, while nothing changes.

// statusRefresh is how often such a flow asks its agents again, at most.
const statusRefresh = 10 * time.Second

// refreshPodsPerSecond bounds the pushes a refresh costs one flow.
const refreshPodsPerSecond = 100

// DefaultRefreshPushesPerSecond bounds the refresh pushes of all flows together.
const DefaultRefreshPushesPerSecond = 200

// refreshPeriod is how often a flow of pods pods is refreshed when the flows refreshed hold
// total pods (this one's included) and budget pushes a second are shared among them: each flow
// gets the same period, so that the pushes, total per period, stay within the budget.
func refreshPeriod(pods, total, budget int) time.Duration {
	return max(statusRefresh, time.Duration(pods)*time.Second/refreshPodsPerSecond,
		time.Duration(total)*time.Second/time.Duration(max(budget, 1)))
}

// setRefreshed records that the flow refreshes pods pods (0: it does not) and returns the sum
// over every flow.
func (m *memory) setRefreshed(flow types.NamespacedName, pods int) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.flowLocked(flow, pods > 0)
	if f != nil {
		m.refreshedPods += pods - f.refreshed
		f.refreshed = pods
	}
	return m.refreshedPods
}

// refreshedSum is the pods of every flow being refreshed.
func (m *memory) refreshedSum() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.refreshedPods
}

func (r *SubscriptionFlowReconciler) refreshBudget() int {
	if r.RefreshPushesPerSecond > 0 {
		return r.RefreshPushesPerSecond
	}
	return DefaultRefreshPushesPerSecond
}

// refreshAfter records whether the flow, whose status was just computed, is refreshed, and
// returns its refresh period (zero when it is not refreshed).
func (r *SubscriptionFlowReconciler) refreshAfter(flow *subflowv1.SubscriptionFlow, pods int) time.Duration {
	if !refreshing(flow) {
		r.memory.setRefreshed(flowKey(flow), 0)
		return 0
	}
	return refreshPeriod(pods, r.memory.setRefreshed(flowKey(flow), pods), r.refreshBudget())
}

// answersFresh is how long a flow reuses its pods' settled answers (memory.take).
func (r *SubscriptionFlowReconciler) answersFresh(state subflowv1.FlowState, pods int) time.Duration {
	if state == subflowv1.StateRunning {
		return r.resync()
	}
	return min(r.resync(), refreshPeriod(pods, max(r.memory.refreshedSum(), pods), r.refreshBudget()))
}

// refreshing reports whether the flow's status, just computed, is refreshed before the resync:
// some agent answered, and the flow is halted or no agent showed a consumer of it. (A new pod
// is a pod event: a flow without pods waits for one.)
func refreshing(flow *subflowv1.SubscriptionFlow) bool {
	st := flow.Status
	return st.Pods.Synced > 0 && (st.EffectiveState != subflowv1.StateRunning || st.Consumers.Total == 0)
}
