package controllers

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// wiringProblem tells, from its spec, why a pod the flow selects may not be wired for subflow,
// or "" when nothing shows: the webhook's record of a skipped injection, a pod that asked for
// injection and was never injected (created while the webhook was down or absent), or, when
// the agent refused the token, a pod that does not read the token Secret. The controller names it beside an agent it
// cannot reach or that refuses its token, so that the reason is read where the symptom is.
func wiringProblem(pod *corev1.Pod, flow *subflowv1.SubscriptionFlow, pushErr error) string {
	if skipped := pod.Annotations[subflowv1.InjectionSkippedAnnotation]; skipped != "" {
		return "injection skipped: " + skipped
	}
	if mode := pod.Labels[subflowv1.InjectLabel]; mode != "" && pod.Annotations[subflowv1.InjectedAnnotation] == "" {
		return fmt.Sprintf("labelled %s=%s but never injected (created while the webhook was down or absent): delete the pod so that it is created again",
			subflowv1.InjectLabel, mode)
	}
	// A pod that does not read the token is the cause only of a refused token; a missing
	// control port is told by the push's own error (pushOne).
	if secret, _ := tokenRef(flow); IsUnauthorized(pushErr) && !usesSecret(pod, secret) {
		return fmt.Sprintf("not wired for subflow (no volume or env var from Secret %s, the agents' token): label it %s=agent or sidecar (docs/onboarding.md)",
			secret, subflowv1.InjectLabel)
	}
	return ""
}

// usesSecret reports whether the pod mounts the Secret or reads it into an env var.
func usesSecret(pod *corev1.Pod, name string) bool {
	for _, v := range pod.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == name {
			return true
		}
		if v.Projected != nil {
			for _, src := range v.Projected.Sources {
				if src.Secret != nil && src.Secret.Name == name {
					return true
				}
			}
		}
	}
	for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == name {
				return true
			}
		}
		for _, e := range c.EnvFrom {
			if e.SecretRef != nil && e.SecretRef.Name == name {
				return true
			}
		}
	}
	return false
}
