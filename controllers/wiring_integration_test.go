package controllers_test

import (
	"cmp"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/controllers"
)

// Pods a flow selects that are not wired for subflow are named in its status with the precise
// reason, before the symptom (an agent that cannot be reached or refuses the token), and
// `kubectl subflow status` shows it: a pod whose injection the webhook skipped, one labelled
// for injection that was never injected, one whose agent refuses the token and that does not
// read the token Secret. A wired pod that cannot be reached gets no such note.
func TestIntegrationUnwiredPodsAreNamedWithTheReason(t *testing.T) {
	run := kubectlSubflow(t)
	ns := namespace(t, true)
	port := closedPort(t)
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"reason":"Unauthorized","message":"wrong token"}`))
	}))
	t.Cleanup(refusing.Close)
	refusingPort := refusing.Listener.Addr().(*net.TCPAddr).Port
	tokenVolume := corev1.Volume{Name: "subflow-token", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: controllers.DefaultTokenSecret}}}
	pods := map[string]struct {
		labels, annotations map[string]string
		volumes             []corev1.Volume
		port                int
		want                string
	}{
		"skipped": {labels: map[string]string{subflowv1.InjectLabel: "agent"},
			annotations: map[string]string{subflowv1.InjectionSkippedAnnotation: "Conflict: container app already mounts volume x at /var/run/subflow"},
			want:        "injection skipped: Conflict: container app already mounts volume x at /var/run/subflow"},
		"never-injected": {labels: map[string]string{subflowv1.InjectLabel: "sidecar"},
			want: "labelled subflow.dev/inject=sidecar but never injected"},
		"no-token": {port: refusingPort, want: "not wired for subflow (no volume or env var from Secret " + controllers.DefaultTokenSecret},
		"wired":    {volumes: []corev1.Volume{tokenVolume}},
		"refused":  {port: refusingPort, volumes: []corev1.Volume{tokenVolume}},
	}
	for name, p := range pods {
		labels := map[string]string{"app": "worker"}
		for k, v := range p.labels {
			labels[k] = v
		}
		createUnreachablePod(t, ns, name, cmp.Or(p.port, port), labels, p.annotations, p.volumes)
	}
	flow := newFlow(ns, "flow", "", subflowv1.StatePaused)
	create(t, flow)
	got := waitFlow(t, flow, "every pod reported", func(f *subflowv1.SubscriptionFlow) bool {
		return current(f) && len(f.Status.Agents) == len(pods)
	})
	for _, a := range got.Status.Agents {
		want := pods[a.Pod].want
		switch {
		case want == "" && strings.Contains(a.Message, "wired"):
			t.Errorf("wired pod %s: message %q names a wiring problem", a.Pod, a.Message)
		case want != "" && !strings.HasPrefix(a.Message, want):
			t.Errorf("pod %s: message %q, want it to start with %q", a.Pod, a.Message, want)
		}
	}
	out, err := run("status", "flow", "-n", ns)
	if err != nil || !strings.Contains(out, "injection skipped: Conflict") || !strings.Contains(out, "never injected") {
		t.Fatalf("kubectl subflow status (%v):\n%s", err, out)
	}
}

// closedPort is a loopback port that hangs up on every connection, as an agent that cannot be
// reached. It stays held until the test ends: a port closed at once could be taken meanwhile by
// another test's server, which would answer.
func closedPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			_ = conn.Close()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

func createUnreachablePod(t *testing.T, ns, name string, port int, labels, annotations map[string]string, volumes []corev1.Volume) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels, Annotations: annotations},
		Spec: corev1.PodSpec{Volumes: volumes, Containers: []corev1.Container{{Name: "app", Image: "worker:1",
			Ports: []corev1.ContainerPort{{Name: "subflow", ContainerPort: int32(port)}}}}},
	}
	if err := k8s.Create(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1"}
	if err := k8s.Status().Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
}
