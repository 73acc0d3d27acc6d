package controllers

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/events"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// stalledReport is the reporter's answer when a paused Key_Shared consumer starves its siblings.
func stalledReport(stall bool) *protocol.FlowStatus {
	st := agentAnswer(protocol.Paused)
	b := protocol.BacklogStatus{Topic: "persistent://public/default/orders", Messages: 18498, ReadAt: time.Now()}
	if stall {
		b.KeySharedStall = &protocol.KeySharedStall{Halted: []string{"a"}, HaltedCount: 1,
			Starved: []string{"b", "c"}, StarvedCount: 12, InReplay: 6000, Waiting: 12478}
	}
	st.Backlog = []protocol.BacklogStatus{b}
	return st
}

func stallObservation(stall bool) observation {
	return observation{Effective: Effective{State: subflowv1.StatePaused, Source: subflowv1.SourceSpec}, Revision: 1,
		Reporter: "a", Outcomes: []podOutcome{{Pod: "a", Status: stalledReport(stall)}}, Now: time.Now(), BacklogLeadTime: time.Hour}
}

// Ready stays True (the flow did what it was asked) and its message names the paused consumer,
// the starved ones, and the advice.
func TestKeySharedStallInReadyMessage(t *testing.T) {
	st := computeStatus(&subflowv1.SubscriptionFlow{}, stallObservation(true))
	ready := meta.FindStatusCondition(st.Conditions, subflowv1.ConditionReady)
	for _, want := range []string{"Key_Shared dispatch stalled on persistent://public/default/orders", "consumer a take no messages",
		"running consumers b, c and 10 more get none while 12478 entries wait", "holds 6000 entries",
		"pause every consumer of a Key_Shared subscription together", "Stopped"} {
		if ready == nil || !strings.Contains(ready.Message, want) {
			t.Fatalf("Ready = %+v, want its message to contain %q", ready, want)
		}
	}
	if ready.Status != "True" {
		t.Fatalf("Ready = %s, want True: the pause itself is applied", ready.Status)
	}
	st = computeStatus(&subflowv1.SubscriptionFlow{}, stallObservation(false))
	if ready := meta.FindStatusCondition(st.Conditions, subflowv1.ConditionReady); strings.Contains(ready.Message, keySharedStallNote) {
		t.Fatalf("no stall reported, yet Ready says %q", ready.Message)
	}
}

// The Warning event goes out once when the stall appears, not again while it lasts, and again
// after it ended and came back.
func TestKeySharedStalledEventOncePerTransition(t *testing.T) {
	rec := events.NewFakeRecorder(10)
	r := &SubscriptionFlowReconciler{Recorder: rec}
	clean := &subflowv1.SubscriptionFlow{Status: computeStatus(&subflowv1.SubscriptionFlow{}, stallObservation(false))}
	stalled := &subflowv1.SubscriptionFlow{Status: computeStatus(clean, stallObservation(true))}
	for _, step := range []struct {
		old, now *subflowv1.SubscriptionFlow
		want     int
	}{{clean, stalled, 1}, {stalled, stalled, 0}, {stalled, clean, 0}, {clean, stalled, 1}} {
		r.emitEvents(step.old, step.now)
		got := drainStallEvents(t, rec)
		if got != step.want {
			t.Fatalf("%d KeySharedStalled events, want %d", got, step.want)
		}
	}
}

func drainStallEvents(t *testing.T, rec *events.FakeRecorder) int {
	t.Helper()
	n := 0
	for {
		select {
		case e := <-rec.Events:
			if strings.Contains(e, "KeySharedStalled") {
				if !strings.HasPrefix(e, "Warning KeySharedStalled Key_Shared dispatch stalled on") {
					t.Fatalf("event %q", e)
				}
				n++
			}
		default:
			return n
		}
	}
}
