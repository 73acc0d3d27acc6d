package controllers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/testing/podsim"
)

// 1000 pods whose agents each answer 500 with their own 4 KiB body: the status is still
// written for the flow's generation (the API server refuses a whole status whose condition
// message passes 32768 bytes), names the first pods and counts the others.
func TestIntegrationStatusStaysWritableWithAThousandFailingAgents(t *testing.T) {
	const pods = 1000
	ns := namespace(t, true)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range pods {
		body := fmt.Sprintf("agent %d failed: %s", i, strings.Repeat("é", 2040))
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, body, http.StatusInternalServerError)
		}))
		t.Cleanup(srv.Close)
		_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
		p, _ := strconv.Atoi(port)
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			createPod(t, ns, fmt.Sprintf("worker-%04d", i), p)
		}()
	}
	wg.Wait()
	flow := newFlow(ns, "flow", "", subflowv1.StatePaused)
	create(t, flow)
	// On a loaded machine a status can first be written while pushes are still in flight
	// ("no answer within 200ms"); the one to check is written once every agent has answered.
	got := waitFlow(t, flow, "a status with every pod's answer", func(f *subflowv1.SubscriptionFlow) bool {
		return current(f) && f.Status.Pods.Matched == pods && condition(f, subflowv1.ConditionReady) != nil &&
			!slices.ContainsFunc(f.Status.Agents, func(a subflowv1.AgentStatus) bool { return strings.Contains(a.Message, "no answer within") })
	})
	ready := condition(got, subflowv1.ConditionReady)
	if ready.Reason != subflowv1.ReasonAgentsUnreachable || !strings.Contains(ready.Message, "1000 of 1000 agents unreachable") ||
		!strings.Contains(ready.Message, "and 990 more") {
		t.Fatalf("Ready = %s %s: %.400s", ready.Status, ready.Reason, ready.Message)
	}
	if isTrue(got, subflowv1.ConditionPaused) {
		t.Fatal("Paused is True while no agent answered")
	}
	for _, c := range got.Status.Conditions {
		if len(c.Message) > 8192 || !utf8.ValidString(c.Message) {
			t.Errorf("%s message: %d bytes", c.Type, len(c.Message))
		}
	}
	for _, a := range got.Status.Agents {
		if len(a.Message) > 512 || !strings.Contains(a.Message, "failed") {
			t.Errorf("agent %s message (%d bytes): %.100q", a.Pod, len(a.Message), a.Message)
		}
	}
	// A spec change still reaches status.
	patchFlow(t, got, `{"spec":{"state":"Running"}}`)
	waitFlow(t, flow, "the new generation observed", func(f *subflowv1.SubscriptionFlow) bool {
		return current(f) && f.Status.EffectiveState == subflowv1.StateRunning
	})
}

// A typo in the subscription: the pod's consumer keeps running, the flow does not claim it
// paused (Ready=False NoMatchingConsumers naming what the agent consumes, Paused not True).
func TestIntegrationTypoInSubscriptionIsNotPaused(t *testing.T) {
	ns := namespace(t, true)
	topic := "persistent://public/default/typo-" + ns
	pod := startPod(t, ns, "worker-0", topic, testToken)
	flow := newFlow(ns, "flow", "", subflowv1.StatePaused)
	flow.Spec.Subscription = "ingset"
	create(t, flow)
	got := waitFlow(t, flow, "NoMatchingConsumers", func(f *subflowv1.SubscriptionFlow) bool {
		c := condition(f, subflowv1.ConditionReady)
		return current(f) && c != nil && c.Reason == subflowv1.ReasonNoMatchingConsumers
	})
	ready, paused := condition(got, subflowv1.ConditionReady), condition(got, subflowv1.ConditionPaused)
	want := fmt.Sprintf(`their agents consume "ingest" on %s`, topic)
	if ready.Status != "False" || !strings.Contains(ready.Message, `No consumer of subscription "ingset"`) || !strings.Contains(ready.Message, want) {
		t.Fatalf("Ready = %s: %s", ready.Status, ready.Message)
	}
	if paused == nil || paused.Status == "True" || paused.Reason != subflowv1.ReasonNoMatchingConsumers {
		t.Fatalf("Paused = %+v", paused)
	}
	if st := pod.Consumer.Status(); st.State != protocol.Running {
		t.Fatalf("the pod's consumer is %s, want Running (the flow names another subscription)", st.State)
	}
}

// One matched pod whose agent never answers: the others are paused and resumed without
// waiting for it, the status names it as unreachable with its push still in flight, and the
// controller never piles a second push onto the one it is still waiting for.
func TestIntegrationHangingAgentHoldsNobodyBack(t *testing.T) {
	ns := namespace(t, true)
	topic := "persistent://public/default/hang-" + ns
	healthy := []*podsim.Pod{startPod(t, ns, "worker-0", topic, testToken), startPod(t, ns, "worker-1", topic, testToken)}
	var inFlight, maxInFlight, pushes atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		pushes.Add(1)
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := maxInFlight.Load(); n > m && !maxInFlight.CompareAndSwap(m, n); m = maxInFlight.Load() {
		}
		_, _ = io.Copy(io.Discard, r.Body) // the server notices the client leave only after the body
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	createPod(t, ns, "hanging", srv.Listener.Addr().(*net.TCPAddr).Port)

	flow := newFlow(ns, "flow", topic, subflowv1.StatePaused)
	create(t, flow)
	for _, p := range healthy {
		eventually(t, p.Name+" paused", func() bool { return p.Consumer.State() == protocol.Paused })
	}
	got := waitFlow(t, flow, "the hanging pod named", func(f *subflowv1.SubscriptionFlow) bool {
		c := condition(f, subflowv1.ConditionReady)
		return current(f) && c != nil && strings.Contains(c.Message, "hanging (no answer within")
	})
	if ready := condition(got, subflowv1.ConditionReady); ready.Reason != subflowv1.ReasonAgentsUnreachable || !strings.Contains(ready.Message, "1 of 3 agents unreachable") {
		t.Fatalf("Ready: %s %s", ready.Reason, ready.Message)
	}
	if isTrue(got, subflowv1.ConditionPaused) {
		t.Fatal("Paused is True while one agent has not answered")
	}
	// The push times out (the suite's push timeout) and wakes the flow, whose retry pushes to
	// the pod again: nothing the status says about the pods changed, so none of that is written
	// (a write per late timeout would hold back the next change of a big flow). The backlog
	// report, which comes with a later reconcile, is news.
	eventually(t, "a second push to the hanging agent", func() bool { return pushes.Load() >= 2 })
	if before, after := withoutBacklog(got.Status), withoutBacklog(getFlow(t, got).Status); before != after {
		t.Fatalf("status changed after the hanging push timed out:\nbefore %s\nafter  %s", before, after)
	}
	patchFlow(t, got, `{"spec":{"state":"Running"}}`)
	for _, p := range healthy {
		eventually(t, p.Name+" running again", func() bool { return p.Consumer.State() == protocol.Running })
	}
	if n := maxInFlight.Load(); n != 1 {
		t.Fatalf("%d pushes to the hanging agent at once, want 1", n)
	}
}

// A matched pod that names no agent port: the status gives that as the cause, not only the
// connection error on the default port.
func TestIntegrationPodWithoutAgentPortIsNamedAsTheCause(t *testing.T) {
	ns := namespace(t, true)
	createPodWithPort(t, ns, "worker-0", "http", 8080)
	flow := newFlow(ns, "flow", "", subflowv1.StatePaused)
	create(t, flow)
	got := waitFlow(t, flow, "the missing port named", func(f *subflowv1.SubscriptionFlow) bool {
		c := condition(f, subflowv1.ConditionReady)
		return current(f) && c != nil && c.Reason == subflowv1.ReasonAgentsUnreachable
	})
	want := `worker-0 (the pod declares no container port named "subflow" (nor "subflow-https", nor the flow's spec.agent.port), so the default port 9470 was tried; `
	if msg := condition(got, subflowv1.ConditionReady).Message; !strings.Contains(msg, want) {
		t.Fatalf("Ready message %q does not contain %q", msg, want)
	}
}

// A pod that names no agent port, whose default port hangs, and whose injection the webhook
// skipped with a long reason: Ready and the pod's entry name both causes, the missing port
// included, whether the push failed or timed out.
func TestIntegrationEveryCauseOfAnUnreachablePodIsNamed(t *testing.T) {
	ns := namespace(t, true)
	ip := "127.83.17.5" // a loopback address of its own: its default port is this test's
	listener, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(protocol.DefaultPort)))
	if err != nil {
		t.Skipf("cannot listen on the default port at %s: %v", ip, err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done() // never answers: every push times out
	}))
	srv.Listener = listener
	srv.Start()
	t.Cleanup(srv.Close)
	skipped := "InvalidBrokerURL: " + strings.Repeat("pulsar+ssl://broker.example.com:6651/", 15) + " is not a broker URL"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "worker-0", Labels: map[string]string{"app": "worker"},
			Annotations: map[string]string{subflowv1.InjectionSkippedAnnotation: skipped}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "worker:1"}}},
	}
	create(t, pod)
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip}
	if err := k8s.Status().Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	flow := newFlow(ns, "flow", "", subflowv1.StatePaused)
	create(t, flow)
	const port = `the pod declares no container port named "subflow" (nor "subflow-https", nor the flow's spec.agent.port), so the default port 9470 was tried`
	got := waitFlow(t, flow, "the timed-out push reported", func(f *subflowv1.SubscriptionFlow) bool {
		c := condition(f, subflowv1.ConditionReady)
		return current(f) && c != nil && c.Reason == subflowv1.ReasonAgentsUnreachable && strings.Contains(c.Message, "no answer within")
	})
	ready := condition(got, subflowv1.ConditionReady).Message
	for _, want := range []string{"worker-0 (injection skipped: InvalidBrokerURL", port} {
		if !strings.Contains(ready, want) {
			t.Errorf("Ready message %q does not contain %q", ready, want)
		}
	}
	entry := got.Status.Agents[0].Message
	for _, want := range []string{"injection skipped: InvalidBrokerURL", port, "no answer within"} {
		if !strings.Contains(entry, want) {
			t.Errorf("the pod's entry %q does not contain %q", entry, want)
		}
	}
}

// withoutBacklog is the status as JSON, without what the backlog reporter adds.
func withoutBacklog(st subflowv1.SubscriptionFlowStatus) string {
	st.Backlog = nil
	st.Conditions = slices.DeleteFunc(slices.Clone(st.Conditions), func(c metav1.Condition) bool {
		return c.Type == subflowv1.ConditionBacklogAtRisk
	})
	out, _ := json.Marshal(st) // plain data: cannot fail
	return string(out)
}
