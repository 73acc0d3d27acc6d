package controllers

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/subflow-dev/subflow/agent/protocol"
)

var (
	flowA  = types.NamespacedName{Namespace: "ns", Name: "a"}
	flowB  = types.NamespacedName{Namespace: "ns", Name: "b"}
	podH   = agentAddress{pod: "uid-h", url: "http://10.0.0.7:9470"}
	paused = protocol.FlowRequest{UID: "u", Revision: 3, Subscription: "s", State: protocol.Paused}
)

func subject(req protocol.FlowRequest, address agentAddress) pushSubject {
	return pushSubject{request: requestDigest(req), address: address, token: "t"}
}

func answer(req protocol.FlowRequest, states ...protocol.State) podOutcome {
	st := &protocol.FlowStatus{AppliedRevision: req.Revision}
	for _, s := range states {
		st.Consumers = append(st.Consumers, protocol.ConsumerStatus{Name: "c", State: s})
	}
	return podOutcome{Pod: "h", Status: st}
}

// A pod that did not answer one flow's push is not waited for by another flow's; an answer
// to any flow's push clears that; a deleted pod's suspicion is dropped.
func TestSuspicionIsThePods(t *testing.T) {
	var b memory
	now := time.Now()
	keyA, keyB := pushKey{flow: flowA, pod: "h"}, pushKey{flow: flowB, pod: "h"}
	s := subject(paused, podH)
	if err := b.start(keyA, s); err != nil {
		t.Fatalf("first push: suspected already (%v)", err)
	}
	if _, ok := b.collect(keyA, true); ok {
		t.Fatal("collected a push that has not ended")
	}
	var still *noAnswer
	if err := b.start(keyB, s); !errors.As(err, &still) {
		t.Fatalf("another flow's push to the pod that did not answer: %v, want the suspicion", err)
	}
	b.finish(keyB, s, answer(paused, protocol.Paused), true, now)
	if _, ok := b.take(keyB, s, now, time.Hour); !ok {
		t.Fatal("the answered push is not reported")
	}
	if err := b.start(pushKey{flow: flowA, pod: "h"}, subject(paused, podH)); err != nil {
		t.Fatalf("after an answer to flow b the pod is still suspected by flow a: %v", err)
	}
	b.finish(keyA, s, podOutcome{Pod: "h", Err: errors.New("timeout")}, false, now)
	b.forgetPod("uid-h")
	if len(b.suspect) != 0 {
		t.Fatalf("suspicions left after the pod was deleted: %v", b.suspect)
	}
	// Another pod at the same address (an IP reused) is not suspected for the first one.
	b.finish(keyA, s, podOutcome{Pod: "h", Err: errors.New("timeout")}, false, now)
	b.collect(keyA, false)
	if err := b.start(keyA, subject(paused, agentAddress{pod: "uid-other", url: podH.url})); err != nil {
		t.Fatalf("a new pod at the address is suspected: %v", err)
	}
}

// A settled answer is reported instead of pushing again while the request, the agent and the
// resync period are the same; anything else pushes.
func TestSettledAnswerIsReusedUntilSomethingChanges(t *testing.T) {
	var b memory
	now := time.Now()
	key := pushKey{flow: flowA, pod: "h"}
	s := subject(paused, podH)
	b.start(key, s)
	b.finish(key, s, answer(paused, protocol.Paused), true, now)
	b.collect(key, false)
	if o, ok := b.take(key, s, now.Add(time.Minute), 5*time.Minute); !ok || o.Status == nil {
		t.Fatal("a retry pushes again to a pod that answered the same request")
	}
	restarted, rotated := s, s
	restarted.restarts++
	rotated.token = "new"
	running := paused
	running.State = protocol.Running
	for name, other := range map[string]pushSubject{"restarted": restarted, "token rotated": rotated, "other request": subject(running, podH)} {
		if _, ok := b.take(key, other, now, 5*time.Minute); ok {
			t.Errorf("%s: the earlier answer is reused", name)
		}
	}
	if _, ok := b.take(key, s, now.Add(5*time.Minute), 5*time.Minute); ok {
		t.Error("after the resync period the earlier answer is reused")
	}
	b.keepApplied(flowA, map[string]bool{})
	if applied := b.flows[flowA].applied; len(applied) != 0 {
		t.Fatalf("answers kept for pods no longer matched: %v", applied)
	}
}

func TestSettledAnswer(t *testing.T) {
	backlog := paused
	backlog.ReportBacklog = true
	for name, c := range map[string]struct {
		req     protocol.FlowRequest
		outcome podOutcome
		want    bool
	}{
		"paused":          {paused, answer(paused, protocol.Paused, protocol.Paused), true},
		"converging":      {paused, answer(paused, protocol.Paused, protocol.Running), false},
		"held by another": {paused, answer(paused, protocol.Stopped), false},
		"no consumer":     {paused, answer(paused), false},
		"reads backlog":   {backlog, answer(backlog, protocol.Paused), false},
		"error":           {paused, podOutcome{Err: errors.New("x")}, false},
		"older revision":  {paused, answer(protocol.FlowRequest{Revision: 2}, protocol.Paused), false},
		"previous token":  {paused, func() podOutcome { o := answer(paused, protocol.Paused); o.PreviousToken = true; return o }(), false},
		"seek running": {paused, func() podOutcome {
			o := answer(paused, protocol.Paused)
			o.Status.Seek = &protocol.SeekStatus{State: protocol.SeekRunning}
			return o
		}(), false},
		"conflict present": {paused, func() podOutcome { o := answer(paused, protocol.Paused); o.Status.Conflict = "x"; return o }(), false},
		"agent too old":    {paused, podOutcome{Err: &AgentError{Status: 422, Reason: protocol.ReasonAgentTooOld}}, true},
		"too many flows":   {paused, podOutcome{Err: &AgentError{Status: 409, Reason: protocol.ReasonTooManyFlows}}, true},
		"other refusal":    {paused, podOutcome{Err: &AgentError{Status: 409, Reason: protocol.ReasonStaleUID}}, false},
		"too old, previous token": {paused, podOutcome{Err: &AgentError{Status: 422, Reason: protocol.ReasonAgentTooOld},
			PreviousToken: true}, false},
	} {
		if got := settledAnswer(c.req, c.outcome); got != c.want {
			t.Errorf("%s: settled = %v, want %v", name, got, c.want)
		}
	}
}

// A transport error names the agent, not the flow's URL: every flow selecting the pod reports it.
func TestTransportErrorNamesTheAgent(t *testing.T) {
	client := NewHTTPAgentClient(time.Second, nil)
	target := AgentTarget{Pod: "h", BaseURL: "http://127.0.0.1:1", Namespace: "ns", Name: "secret-flow-name"}
	_, err := client.PutFlow(context.Background(), target, paused)
	if err == nil {
		t.Skip("something listens on port 1")
	}
	if got := withAgentURL(err, target).Error(); got == err.Error() || !containsAll(got, "http://127.0.0.1:1", "refused") || containsAll(got, "secret-flow-name") {
		t.Fatalf("error %q", got)
	}
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}
