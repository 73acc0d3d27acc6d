package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// startWait runs `wait` in the background; the returned function waits for its result.
func startWait(t *testing.T, args ...string) (stderr *testkit.LockedBuffer, finished func() result) {
	t.Helper()
	stderr = &testkit.LockedBuffer{}
	done := make(chan result, 1)
	go func() {
		var stdout bytes.Buffer
		code := run(append(args, "--kubeconfig", kubeconfig), &stdout, stderr)
		done <- result{stdout.String(), stderr.String(), code}
	}()
	return stderr, func() result {
		select {
		case r := <-done:
			return r
		case <-time.After(30 * time.Second):
			t.Fatal("wait did not return within 30s")
			return result{}
		}
	}
}

// pausedStatus is what the controller reports once every consumer halted.
func pausedStatus(state subflowv1.FlowState) func(*subflowv1.SubscriptionFlow) {
	return func(f *subflowv1.SubscriptionFlow) {
		f.Status.ObservedGeneration = f.Generation
		f.Status.EffectiveState, f.Status.StateSource = state, subflowv1.SourceOverride
		f.Status.Conditions = []metav1.Condition{
			condition(subflowv1.ConditionReady, metav1.ConditionTrue, subflowv1.ReasonSynced, ""),
			condition(subflowv1.ConditionPaused, metav1.ConditionTrue, subflowv1.ReasonConsumersPaused, "2 of 2 consumers halted"),
		}
	}
}

func runningStatus(ready metav1.ConditionStatus) func(*subflowv1.SubscriptionFlow) {
	return func(f *subflowv1.SubscriptionFlow) {
		f.Status.ObservedGeneration = f.Generation
		f.Status.EffectiveState, f.Status.StateSource = subflowv1.StateRunning, subflowv1.SourceSpec
		f.Status.Conditions = []metav1.Condition{
			condition(subflowv1.ConditionReady, ready, subflowv1.ReasonConsumersConverging, "1 of 2 consumers not yet running"),
			condition(subflowv1.ConditionPaused, metav1.ConditionFalse, subflowv1.ReasonRunning, "The effective state is Running"),
		}
	}
}

// pause then wait: the wait must not accept the status from before the override, and must
// return once the controller reports every consumer paused.
func TestWaitForPausedReturnsOnceReported(t *testing.T) {
	ns := namespace(t, "wait-paused")
	newFlow(t, ns, "orders", nil)
	setStatus(t, ns, "orders", runningStatus(metav1.ConditionTrue))
	mustSucceed(t, "pause", "orders", "--for", "30m", "-n", ns)

	stderr, finished := startWait(t, "wait", "orders", "--for", "paused", "-n", ns)
	want := "Waiting for subscriptionflow.subflow.dev/orders to be paused: the override asks for Paused, the effective state is Running\n"
	testkit.Eventually(t, 10*time.Second, "wait announced what it waits for", func() bool { return stderr.String() == want })

	setStatus(t, ns, "orders", pausedStatus(subflowv1.StatePaused))

	if r := finished(); r.code != 0 || r.stdout != "subscriptionflow.subflow.dev/orders condition met: paused\n" {
		t.Errorf("wait: %s", r)
	}
}

func TestWaitForRunningNeedsReady(t *testing.T) {
	ns := namespace(t, "wait-running")
	newFlow(t, ns, "orders", nil)
	setStatus(t, ns, "orders", runningStatus(metav1.ConditionFalse))

	stderr, finished := startWait(t, "wait", "orders", "--for", "running", "-n", ns)
	testkit.Eventually(t, 10*time.Second, "wait announced it", func() bool {
		return strings.Contains(stderr.String(), "to be running: Ready=False (ConsumersConverging): 1 of 2 consumers not yet running")
	})

	setStatus(t, ns, "orders", runningStatus(metav1.ConditionTrue))

	if r := finished(); r.code != 0 || r.stdout != "subscriptionflow.subflow.dev/orders condition met: running\n" {
		t.Errorf("wait: %s", r)
	}
}

func TestWaitTimesOutWithTheReason(t *testing.T) {
	ns := namespace(t, "wait-timeout")
	newFlow(t, ns, "orders", nil)
	// Paused=True but for an older generation: a spec change has not been seen yet.
	setStatus(t, ns, "orders", pausedStatus(subflowv1.StatePaused))
	flow := getFlow(t, ns, "orders")
	flow.Spec.State = subflowv1.StatePaused
	if err := k8s.Update(context.Background(), flow); err != nil {
		t.Fatal(err)
	}

	r := subflow("wait", "orders", "--for", "paused", "--timeout", "1s", "-n", ns)

	want := "error: timed out after 1s waiting for subscriptionflow.subflow.dev/orders to be paused: the status describes generation 1, the flow is at 2\n"
	if r.code != 1 || !strings.HasSuffix(r.stderr, want) || r.stdout != "" {
		t.Errorf("%s, want exit 1 and stderr ending %q", r, want)
	}
}

// A flow whose subscription matches no consumer (a typo) is never paused: wait does not
// succeed on the status the controller writes for it, and says why.
func TestWaitForPausedRefusesAFlowWithoutConsumers(t *testing.T) {
	ns := namespace(t, "wait-typo")
	newFlow(t, ns, "orders", nil)
	setStatus(t, ns, "orders", func(f *subflowv1.SubscriptionFlow) {
		f.Status.ObservedGeneration = f.Generation
		f.Status.EffectiveState, f.Status.StateSource = subflowv1.StatePaused, subflowv1.SourceSpec
		f.Status.Conditions = []metav1.Condition{
			condition(subflowv1.ConditionReady, metav1.ConditionFalse, subflowv1.ReasonNoMatchingConsumers,
				`No consumer of subscription "ingset" in the 2 matched pods, so nothing is paused; their agents consume "ingest" on orders`),
			condition(subflowv1.ConditionPaused, metav1.ConditionFalse, subflowv1.ReasonNoMatchingConsumers,
				"The matched pods have no consumer of the flow: none is paused"),
		}
	})

	r := subflow("wait", "orders", "--for", "paused", "--timeout", "1s", "-n", ns)

	want := "to be paused: Paused=False (NoMatchingConsumers): The matched pods have no consumer of the flow: none is paused\n"
	if r.code != 1 || !strings.HasSuffix(r.stderr, want) || r.stdout != "" {
		t.Errorf("%s, want exit 1 and stderr ending %q", r, want)
	}
}

func TestWaitFailsWhenTheFlowIsDeleted(t *testing.T) {
	ns := namespace(t, "wait-deleted")
	flow := newFlow(t, ns, "orders", nil)

	stderr, finished := startWait(t, "wait", "orders", "--for", "running", "-n", ns)
	testkit.Eventually(t, 10*time.Second, "wait started", func() bool { return stderr.String() != "" })
	if err := k8s.Delete(context.Background(), flow); err != nil {
		t.Fatal(err)
	}

	r := finished()
	if want := "error: subscriptionflow.subflow.dev/orders was deleted while waiting for it to be running\n"; r.code != 1 || !strings.HasSuffix(r.stderr, want) {
		t.Errorf("%s, want stderr ending %q", r, want)
	}
}

func TestWaitGoals(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	flow := func(override, until string, change func(*subflowv1.SubscriptionFlow)) *subflowv1.SubscriptionFlow {
		f := &subflowv1.SubscriptionFlow{ObjectMeta: metav1.ObjectMeta{Generation: 3, Annotations: map[string]string{}}}
		if override != "" {
			f.Annotations[subflowv1.OverrideStateAnnotation] = override
		}
		if until != "" {
			f.Annotations[subflowv1.OverrideUntilAnnotation] = until
		}
		f.Status.ObservedGeneration = 3
		change(f)
		return f
	}
	paused := func(state subflowv1.FlowState) func(*subflowv1.SubscriptionFlow) {
		return func(f *subflowv1.SubscriptionFlow) { pausedStatus(state)(f); f.Status.ObservedGeneration = 3 }
	}
	running := func(f *subflowv1.SubscriptionFlow) {
		runningStatus(metav1.ConditionTrue)(f)
		f.Status.ObservedGeneration = 3
	}
	tests := []struct {
		name   string
		goal   string
		flow   *subflowv1.SubscriptionFlow
		met    bool
		reason string
	}{
		{"paused by spec", "paused", flow("", "", paused(subflowv1.StatePaused)), true, ""},
		{"stopped counts as paused", "paused", flow("Stopped", "", paused(subflowv1.StateStopped)), true, ""},
		{"paused is not stopped", "stopped", flow("", "", paused(subflowv1.StatePaused)), false, "the effective state is Paused"},
		{"stop not yet applied", "paused", flow("Stopped", "", paused(subflowv1.StatePaused)), false, "the override asks for Stopped, the effective state is Paused"},
		{"override in any case", "paused", flow("paused", "", paused(subflowv1.StatePaused)), true, ""},
		{"expired override ignored", "running", flow("Paused", "2026-11-30T11:00:00Z", running), true, ""},
		{"override still in force", "running", flow("Paused", "2026-11-30T13:00:00Z", running), false, "the override asks for Paused"},
		{"paused condition pending", "paused", flow("", "", func(f *subflowv1.SubscriptionFlow) {
			paused(subflowv1.StatePaused)(f)
			f.Status.Conditions[1].Status, f.Status.Conditions[1].Reason = metav1.ConditionFalse, subflowv1.ReasonPausePending
		}), false, "Paused=False (PausePending)"},
		{"no status yet", "running", flow("", "", func(*subflowv1.SubscriptionFlow) {}), false, "the effective state is not reported"},
		{"running and ready", "running", flow("", "", running), true, ""},
		{"stale generation", "running", flow("", "", func(f *subflowv1.SubscriptionFlow) { running(f); f.Status.ObservedGeneration = 2 }),
			false, "the status describes generation 2, the flow is at 3"},
	}
	for _, tt := range tests {
		met, why := waitGoals[tt.goal](tt.flow, now)
		if met != tt.met || !strings.Contains(why, tt.reason) {
			t.Errorf("%s: met %v (%q), want %v (%q)", tt.name, met, why, tt.met, tt.reason)
		}
	}
}

// Ctrl-C ends a wait at once, saying it was interrupted (not that it timed out) and why the
// flow was not there yet.
func TestWaitInterruptedSaysSo(t *testing.T) {
	ns := namespace(t, "wait-interrupted")
	newFlow(t, ns, "orders", nil)
	setStatus(t, ns, "orders", runningStatus(metav1.ConditionTrue))
	ctx, interrupt := context.WithCancel(context.Background())
	defer interrupt()
	stderr := &testkit.LockedBuffer{}
	done := make(chan int, 1)
	go func() {
		var stdout bytes.Buffer
		done <- runContext(ctx, []string{"wait", "orders", "--for", "paused", "-n", ns, "--kubeconfig", kubeconfig}, &stdout, stderr)
	}()
	testkit.Eventually(t, 10*time.Second, "wait announced it", func() bool { return strings.Contains(stderr.String(), "Waiting for") })
	interrupt()

	select {
	case code := <-done:
		want := "error: interrupted while waiting for subscriptionflow.subflow.dev/orders to be paused: the effective state is Running\n"
		if code != 1 || !strings.HasSuffix(stderr.String(), want) {
			t.Errorf("exit %d, stderr %q, want 1 and stderr ending %q", code, stderr.String(), want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("wait did not end within 10s of Ctrl-C")
	}
}
