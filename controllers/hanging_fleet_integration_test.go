package controllers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// countingAgent speaks enough of the agent protocol over real HTTP for the controller: each
// flow's rule applies at once to one consumer, in the state asked. It counts the pushes it
// gets per flow, which is what shows whether a retry pushed to it again.
type countingAgent struct {
	name   string
	mu     sync.Mutex
	puts   map[string]int // by flow name
	states map[string]protocol.State
	// backlog holds the flows that asked this pod to read their backlog: that pod is pushed
	// on every reconcile, to read it afresh.
	backlog map[string]bool
}

func startCountingAgent(t *testing.T, ns, name string) *countingAgent {
	t.Helper()
	a := &countingAgent{name: name, puts: map[string]int{}, states: map[string]protocol.State{}, backlog: map[string]bool{}}
	srv := httptest.NewServer(http.HandlerFunc(a.serve))
	t.Cleanup(srv.Close)
	createPod(t, ns, name, srv.Listener.Addr().(*net.TCPAddr).Port)
	return a
}

func (a *countingAgent) serve(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+testToken {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	flow := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
	if r.Method != http.MethodPut {
		w.WriteHeader(http.StatusOK) // a release
		return
	}
	var req protocol.FlowRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	a.mu.Lock()
	a.puts[flow]++
	a.states[flow] = req.State
	a.backlog[flow] = a.backlog[flow] || req.ReportBacklog
	a.mu.Unlock()
	_ = json.NewEncoder(w).Encode(protocol.FlowStatus{Pod: a.name, AppliedRevision: req.Revision, Consumers: []protocol.ConsumerStatus{{
		Topic: "persistent://public/default/t", Subscription: req.Subscription, Name: a.name + "-c", State: req.State, Connected: true}}})
}

func (a *countingAgent) pushes(flow string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.puts[flow]
}

// readsBacklog reports whether the pod was asked to read the flow's backlog.
func (a *countingAgent) readsBacklog(flow string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.backlog[flow]
}

func (a *countingAgent) state(flow string) protocol.State {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.states[flow]
}

// silentAgent accepts pushes and answers none until answer is set (a wedged process); then it
// answers like a countingAgent. It counts the pushes it got, answered or not.
type silentAgent struct {
	countingAgent
	answer atomic.Bool
	got    atomic.Int32
}

func startSilentAgent(t *testing.T, ns, name string) *silentAgent {
	t.Helper()
	a := &silentAgent{countingAgent: countingAgent{name: name, puts: map[string]int{}, states: map[string]protocol.State{}, backlog: map[string]bool{}}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.got.Add(1)
		if a.answer.Load() {
			a.serve(w, r)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body) // the server notices the client leave only after the body
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	createPod(t, ns, name, srv.Listener.Addr().(*net.TCPAddr).Port)
	return a
}

// namesHanging reports whether the flow's current status names the pod as the one agent
// unreachable, the others synced.
func namesHanging(f *subflowv1.SubscriptionFlow, pod string, matched int) bool {
	c := condition(f, subflowv1.ConditionReady)
	return current(f) && c != nil && c.Reason == subflowv1.ReasonAgentsUnreachable &&
		strings.Contains(c.Message, fmt.Sprintf("1 of %d agents unreachable: %s (", matched, pod)) &&
		f.Status.Pods.Synced == int32(matched-1)
}

// One pod that hangs, selected by many flows: every flow's healthy pods are paused and every
// flow's status names the hanging pod, without the flows taking turns waiting for it; once
// the pod answers again, every flow becomes Ready and Paused.
func TestIntegrationPodHangingForManyFlowsHoldsNoFlowBack(t *testing.T) {
	const flows, healthy = 12, 3
	ns := namespace(t, true)
	var agents []*countingAgent
	for i := range healthy {
		agents = append(agents, startCountingAgent(t, ns, fmt.Sprintf("worker-%d", i)))
	}
	hanging := startSilentAgent(t, ns, "hanging")
	var all []*subflowv1.SubscriptionFlow
	for i := range flows {
		flow := newFlow(ns, fmt.Sprintf("flow-%02d", i), "", subflowv1.StatePaused)
		create(t, flow)
		all = append(all, flow)
	}
	start := time.Now()
	for _, flow := range all {
		for _, a := range agents {
			eventually(t, a.name+" paused by "+flow.Name, func() bool { return a.state(flow.Name) == protocol.Paused })
		}
		got := waitFlow(t, flow, "the hanging pod named", func(f *subflowv1.SubscriptionFlow) bool { return namesHanging(f, "hanging", healthy+1) })
		if isTrue(got, subflowv1.ConditionPaused) {
			t.Fatalf("%s: Paused is True while the hanging pod never answered", flow.Name)
		}
	}
	t.Logf("%d flows' healthy pods paused and statuses naming the hanging pod after %s", flows, time.Since(start).Round(time.Millisecond))

	// The flows notice at their next retry, which backs off up to a minute.
	hanging.answer.Store(true)
	for _, flow := range all {
		waitFlowWithin(t, flow, maxRetry+10*time.Second, "Ready and Paused once the pod answers", func(f *subflowv1.SubscriptionFlow) bool {
			return current(f) && isTrue(f, subflowv1.ConditionReady) && isTrue(f, subflowv1.ConditionPaused) && f.Status.Pods.Synced == healthy+1
		})
		if s := hanging.state(flow.Name); s != protocol.Paused {
			t.Fatalf("%s: the pod that answered again holds %q", flow.Name, s)
		}
	}
}

// A flow that is not Ready because of one hanging pod is retried, and each retry pushes to
// the hanging pod again but not to the healthy pods, which answered the same request already
// (except the one asked to read the backlog: it reads it afresh each time). A spec change
// pushes to everyone; so does a pod whose containers restarted (its agent lost its rules),
// while the others are left alone.
func TestIntegrationRetryPushesOnlyToPodsThatHaveNotAnswered(t *testing.T) {
	const healthy = 3
	ns := namespace(t, true)
	var agents []*countingAgent
	for i := range healthy {
		agents = append(agents, startCountingAgent(t, ns, fmt.Sprintf("worker-%d", i)))
	}
	hanging := startSilentAgent(t, ns, "hanging")
	flow := newFlow(ns, "flow", "", subflowv1.StatePaused)
	create(t, flow)
	got := waitFlow(t, flow, "the hanging pod named", func(f *subflowv1.SubscriptionFlow) bool { return namesHanging(f, "hanging", healthy+1) })
	for _, a := range agents {
		if n := a.pushes(flow.Name); n != 1 || a.state(flow.Name) != protocol.Paused {
			t.Fatalf("%s: %d pushes, state %q; want 1, Paused", a.name, n, a.state(flow.Name))
		}
	}
	// Retries back off (1 s doubling, the hanging push's timeout counting as one): the first
	// to find that push ended pushes to the hanging pod again, some seconds on.
	before := hanging.got.Load()
	eventuallyWithin(t, 40*time.Second, "a retry pushing to the hanging pod again", func() bool { return hanging.got.Load() > before })
	for _, a := range agents {
		if n := a.pushes(flow.Name); n != 1 && !a.readsBacklog(flow.Name) {
			t.Fatalf("%s: %d pushes after the retries, want still 1 (it answered the same request)", a.name, n)
		}
	}
	if got = getFlow(t, flow); !namesHanging(got, "hanging", healthy+1) {
		t.Fatalf("after the retries the status no longer names the hanging pod alone: %+v", got.Status)
	}

	patchFlow(t, got, `{"spec":{"state":"Running"}}`)
	for _, a := range agents {
		eventually(t, a.name+" running", func() bool { return a.state(flow.Name) == protocol.Running })
	}
	waitFlow(t, flow, "Running observed", func(f *subflowv1.SubscriptionFlow) bool {
		return current(f) && f.Status.EffectiveState == subflowv1.StateRunning && namesHanging(f, "hanging", healthy+1)
	})

	// Running: no pod reads the backlog any more.
	pushed := map[*countingAgent]int{}
	for _, a := range agents {
		pushed[a] = a.pushes(flow.Name)
	}
	restarted := agents[0]
	bumpRestarts(t, ns, restarted.name)
	eventually(t, "the restarted pod pushed again", func() bool { return restarted.pushes(flow.Name) > pushed[restarted] })
	for _, a := range agents[1:] {
		if n := a.pushes(flow.Name); n != pushed[a] {
			t.Fatalf("%s: pushed again (%d, was %d) when another pod restarted", a.name, n, pushed[a])
		}
	}
}

// maxRetry is the controller's longest retry delay.
const maxRetry = time.Minute

// waitFlowWithin is waitFlow with a deadline of its own.
func waitFlowWithin(t *testing.T, flow *subflowv1.SubscriptionFlow, within time.Duration, what string, cond func(*subflowv1.SubscriptionFlow) bool) {
	t.Helper()
	var got *subflowv1.SubscriptionFlow
	eventuallyWithin(t, within, what, func() bool { got = getFlow(t, flow); return cond(got) }, func() string {
		return fmt.Sprintf("status: %+v", got.Status)
	})
}

// eventuallyWithin is eventually with a deadline of its own, for what waits on the
// controller's backed-off retries.
func eventuallyWithin(t *testing.T, within time.Duration, what string, cond func() bool, detail ...func() string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			msg := ""
			for _, d := range detail {
				msg = d()
			}
			t.Fatalf("timed out after %s waiting for %s %s", within, what, msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// bumpRestarts reports a container restart of the pod, as the kubelet would.
func bumpRestarts(t *testing.T, ns, name string) {
	t.Helper()
	pod := &corev1.Pod{}
	if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status.ContainerStatuses[0].RestartCount++
	if err := k8s.Status().Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
}
