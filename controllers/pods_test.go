package controllers

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

func TestAgentBaseURL(t *testing.T) {
	pod := func(ip string, ports ...corev1.ContainerPort) *corev1.Pod {
		return &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Ports: ports}}}, Status: corev1.PodStatus{PodIP: ip}}
	}
	byName := intstr.FromString("agent")
	tests := []struct {
		name string
		pod  *corev1.Pod
		spec subflowv1.AgentSpec
		want string
	}{
		{"default port", pod("10.0.0.7"), subflowv1.AgentSpec{}, "http://10.0.0.7:9470"},
		{"IPv6 is bracketed", pod("fd00::7", corev1.ContainerPort{Name: "subflow", ContainerPort: 9470}), subflowv1.AgentSpec{}, "http://[fd00::7]:9470"},
		{"https port name", pod("fd00::7", corev1.ContainerPort{Name: "subflow-https", ContainerPort: 9443}), subflowv1.AgentSpec{}, "https://[fd00::7]:9443"},
		{"spec port by name", pod("10.0.0.7", corev1.ContainerPort{Name: "agent", ContainerPort: 7000}), subflowv1.AgentSpec{Port: &byName}, "http://10.0.0.7:7000"},
		{"no IP yet", pod(""), subflowv1.AgentSpec{}, ""},
		{"native sidecar's port", sidecarPod(corev1.ContainerRestartPolicyAlways), subflowv1.AgentSpec{}, "http://10.0.0.7:9555"},
		{"an init container that ends serves nothing", sidecarPod(""), subflowv1.AgentSpec{}, "http://10.0.0.7:9470"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := agentBaseURL(tt.pod, tt.spec); got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// sidecarPod runs its control port in an init container with the given restart policy (Always
// makes it a native sidecar).
func sidecarPod(policy corev1.ContainerRestartPolicy) *corev1.Pod {
	init := corev1.Container{Name: "subflow-sidecar", Ports: []corev1.ContainerPort{{Name: "subflow", ContainerPort: 9555}}}
	if policy != "" {
		init.RestartPolicy = &policy
	}
	return &corev1.Pod{Spec: corev1.PodSpec{InitContainers: []corev1.Container{init}, Containers: []corev1.Container{{Name: "app"}}},
		Status: corev1.PodStatus{PodIP: "10.0.0.7"}}
}

// A pod whose control port is on an init container that ends is told why the default port was
// tried: that container serves nothing once the application runs.
func TestWiringProblemsNamePortOnPlainInitContainer(t *testing.T) {
	problems := wiringProblems(sidecarPod(""), &subflowv1.SubscriptionFlow{}, nil)
	want := `init container subflow-sidecar declares "subflow" but is not a native sidecar (restartPolicy Always)`
	if len(problems) != 1 || !strings.Contains(problems[0], want) {
		t.Fatalf("wiringProblems = %q, want one naming: %s", problems, want)
	}
	if problems := wiringProblems(sidecarPod(corev1.ContainerRestartPolicyAlways), &subflowv1.SubscriptionFlow{}, nil); len(problems) != 0 {
		t.Errorf("a native sidecar's port: wiringProblems = %q, want none", problems)
	}
}
