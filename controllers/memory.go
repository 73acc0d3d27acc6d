package controllers

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"

	"github.com/subflow-dev/subflow/controllers/pausewhen"
)

// What this process keeps between reconciles is all in memory, below, under one lock. What it
// keeps about a flow is one flowMemory, made when first needed and dropped whole by forget when
// the flow is gone (deleted, or its finalizer removed by hand): a book added as a field of
// flowMemory goes with the flow without anyone having to remember it. What it keeps about a
// pod's agent (suspicions, backoff holds) is shared by every flow selecting the pod and goes
// when the pod is deleted (forgetPod).

// flowMemory is what this process keeps about one flow. Its fields are read and written under
// memory.mu, by the methods of the files named.
type flowMemory struct {
	// holders are the pods this process recorded in status.heldBy (holders.go).
	holders heldPods
	// pushes are the flow's pushes in flight, or ended and not yet reported, by pod (latepush.go).
	pushes map[string]*pendingPush
	// applied holds, by pod, the last answer that showed the pod done, until the flow stops
	// matching the pod (latepush.go).
	applied map[string]appliedPush
	// written is set from the start of a status write until the cache shows it (written.go).
	written *staleVersions
	// refreshed is how many pods the flow refreshes before the resync; 0 when it does not
	// (refresh.go).
	refreshed int
	// failures counts the flow's retries since it was last ready (retry.go).
	failures int
	// conditions are the trackers of the flow's spec.pauseWhen conditions (pausewhen.go).
	conditions flowConditions
	// backlog is what the flow's watching agent last answered of the backlogs its backlog
	// conditions read; nil when it has none (pausewhen.go).
	backlog *pausewhen.BacklogFigures
	// pausedSeries are the labels (state, source) of the flow's subflow_flow_paused series
	// (metrics.go).
	pausedSeries [2]string
}

// memory is what this process keeps between reconciles about flows and pods; what it keeps
// about token Secrets (tokenBook) and condition sources (Conditions' readings) is not any one
// flow's. Its maps are made when first used, so that a reconciler built as a struct literal
// (tests, benchmarks) has one too.
type memory struct {
	mu    sync.Mutex
	flows map[types.NamespacedName]*flowMemory
	// refreshedPods is the sum of every flow's refreshed pods (refresh.go).
	refreshedPods int

	// suspect holds the error of the last push to a pod's agent that got no answer or outlived
	// its reconcile, reported while the next one runs, until any flow's push gets an answer from
	// it or the pod is deleted (latepush.go).
	suspect map[agentAddress]error
	// gates hold back the pushes to pods whose agent does not work, and steps counts each one's
	// failures (podbackoff.go).
	gates map[agentAddress]podGate
	steps workqueue.TypedRateLimiter[agentAddress]
}

// flowLocked returns the flow's memory, made when create is set and there is none; nil when it
// is not and there is none. A late push or status write of a flow forgotten meanwhile asks
// without create, so that it brings nothing back.
func (m *memory) flowLocked(key types.NamespacedName, create bool) *flowMemory {
	f := m.flows[key]
	if f == nil && create {
		if m.flows == nil {
			m.flows = map[types.NamespacedName]*flowMemory{}
		}
		f = &flowMemory{}
		m.flows[key] = f
	}
	return f
}

// forget drops everything kept about a flow that is gone and returns it (nil when nothing was),
// for the metrics series it names. The pushes still in flight end unrecorded; what is kept per
// pod stays, as it is the pods', shared with other flows.
func (m *memory) forget(key types.NamespacedName) *flowMemory {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.flows[key]
	if f != nil {
		m.refreshedPods -= f.refreshed
		delete(m.flows, key)
	}
	return f
}

// forgetPod drops the suspicions and holds of a deleted pod, so that memory does not grow with
// every pod that ever hung or failed. It walks those only: a handful of pods, not the fleet.
func (m *memory) forgetPod(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for address := range m.suspect {
		if address.pod == uid {
			delete(m.suspect, address)
		}
	}
	m.forgetPodGatesLocked(uid)
}

// forget drops everything this process keeps about a flow that is gone: its memory and its
// metrics series.
func (r *SubscriptionFlowReconciler) forget(key types.NamespacedName) {
	gone := r.memory.forget(key)
	forgetFlowMetrics(key.Namespace, key.Name)
	if gone != nil {
		for name := range gone.conditions.trackers {
			forgetConditionMetrics(key.Namespace, key.Name, name)
		}
	}
}
