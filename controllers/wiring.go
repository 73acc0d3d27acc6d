package controllers

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// wiringProblems tell, from its spec, why a pod the flow selects may not be wired for subflow:
// the webhook's record of a skipped injection, a pod that asked for injection and was never
// injected (created while the webhook was down or absent), a pod that names no control port
// (the default port was tried), or, when the agent refused the token, a pod that does not read
// the token Secret. The controller names them, first, beside an agent it cannot reach or that
// refuses its token, so that the cause is read where the symptom is. They come from the flow
// and the pod only: the push's error, which another flow's push or a timeout may have written,
// never carries them.
func wiringProblems(pod *corev1.Pod, flow *subflowv1.SubscriptionFlow, pushErr error) []string {
	var problems []string
	if skipped := pod.Annotations[subflowv1.InjectionSkippedAnnotation]; skipped != "" {
		problems = append(problems, "injection skipped: "+skipped)
	} else if mode := pod.Labels[subflowv1.InjectLabel]; mode != "" && pod.Annotations[subflowv1.InjectedAnnotation] == "" {
		problems = append(problems, fmt.Sprintf("labelled %s=%s but never injected (created while the webhook was down or absent): "+
			"delete the pod so that it is created again", subflowv1.InjectLabel, mode))
	}
	if !namesAgentPort(pod, flow.Spec.Agent) {
		problems = append(problems, noAgentPort(pod))
	}
	// A pod that does not read the token is the cause only of a refused token.
	if secret, _ := tokenRef(flow); IsUnauthorized(pushErr) && !usesSecret(pod, secret) {
		problems = append(problems, fmt.Sprintf("not wired for subflow (no volume or env var from Secret %s, the agents' token): "+
			"label it %s=agent or sidecar (docs/onboarding.md)", secret, subflowv1.InjectLabel))
	}
	return problems
}

// noAgentPort says why the default port was tried, naming a plain init container that declares
// the control port: it has exited before the application starts (subflowv1.ContainerPortOf).
func noAgentPort(pod *corev1.Pod) string {
	msg := fmt.Sprintf("the pod declares no container port named %q (nor %q, nor the flow's spec.agent.port), "+
		"so the default port %d was tried", protocol.PortName, protocol.TLSPortName, protocol.DefaultPort)
	for _, name := range []string{protocol.PortName, protocol.TLSPortName} {
		if init, ok := subflowv1.PortOnPlainInitContainer(pod, name); ok {
			return msg + fmt.Sprintf(": init container %s declares %q but is not a native sidecar (restartPolicy Always), "+
				"so it serves nothing once the application runs", init, name)
		}
	}
	return msg
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
