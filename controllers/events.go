package controllers

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// Events announce each transition once: they follow a status write that stored it, comparing
// the new status with the one it replaced (emitEvents), in pairs (Paused / Resumed, BacklogAtRisk
// / BacklogSafe, SeekCompleted / SeekFailed). Released and ReleaseFailed come from the release
// paths, AutoPaused and AutoResumed from the pause conditions.

// emitEvents records paired events for transitions between the old and new status.
func (r *SubscriptionFlowReconciler) emitEvents(old, flow *subflowv1.SubscriptionFlow) {
	wasPaused := meta.IsStatusConditionTrue(old.Status.Conditions, subflowv1.ConditionPaused)
	paused := meta.FindStatusCondition(flow.Status.Conditions, subflowv1.ConditionPaused)
	switch {
	case paused != nil && paused.Status == metav1.ConditionTrue && !wasPaused:
		r.event(flow, corev1.EventTypeNormal, "Paused", "%s", paused.Message)
	case paused != nil && paused.Reason == subflowv1.ReasonRunning && wasPaused:
		r.event(flow, corev1.EventTypeNormal, "Resumed", "Consumers running again at revision %d", flow.Status.Revision)
	}
	ready := meta.FindStatusCondition(flow.Status.Conditions, subflowv1.ConditionReady)
	oldReady := meta.FindStatusCondition(old.Status.Conditions, subflowv1.ConditionReady)
	if ready != nil && ready.Status == metav1.ConditionFalse && (oldReady == nil || oldReady.Reason != ready.Reason) {
		switch ready.Reason {
		case subflowv1.ReasonAgentsUnreachable:
			r.event(flow, corev1.EventTypeWarning, "AgentUnreachable", "%s", ready.Message)
		case subflowv1.ReasonAgentAuthFailed, subflowv1.ReasonAgentTooOld, subflowv1.ReasonTooManyFlows:
			r.event(flow, corev1.EventTypeWarning, ready.Reason, "%s", ready.Message)
		}
	}
	r.emitBacklogEvents(old, flow)
	if note, ok := keySharedStall(ready); ok {
		if _, was := keySharedStall(oldReady); !was {
			r.event(flow, corev1.EventTypeWarning, "KeySharedStalled", "%s", note)
		}
	}
	if seek := flow.Status.Seek; seek != nil && seek.CompletionTime != nil &&
		(old.Status.Seek == nil || old.Status.Seek.ID != seek.ID || old.Status.Seek.CompletionTime == nil) {
		cond := meta.FindStatusCondition(flow.Status.Conditions, subflowv1.ConditionSeekCompleted)
		switch {
		case seek.Message == "":
			r.event(flow, corev1.EventTypeNormal, "SeekCompleted", "Seek %s executed by %s: %s", seek.ID, seek.Executor, describePositions(seek.Positions))
		case cond != nil && cond.Reason == subflowv1.ReasonSeekPartiallyApplied:
			r.event(flow, corev1.EventTypeWarning, cond.Reason, "%s", cond.Message)
		default:
			r.event(flow, corev1.EventTypeWarning, "SeekFailed", "Seek %s failed on %s: %s", seek.ID, seek.Executor, seek.Message)
		}
	}
}

// emitBacklogEvents warns when waiting messages become at risk, and says when they no longer are.
func (r *SubscriptionFlowReconciler) emitBacklogEvents(old, flow *subflowv1.SubscriptionFlow) {
	was := meta.IsStatusConditionTrue(old.Status.Conditions, subflowv1.ConditionBacklogAtRisk)
	now := meta.FindStatusCondition(flow.Status.Conditions, subflowv1.ConditionBacklogAtRisk)
	switch {
	case now != nil && now.Status == metav1.ConditionTrue && !was:
		r.event(flow, corev1.EventTypeWarning, "BacklogAtRisk", "%s", now.Message)
	case now != nil && now.Status == metav1.ConditionFalse && was:
		r.event(flow, corev1.EventTypeNormal, "BacklogSafe", "%s", now.Message)
	}
}

// keySharedStall returns the Key_Shared stall note that ends Ready's message, if there is one.
func keySharedStall(ready *metav1.Condition) (string, bool) {
	if ready == nil {
		return "", false
	}
	i := strings.Index(ready.Message, keySharedStallNote)
	if i < 0 {
		return "", false
	}
	return ready.Message[i:], true
}

// maxEventNote is the API server's limit on an event's note.
const maxEventNote = 1024

// eventActionReconcile is every event's action.
const eventActionReconcile = "Reconcile"

func (r *SubscriptionFlowReconciler) event(flow *subflowv1.SubscriptionFlow, eventType, reason, note string, args ...any) {
	if r.Recorder == nil {
		return
	}
	text := clip(fmt.Sprintf(note, args...), maxEventNote) // on a rune boundary: the API refuses invalid UTF-8
	r.Recorder.Eventf(flow, nil, eventType, reason, eventActionReconcile, "%s", text)
}
