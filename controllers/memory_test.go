package controllers

import (
	"reflect"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/controllers/pausewhen"
)

// A flow that is gone leaves nothing in the controller's memory: whatever it was remembered
// for (holders, pushes and answers, a status write, a refresh, retries, pause conditions, a
// backlog reading, its paused series), and a push or status write of it that ends afterwards
// brings nothing back. The other flows keep theirs.
func TestForgetLeavesNothingOfTheFlow(t *testing.T) {
	r := &SubscriptionFlowReconciler{}
	now := time.Unix(1000, 0)
	gone := &subflowv1.SubscriptionFlow{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "gone", UID: "u1"},
		Spec: subflowv1.SubscriptionFlowSpec{Subscription: "s", PauseWhen: []subflowv1.PauseCondition{
			{Name: "other-backlog", Backlog: &subflowv1.BacklogSource{Subscription: "other", Above: 10}}}}}
	key := flowKey(gone)
	kept := types.NamespacedName{Namespace: "ns", Name: "kept"}

	r.memory.setHolders(gone, []string{"h"})
	s := subject(paused, podH)
	r.memory.start(pushKey{flow: key, pod: "h"}, s)
	r.memory.finish(pushKey{flow: key, pod: "h"}, s, answer(paused, protocol.Paused), true, now)
	r.memory.start(pushKey{flow: key, pod: "h"}, s) // in flight when the flow goes
	r.memory.writing(key)
	r.memory.setRefreshed(key, 10)
	r.memory.setRefreshed(kept, 5)
	r.memory.nextRetry(key)
	r.memory.tracker(gone, gone.Spec.PauseWhen[0])
	r.memory.keepBacklogFigures(gone, pausewhen.BacklogFigures{Missing: "x"})
	r.memory.swapPausedSeries(key, [2]string{"Paused", "Spec"})
	// Every book is filled: one added to flowMemory must be filled here too.
	f := reflect.ValueOf(*r.memory.flows[key])
	for i := range f.NumField() {
		if f.Field(i).IsZero() {
			t.Fatalf("the test leaves flowMemory.%s empty", f.Type().Field(i).Name)
		}
	}

	r.forget(key)
	r.memory.finish(pushKey{flow: key, pod: "h"}, s, answer(paused, protocol.Paused), true, now)
	r.memory.wrote(key, []string{"1"}, now)
	r.memory.ended(key)
	r.memory.setRefreshed(key, 0)
	if _, ok := r.memory.flows[key]; ok || len(r.memory.flows) != 1 {
		t.Fatalf("after forget, memory holds %d flows (the gone one: %v), want only the kept one", len(r.memory.flows), ok)
	}
	if got := r.memory.refreshedSum(); got != 5 {
		t.Fatalf("%d pods refreshed after forget, want the kept flow's 5", got)
	}
	if r.memory.holds(gone, "h") || r.memory.deferToWrite(key) || r.memory.nextRetry(key) != firstRetry {
		t.Fatal("a forgotten flow's holders, status write or retries are still known")
	}
}
