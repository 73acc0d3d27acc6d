package controllers

import (
	"context"

	corev1 "k8s.io/api/core/v1"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// A flow's seek (docs/design.md section 5.2): the executor is kept, or chosen after the first
// round of pushes among the pods that reported a consumer of the flow, and pushed the request
// with execute set; every request carries the flags that tell the agents what became of it.
// status.seek and the SeekCompleted condition are computed with the rest of status
// (subscriptionflow_status.go).

// seekRequest is the flow's seek as every request carries it (nil without spec.seek); execute
// is set for the executor until status records the seek's completion.
func seekRequest(flow *subflowv1.SubscriptionFlow, execute bool) *protocol.SeekRequest {
	seek := flow.Spec.Seek
	if seek == nil {
		return nil
	}
	req := &protocol.SeekRequest{ID: seek.ID, Index: seek.Index, Execute: execute && !seekFinished(flow),
		Succeeded: seekSucceeded(flow), MovedPartitions: seekMovedOnly(flow)}
	for _, p := range seek.Partitions {
		req.Partitions = append(req.Partitions, protocol.PartitionIndex{Partition: p.Partition, Index: p.Index})
	}
	if req.Succeeded || len(req.MovedPartitions) > 0 {
		// Where the cursors moved: the other agents filter what precedes a target in its entry.
		for _, p := range flow.Status.Seek.Positions {
			req.Positions = append(req.Positions, protocol.SeekPosition{Partition: p.Partition, Index: p.Index,
				MessageID: p.MessageID, Cursor: p.Cursor})
		}
	}
	return req
}

func seekFinished(flow *subflowv1.SubscriptionFlow) bool {
	old := flow.Status.Seek
	return flow.Spec.Seek != nil && old != nil && old.ID == flow.Spec.Seek.ID && old.CompletionTime != nil
}

// seekSucceeded tells agents that the current seek moved the cursors, so that they drop what
// they held from before it; after a failure nothing is dropped.
func seekSucceeded(flow *subflowv1.SubscriptionFlow) bool {
	return seekFinished(flow) && flow.Status.Seek.Message == ""
}

// seekMovedOnly lists the partitions a failed seek moved all the same, so that agents drop
// what they held of those from before it; nil when it succeeded (Succeeded says so) or moved
// nothing.
func seekMovedOnly(flow *subflowv1.SubscriptionFlow) []int32 {
	if !seekFinished(flow) || flow.Status.Seek.Message == "" {
		return nil
	}
	var moved []int32
	for _, p := range flow.Status.Seek.Positions {
		moved = append(moved, p.Partition)
	}
	return moved
}

// seekRunning reports whether the executor is still working on the current seek.
func seekRunning(obs observation) bool {
	for _, o := range obs.Outcomes {
		if o.Pod == obs.Executor && o.Status != nil && o.Status.Seek != nil && o.Status.Seek.State == protocol.SeekRunning {
			return true
		}
	}
	return false
}

// keptExecutor returns the executor already chosen for the current seek if its pod is still
// matched and addressable; empty means one must be chosen.
func keptExecutor(flow *subflowv1.SubscriptionFlow, pods []*corev1.Pod) string {
	old := flow.Status.Seek
	if flow.Spec.Seek == nil || old == nil || old.ID != flow.Spec.Seek.ID || old.Executor == "" {
		return ""
	}
	if old.CompletionTime != nil {
		return old.Executor
	}
	for _, pod := range pods {
		if pod.Name == old.Executor && pod.Status.PodIP != "" {
			return old.Executor
		}
	}
	return ""
}

// startSeekIfPending chooses an executor for a pending seek (seekExecutor) and pushes the
// request with execute set to it.
func (r *SubscriptionFlowReconciler) startSeekIfPending(ctx context.Context, flow *subflowv1.SubscriptionFlow,
	pods []*corev1.Pod, target func(*corev1.Pod) AgentTarget, obs *observation) {
	if flow.Spec.Seek == nil || seekFinished(flow) || obs.Executor != "" {
		return
	}
	if i := seekExecutor(obs.Outcomes); i >= 0 {
		obs.Executor = obs.Outcomes[i].Pod
		obs.Outcomes[i] = r.pushOne(ctx, target(pods[i]), desiredRequest(flow, obs.Effective, obs.Revision, true))
	}
}

// seekExecutor picks the pod that executes a seek: the first, by name, that reported a
// consumer of the flow, an agent before a sidecar (the agent's seek is the exact one: it
// parks its consumer and filters inside batch entries, docs/sidecar.md); -1 when none did.
func seekExecutor(outcomes []podOutcome) int {
	sidecar := -1
	for i, o := range outcomes {
		switch {
		case o.Status == nil || len(o.Status.Consumers) == 0:
		case o.Status.Kind != protocol.KindSidecar:
			return i
		case sidecar < 0:
			sidecar = i
		}
	}
	return sidecar
}
