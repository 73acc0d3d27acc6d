package webhooks

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// What a wired pod's consumers do before the controller's first push reaches them. A pod that a
// flow selects when it is created starts gated, so that a pod born into a paused flow - a
// rollout, a scale-up, a restarted container - consumes nothing in the moments before that
// push, and keeps the flow's state if the push never comes (the controller down).
const (
	// StartGatedEnv and FallbackStateEnv carry the choice to an agent-mode application; the
	// agent library reads them (agent.New), stricter than its options only.
	StartGatedEnv    = protocol.StartGatedEnv
	FallbackStateEnv = protocol.FallbackStateEnv
)

// start is how a pod's consumers start.
type start struct {
	gated bool
	// fallback is the state after the sync timeout without a push: the most restrictive
	// effective state of the flows that selected the pod at admission.
	fallback protocol.State
}

// startOf reads StartGatedAnnotation ("true" or "false" decide) and otherwise asks the flows of
// the namespace: gated when one selects the pod. A failed read gates too, with Running after the
// timeout: the first push lifts it, as it would have for a selected pod.
func startOf(ctx context.Context, flows client.Reader, pod *corev1.Pod, namespace string) (start, *skip) {
	switch value, ok := pod.Annotations[StartGatedAnnotation]; {
	case value == "false":
		return start{fallback: protocol.Running}, nil
	case value == "true":
		return start{gated: true, fallback: protocol.Running}, nil
	case ok:
		return start{}, skipped(ReasonInvalidStartGated, "annotation %s=%q is not a choice: want true or false", StartGatedAnnotation, value)
	}
	s := start{fallback: protocol.Running}
	if flows == nil {
		return s, nil
	}
	var list subflowv1.SubscriptionFlowList
	if err := flows.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return start{gated: true, fallback: protocol.Running}, nil
	}
	for i := range list.Items {
		f := &list.Items[i]
		if selector, err := f.PodSelector(); err != nil || !selector.Matches(labels.Set(pod.Labels)) {
			continue
		}
		s.gated = true
		s.fallback = protocol.MostRestrictive(s.fallback, protocol.State(effectiveState(f)))
	}
	return s, nil
}

// effectiveState is what the controller last computed for the flow (windows and the override
// included), or its spec before the controller's first status.
func effectiveState(f *subflowv1.SubscriptionFlow) subflowv1.FlowState {
	if f.Status.EffectiveState != "" {
		return f.Status.EffectiveState
	}
	if f.Spec.State != "" {
		return f.Spec.State
	}
	return subflowv1.StateRunning
}
