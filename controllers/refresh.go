package controllers

import (
	"time"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// An agent applies the rules it holds to a consumer that subscribes after the last push (a new
// topic, a re-subscribe), but the controller learns of that consumer only from the answer to a
// push, and a pod whose answer showed it done is not pushed again within the resync period
// (4.9). So the flows whose counts matter most are asked again sooner: a halted flow (how many
// consumers are paused is what it reports) and a flow whose pods showed no consumer at all
// (NoMatchingConsumers until one subscribes). They are reconciled every refresh period and
// their pods' settled answers are reused only that long. The period grows with the flow's pods
// so that a refresh costs a flow at most refreshPodsPerSecond pushes a second.

// statusRefresh is how often such a flow asks its agents again.
const statusRefresh = 10 * time.Second

// refreshPodsPerSecond bounds the pushes a refresh costs one flow.
const refreshPodsPerSecond = 100

// refreshPeriod is how often a flow of pods pods is refreshed.
func refreshPeriod(pods int) time.Duration {
	return max(statusRefresh, time.Duration(pods)*time.Second/refreshPodsPerSecond)
}

// answersFresh is how long a flow reuses its pods' settled answers (pushBook.take).
func (r *SubscriptionFlowReconciler) answersFresh(state subflowv1.FlowState, pods int) time.Duration {
	if state == subflowv1.StateRunning {
		return r.resync()
	}
	return min(r.resync(), refreshPeriod(pods))
}

// refreshing reports whether the flow's status, just computed, is refreshed before the resync:
// some agent answered, and the flow is halted or no agent showed a consumer of it. (A new pod
// is a pod event: a flow without pods waits for one.)
func refreshing(flow *subflowv1.SubscriptionFlow) bool {
	st := flow.Status
	return st.Pods.Synced > 0 && (st.EffectiveState != subflowv1.StateRunning || st.Consumers.Total == 0)
}
