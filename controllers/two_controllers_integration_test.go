package controllers_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/controllers"
)

// statusLog records every status of one flow the API server stored, in order, from a watch.
type statusLog struct {
	mu  sync.Mutex
	all []subflowv1.SubscriptionFlowStatus
}

func watchStatus(t *testing.T, ns, name string) *statusLog {
	t.Helper()
	watcher, err := client.NewWithWatch(restConfig, client.Options{Scheme: k8s.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := watcher.Watch(context.Background(), &subflowv1.SubscriptionFlowList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	log := &statusLog{}
	go func() {
		for e := range w.ResultChan() {
			if f, ok := e.Object.(*subflowv1.SubscriptionFlow); ok && f.Name == name && e.Type != watch.Deleted {
				log.mu.Lock()
				log.all = append(log.all, *f.Status.DeepCopy())
				log.mu.Unlock()
			}
		}
	}()
	return log
}

// transitions counts, between consecutive stored statuses, the changes the controller announces:
// Paused turning True, and a paused flow running again.
func (l *statusLog) transitions() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	counts := map[string]int{}
	var before subflowv1.SubscriptionFlowStatus
	for _, st := range l.all {
		wasPaused := meta.IsStatusConditionTrue(before.Conditions, subflowv1.ConditionPaused)
		paused := meta.FindStatusCondition(st.Conditions, subflowv1.ConditionPaused)
		switch {
		case paused != nil && paused.Status == "True" && !wasPaused:
			counts["Paused"]++
		case paused != nil && paused.Reason == subflowv1.ReasonRunning && wasPaused:
			counts["Resumed"]++
		}
		before = st
	}
	return counts
}

// backwards returns the first step where revision or observedGeneration went down, or "".
func (l *statusLog) backwards() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := 1; i < len(l.all); i++ {
		a, b := l.all[i-1], l.all[i]
		if b.Revision < a.Revision || b.ObservedGeneration < a.ObservedGeneration {
			return fmt.Sprintf("write %d: revision %d -> %d, observedGeneration %d -> %d", i, a.Revision, b.Revision,
				a.ObservedGeneration, b.ObservedGeneration)
		}
	}
	return ""
}

// Two controllers at once (leader election turned off, or a lease lost while still running):
// across 30 spec changes in quick succession and six paced ones no stored status has a revision or
// observedGeneration lower than the one before it, and every transition the stored statuses
// show is announced by exactly one event.
func TestIntegrationTwoControllersNeverGoBackNorAnnounceTwice(t *testing.T) {
	ns := namespace(t, true)
	topic := "twins-" + ns
	startPod(t, ns, "worker-0", topic, testToken)
	limited := controllers.CacheOptions()
	limited.DefaultNamespaces = map[string]cache.Config{ns: {}}
	second, err := newController(k8s.Scheme(), limited)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { defer close(stopped); _ = second.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-stopped })

	log := watchStatus(t, ns, "twins")
	flow := newFlow(ns, "twins", topic, subflowv1.StatePaused)
	create(t, flow)
	waitFlow(t, flow, "Paused", func(f *subflowv1.SubscriptionFlow) bool { return isTrue(f, subflowv1.ConditionPaused) })
	for i := range 30 {
		state := []subflowv1.FlowState{subflowv1.StateRunning, subflowv1.StatePaused}[i%2]
		patchFlow(t, flow, fmt.Sprintf(`{"spec":{"state":%q}}`, state))
	}
	settled := func(state subflowv1.FlowState) func(f *subflowv1.SubscriptionFlow) bool {
		return func(f *subflowv1.SubscriptionFlow) bool {
			return current(f) && isTrue(f, subflowv1.ConditionReady) && f.Status.EffectiveState == state &&
				isTrue(f, subflowv1.ConditionPaused) == (state == subflowv1.StatePaused)
		}
	}
	waitFlow(t, flow, "settled Paused", settled(subflowv1.StatePaused))
	// Then transitions that each settle, so that both controllers race to store every one.
	for range 3 {
		for _, state := range []subflowv1.FlowState{subflowv1.StateRunning, subflowv1.StatePaused} {
			patchFlow(t, flow, fmt.Sprintf(`{"spec":{"state":%q}}`, state))
			waitFlow(t, flow, "settled "+string(state), settled(state))
		}
	}
	poke(t, flow)
	waitFlow(t, flow, "settled after a poke", settled(subflowv1.StatePaused))

	if step := log.backwards(); step != "" {
		t.Fatalf("the stored status went back at %s", step)
	}
	announced := func() string {
		want, got := log.transitions(), flowEvents(t, ns, "twins")
		if want["Paused"] == got["Paused"] && want["Resumed"] == got["Resumed"] {
			return ""
		}
		return fmt.Sprintf("stored transitions %v, events %v", want, got)
	}
	eventually(t, "one event per stored transition", func() bool { return announced() == "" }, announced)
	if want := log.transitions(); want["Paused"] < 4 {
		t.Fatalf("the flapping stored %v transitions: the test did not exercise two pauses", want)
	}
}
