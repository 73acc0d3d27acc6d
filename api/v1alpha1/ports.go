package v1alpha1

import corev1 "k8s.io/api/core/v1"

// ContainerPortOf finds the pod's container port named name where an agent can serve it, and the
// container that declares it: a regular container, else a native sidecar (an init container with
// restartPolicy Always, which keeps running beside the application). A plain init container has
// exited before the application starts, so a port it declares serves nothing and is not looked
// at. The controller looks up agents' control ports, and the pod webhook judges a pod's own
// declaration, by this one rule.
func ContainerPortOf(pod *corev1.Pod, name string) (container string, port int32, found bool) {
	for _, c := range pod.Spec.Containers {
		if port, ok := namedPort(c, name); ok {
			return c.Name, port, true
		}
	}
	for _, c := range pod.Spec.InitContainers {
		if NativeSidecar(c) {
			if port, ok := namedPort(c, name); ok {
				return c.Name, port, true
			}
		}
	}
	return "", 0, false
}

// PortOnPlainInitContainer names a plain init container (not a native sidecar) that declares a
// port named name: ContainerPortOf never finds such a port.
func PortOnPlainInitContainer(pod *corev1.Pod, name string) (container string, found bool) {
	for _, c := range pod.Spec.InitContainers {
		if _, ok := namedPort(c, name); ok && !NativeSidecar(c) {
			return c.Name, true
		}
	}
	return "", false
}

// NativeSidecar reports whether an init container keeps running beside the application
// containers (restartPolicy Always).
func NativeSidecar(c corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

func namedPort(c corev1.Container, name string) (int32, bool) {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort, true
		}
	}
	return 0, false
}
