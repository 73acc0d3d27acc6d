package v1alpha1

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// Where an agent's control port counts: regular containers and native sidecars, never a plain
// init container, which has exited before the application starts.
func TestContainerPortOf(t *testing.T) {
	subflow := []corev1.ContainerPort{{Name: "subflow", ContainerPort: 9555}}
	always := ptr.To(corev1.ContainerRestartPolicyAlways)
	tests := []struct {
		name          string
		spec          corev1.PodSpec
		wantContainer string
		wantPort      int32
		wantPlainInit string
	}{
		{"regular container", corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Ports: subflow}}}, "app", 9555, ""},
		{"native sidecar", corev1.PodSpec{InitContainers: []corev1.Container{{Name: "proxy", RestartPolicy: always, Ports: subflow}},
			Containers: []corev1.Container{{Name: "app"}}}, "proxy", 9555, ""},
		{"plain init container", corev1.PodSpec{InitContainers: []corev1.Container{{Name: "migrate", Ports: subflow}},
			Containers: []corev1.Container{{Name: "app"}}}, "", 0, "migrate"},
		{"plain init container and the application", corev1.PodSpec{InitContainers: []corev1.Container{{Name: "migrate", Ports: subflow}},
			Containers: []corev1.Container{{Name: "app", Ports: []corev1.ContainerPort{{Name: "subflow", ContainerPort: 9470}}}}}, "app", 9470, "migrate"},
		{"another name", corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 9555}}}}}, "", 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := &corev1.Pod{Spec: tt.spec}
			container, port, found := ContainerPortOf(pod, "subflow")
			if container != tt.wantContainer || port != tt.wantPort || found != (tt.wantContainer != "") {
				t.Errorf("ContainerPortOf = %q, %d, %v; want %q, %d", container, port, found, tt.wantContainer, tt.wantPort)
			}
			init, found := PortOnPlainInitContainer(pod, "subflow")
			if init != tt.wantPlainInit || found != (tt.wantPlainInit != "") {
				t.Errorf("PortOnPlainInitContainer = %q, %v; want %q", init, found, tt.wantPlainInit)
			}
		})
	}
}
