package controllers_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// brokenAgent is a pod's agent that answers every request unusably (500, or 200 with a body
// that is not JSON), over real HTTP. It records when each request came.
type brokenAgent struct {
	name string
	port int
	mu   sync.Mutex
	at   []time.Time
}

func startBrokenAgent(t *testing.T, ns, name string, answer http.HandlerFunc) *brokenAgent {
	t.Helper()
	a := &brokenAgent{name: name}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.at = append(a.at, time.Now())
		a.mu.Unlock()
		answer(w, r)
	}))
	t.Cleanup(srv.Close)
	a.port = srv.Listener.Addr().(*net.TCPAddr).Port
	createPod(t, ns, name, a.port)
	return a
}

// requests counts the requests that came from the first one on, within window of it, and
// returns their offsets from the first.
func (a *brokenAgent) requests(window time.Duration) (int, []time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var offsets []time.Duration
	for _, at := range a.at {
		if d := at.Sub(a.at[0]); d <= window {
			offsets = append(offsets, d.Round(time.Millisecond))
		}
	}
	return len(offsets), offsets
}

func (a *brokenAgent) total() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.at)
}

func (a *brokenAgent) first() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.at) == 0 {
		return time.Time{}
	}
	return a.at[0]
}

// Agents that answer 500, or 200 with garbage, selected by several flows beside a healthy
// agent: each gets at most one push per backoff step (1 s doubling), whichever flow or wake
// pushes, and whatever the number of flows; the healthy agent is still pushed at once when a
// flow changes, and a new pod in the place of a broken one starts with no backoff.
func TestIntegrationMisbehavingAgentIsBackedOffPerPod(t *testing.T) {
	const flows = 6
	const window = 16 * time.Second
	ns := namespace(t, true)
	healthy := startCountingAgent(t, ns, "worker-0")
	failing := startBrokenAgent(t, ns, "broken-500", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "internal error", http.StatusInternalServerError)
	})
	garbage := startBrokenAgent(t, ns, "broken-garbage", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("<html>not an agent</html>"))
	})
	var all []*subflowv1.SubscriptionFlow
	for i := range flows {
		flow := newFlow(ns, fmt.Sprintf("flow-%d", i), "", subflowv1.StatePaused)
		create(t, flow)
		all = append(all, flow)
	}
	for _, flow := range all {
		waitFlow(t, flow, "both broken pods named", func(f *subflowv1.SubscriptionFlow) bool {
			c := condition(f, subflowv1.ConditionReady)
			return current(f) && c != nil && c.Reason == subflowv1.ReasonAgentsUnreachable && f.Status.Pods.Unreachable == 2
		})
	}
	// From its first request, a broken pod is pushed at most once more per step: after 1, 3,
	// 7 and 15 s. The flows' first pushes may all come before the first answer.
	eventuallyWithin(t, window+5*time.Second, "the window to pass", func() bool {
		return time.Since(failing.first()) > window && time.Since(garbage.first()) > window
	})
	for _, a := range []*brokenAgent{failing, garbage} {
		n, offsets := a.requests(window)
		if n > flows+4 {
			t.Errorf("%s got %d requests within %s of its first, want at most %d: %v", a.name, n, window, flows+4, offsets)
		}
		t.Logf("%s: %d requests within %s of its first: %v", a.name, n, window, offsets)
	}

	// The broken pods are now backed off for 16 s: a change still reaches the healthy pod at once.
	failingBefore, garbageBefore := failing.total(), garbage.total()
	patchFlow(t, all[0], `{"spec":{"state":"Running"}}`)
	eventuallyWithin(t, 3*time.Second, "the healthy pod running", func() bool { return healthy.state(all[0].Name) == protocol.Running })
	if failing.total() != failingBefore || garbage.total() != garbageBefore {
		t.Errorf("the change pushed to the backed-off pods: %d and %d more requests", failing.total()-failingBefore, garbage.total()-garbageBefore)
	}

	// A new pod in the broken pod's place (a new UID, the same address) is pushed at once.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: failing.name}}
	if err := k8s.Delete(context.Background(), pod, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pod gone", func() bool {
		return apierrors.IsNotFound(k8s.Get(context.Background(), client.ObjectKeyFromObject(pod), &corev1.Pod{}))
	})
	before := failing.total()
	createPod(t, ns, failing.name, failing.port)
	eventuallyWithin(t, 3*time.Second, "the new pod pushed", func() bool { return failing.total() > before })
}
