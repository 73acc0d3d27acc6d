package controllers

import (
	"context"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// Holders are the pods whose agents may hold a flow's rule. The controller records a pod in
// status.heldBy before it first pushes to it, so that whoever reconciles later - this process or
// a restarted one - can release it when it stops matching or the flow goes, whatever the
// selector says then. This process keeps the same set in memory (flowMemory.holders), because
// the informer's copy of the status may lag this process's own writes.

// heldPods are the holders of one flow this process recorded (flowMemory.holders).
type heldPods struct {
	uid  types.UID // a recreated flow starts a new set
	pods map[string]bool
}

func flowKey(flow *subflowv1.SubscriptionFlow) types.NamespacedName {
	return types.NamespacedName{Namespace: flow.Namespace, Name: flow.Name}
}

// holdersOf returns the union of the recorded and remembered holders, sorted.
func (m *memory) holdersOf(flow *subflowv1.SubscriptionFlow) []string {
	set := map[string]bool{}
	for _, pod := range flow.Status.HeldBy {
		set[pod] = true
	}
	m.mu.Lock()
	if f := m.flowLocked(flowKey(flow), false); f != nil && f.holders.uid == flow.UID {
		for pod := range f.holders.pods {
			set[pod] = true
		}
	}
	m.mu.Unlock()
	return sortedKeys(set)
}

func (m *memory) holds(flow *subflowv1.SubscriptionFlow, pod string) bool {
	if slices.Contains(flow.Status.HeldBy, pod) {
		return true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.flowLocked(flowKey(flow), false)
	return f != nil && f.holders.uid == flow.UID && f.holders.pods[pod]
}

// setHolders replaces the remembered holders of flow.
func (m *memory) setHolders(flow *subflowv1.SubscriptionFlow, pods []string) {
	held := heldPods{uid: flow.UID, pods: make(map[string]bool, len(pods))}
	for _, pod := range pods {
		held.pods[pod] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.flowLocked(flowKey(flow), true).holders = held
}

func sortedKeys(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// recordHolders adds the pods about to be pushed to status.heldBy, written before the push.
// It returns the holders after the write, and keeps stored equal to the flow the API server holds.
func (r *SubscriptionFlowReconciler) recordHolders(ctx context.Context, flow, stored *subflowv1.SubscriptionFlow, holders []string, pods []*corev1.Pod) ([]string, error) {
	set := make(map[string]bool, len(holders)+len(pods))
	for _, pod := range holders {
		set[pod] = true
	}
	added := false
	for _, pod := range pods {
		if pushable(pod) && !set[pod.Name] {
			set[pod.Name], added = true, true
		}
	}
	all := sortedKeys(set)
	if !added && slices.Equal(all, flow.Status.HeldBy) {
		return all, nil
	}
	before := flow.DeepCopy()
	flow.Status.HeldBy = all
	// Locked like every status write: a stale copy's list could drop another writer's holders.
	if err := r.Status().Patch(ctx, flow, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return nil, err
	}
	flow.DeepCopyInto(stored)
	r.memory.setHolders(flow, all)
	return all, nil
}

// releaseStale sends DELETE to every holder that no longer matches. It returns the holders
// left (those matched, and those whose release failed: retried on the next reconcile), the
// pods released, and the failures. A pod that is gone, or terminating, holds nothing any more.
func (r *SubscriptionFlowReconciler) releaseStale(ctx context.Context, flow *subflowv1.SubscriptionFlow, holders []string,
	matched []*corev1.Pod, target func(*corev1.Pod) AgentTarget) (kept, released, failed []string, err error) {
	isMatched := make(map[string]bool, len(matched))
	for _, pod := range matched {
		isMatched[pod.Name] = true
	}
	var stale []*corev1.Pod
	for _, name := range holders {
		if isMatched[name] {
			kept = append(kept, name)
			continue
		}
		pod := &corev1.Pod{}
		err := r.Get(ctx, types.NamespacedName{Namespace: flow.Namespace, Name: name}, pod)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return nil, nil, nil, err
		case pushable(pod):
			stale = append(stale, pod)
		}
	}
	failures := map[string]string{}
	for _, f := range r.releaseAll(ctx, stale, target, string(flow.UID)) {
		failures[f.pod] = f.String()
	}
	for _, pod := range stale {
		if text, ok := failures[pod.Name]; ok {
			kept, failed = append(kept, pod.Name), append(failed, text)
		} else {
			released = append(released, pod.Name)
		}
	}
	sort.Strings(kept)
	return kept, released, failed, nil
}
