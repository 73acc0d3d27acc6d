package controllers

import (
	"errors"
	"net/http"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// A pod whose agent fails is pushed to once per step, 1 s doubling, by all the flows selecting
// it together; a failure of a push begun before the hold does not lengthen it; a good answer,
// a refusal of the request, a restarted agent and a deleted pod each lift it.
func TestBrokenAgentIsHeldBackPerPod(t *testing.T) {
	var b memory
	t0 := time.Now()
	s := subject(paused, podH)
	keyA, keyB := pushKey{flow: flowA, pod: "h"}, pushKey{flow: flowB, pod: "h"}
	failed := podOutcome{Pod: "h", Err: &AgentError{Status: http.StatusInternalServerError, Message: "boom"}}
	pushed := func(key pushKey, at time.Time) bool {
		t.Helper()
		if _, _, held := b.held(s, at); held {
			return false
		}
		b.start(key, s)
		return true
	}
	if !pushed(keyA, t0) || !pushed(keyB, t0) {
		t.Fatal("a pod that never failed is held back")
	}
	b.finish(keyA, s, failed, false, t0)
	b.finish(keyB, s, failed, false, t0.Add(500*time.Millisecond)) // begun before the hold
	err, next, held := b.held(s, t0.Add(999*time.Millisecond))
	if !held || !next.Equal(t0.Add(time.Second)) || err != failed.Err {
		t.Fatalf("after a 500: held %v until %s (%v), want until +1s with the 500", held, next.Sub(t0), err)
	}
	// Of the flows that come once the step has passed, one pushes; the next step is 2 s.
	at := t0.Add(time.Second)
	if !pushed(keyA, at) || pushed(keyB, at) {
		t.Fatal("not exactly one flow pushes once the step has passed")
	}
	b.finish(keyA, s, podOutcome{Pod: "h", Err: errors.New("invalid character '<' looking for beginning of value")}, false, at)
	if _, next, _ := b.held(s, at); !next.Equal(at.Add(2 * time.Second)) {
		t.Fatalf("second step ends at +%s, want +2s", next.Sub(at))
	}
	at = at.Add(2 * time.Second)
	if !pushed(keyB, at) {
		t.Fatal("held after the second step")
	}
	b.finish(keyB, s, podOutcome{Pod: "h", Err: &AgentError{Status: http.StatusBadRequest}}, false, at)
	if !pushed(keyA, at) {
		t.Fatal("a refused request (400) leaves the pod held back")
	}
	b.finish(keyA, s, failed, false, at)
	if pushed(keyA, at) {
		t.Fatal("a failure after a lifted hold does not hold the pod back again")
	}
	if _, next, _ := b.held(s, at); !next.Equal(at.Add(time.Second)) {
		t.Fatalf("after a lifted hold the step is %s, want 1s again", next.Sub(at))
	}
	restarted := s
	restarted.restarts++
	if _, _, held := b.held(restarted, at); held {
		t.Fatal("a restarted agent is held back for its predecessor's failures")
	}
	b.finish(keyA, s, failed, false, at)
	b.forgetPod(podH.pod)
	if len(b.gates) != 0 {
		t.Fatalf("holds left after the pod was deleted: %v", b.gates)
	}
	b.finish(keyA, s, failed, false, at)
	b.finish(keyA, s, answer(paused, protocol.Paused), true, at)
	if len(b.gates) != 0 {
		t.Fatalf("a good answer leaves the pod held back: %v", b.gates)
	}
}

func TestAgentBroken(t *testing.T) {
	for err, want := range map[error]bool{
		nil:                      false,
		&noAnswer{}:              true,
		errors.New("refused"):    true,
		&AgentError{Status: 500}: true,
		&AgentError{Status: 503}: true,
		&AgentError{Status: 400}: false,
		&AgentError{Status: 401}: false,
		&AgentError{Status: 409}: false,
		&AgentError{Status: 415}: false,
	} {
		if got := agentBroken(err); got != want {
			t.Errorf("%v: broken = %v, want %v", err, got, want)
		}
	}
}

// A flow with a held pod comes back when the pod's step ends, as the pushes' wall clock tells
// it, whatever the flow's own retry delay; never sooner than a millisecond.
func TestRequeueComesBackWhenAHeldPodMayBePushedAgain(t *testing.T) {
	now := time.Unix(1000, 0)
	r := &SubscriptionFlowReconciler{Resync: time.Hour, wall: clocktesting.NewFakePassiveClock(now)}
	flow := &subflowv1.SubscriptionFlow{}
	for range 8 { // backed off to a minute
		r.memory.nextRetry(flowKey(flow))
	}
	for held, want := range map[time.Duration]time.Duration{3 * time.Second: 3 * time.Second, -time.Second: time.Millisecond} {
		got := r.requeue(flow, observation{HeldUntil: now.Add(held), Now: now})
		if got.RequeueAfter != want {
			t.Errorf("pod held until %s from now: requeue after %s, want %s", held, got.RequeueAfter, want)
		}
	}
}
