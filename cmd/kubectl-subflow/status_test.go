package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

func TestStatusShowsStateSourceSeekAndEachPod(t *testing.T) {
	ns := namespace(t, "status")
	until := time.Now().Add(29 * time.Minute).UTC().Truncate(time.Second)
	index := int64(120034)
	newFlow(t, ns, "orders", func(f *subflowv1.SubscriptionFlow) {
		f.Annotations[subflowv1.OverrideStateAnnotation] = "Paused"
		f.Annotations[subflowv1.OverrideUntilAnnotation] = until.Format(time.RFC3339)
		f.Annotations[subflowv1.OverrideReasonAnnotation] = "INC-4711"
		f.Spec.Topic = "persistent://shop/orders/events"
		f.Spec.Seek = &subflowv1.SeekSpec{ID: "replay-1", Index: &index}
	})
	synced := metav1.NewTime(time.Now().Add(-10 * time.Second))
	setStatus(t, ns, "orders", func(f *subflowv1.SubscriptionFlow) {
		f.Status = subflowv1.SubscriptionFlowStatus{
			ObservedGeneration: f.Generation, Revision: 4,
			EffectiveState: subflowv1.StatePaused, StateSource: subflowv1.SourceOverride,
			NextTransitionTime: &metav1.Time{Time: until},
			Pods:               subflowv1.PodCounts{Matched: 4, Synced: 2, Unreachable: 1, Refused: 1},
			Consumers:          subflowv1.ConsumerCounts{Total: 2, Paused: 2, Halted: "2/2"},
			Agents: []subflowv1.AgentStatus{
				{Pod: "orders-1", State: "Unreachable", Message: "dial tcp 10.0.0.7:9470: connect: connection refused\x1b[2J"},
				{Pod: "orders-2", State: "AgentTooOld", ProtocolVersion: 2,
					Message: "agent protocol 2 lacks seek.x: upgrade the application's agent or the sidecar image"},
				{Pod: "orders-0", Kind: "sidecar", AgentVersion: "v0.9.0", ProtocolVersion: 2, State: "Paused", Consumers: 2, HeldMessages: 17, LastSyncTime: &synced},
				{Pod: "orders-3", Kind: "agent", AgentVersion: "(devel) 3f2a1b", ProtocolVersion: 1, State: "Paused", Consumers: 1, LastSyncTime: &synced},
			},
			Seek: &subflowv1.SeekStatus{ID: "replay-1", Executor: "orders-0", CompletionTime: &synced,
				Positions: []subflowv1.SeekPosition{{Partition: -1, Index: 120034, MessageID: "12:5:-1:-1"}}},
			Conditions: []metav1.Condition{
				condition(subflowv1.ConditionSeekCompleted, metav1.ConditionTrue, subflowv1.ReasonSeekSucceeded, "Seek replay-1 done"),
				condition(subflowv1.ConditionPaused, metav1.ConditionTrue, subflowv1.ReasonConsumersPaused, "2 of 2 consumers halted"),
				condition(subflowv1.ConditionReady, metav1.ConditionFalse, subflowv1.ReasonAgentsUnreachable, "1 agent did not answer: orders-1"),
			},
		}
	})

	out := mustSucceed(t, "status", "orders", "-n", ns).stdout

	for _, want := range []string{
		"Name:            orders\n",
		"Topic:           persistent://shop/orders/events\n",
		"Desired state:   Running (spec.state)\n",
		"Override:        Paused until " + until.Format(time.RFC3339) + " (in 2",
		", reason: INC-4711\n",
		"Effective state: Paused (source: Override)\n",
		"Next transition: " + until.Format(time.RFC3339) + " (in 2",
		"Pods:            4 matched, 2 synced, 1 unreachable, 1 refused the flow\n",
		"Consumers:       2 total, 0 running, 2 paused, 0 stopped\n",
		"Seek:            id replay-1 (index 120034): Succeeded ",
		", executor orders-0\n",
		"                   topic: index 120034 -> message 12:5:-1:-1\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	// Conditions in the fixed order Ready, Paused, ..., SeekCompleted; pods as reported.
	for _, row := range []string{
		`(?m)^Conditions:\n  TYPE +STATUS +REASON +AGE +MESSAGE\n  Ready +False +AgentsUnreachable +5m\S* +1 agent did not answer: orders-1\n  Paused +True +ConsumersPaused +5m\S* .*\n  SeekCompleted +True +SeekSucceeded +5m\S* .*\n`,
		`(?m)^Agents:\n  POD +KIND +VERSION +PROTOCOL +STATE +CONSUMERS +HELD +LAST SYNC +MESSAGE\n` +
			`  orders-1 +- +- +- +Unreachable +0 +0 +<never> +dial tcp 10.0.0.7:9470: connect: connection refused \[2J\n` +
			`  orders-2 +- +- +2 +AgentTooOld +0 +0 +<never> +agent protocol 2 lacks seek.x: upgrade the application's agent or the sidecar image\n` +
			`  orders-0 +sidecar +v0.9.0 +2 +Paused +2 +17 +\d+s ago *\n` +
			`  orders-3 +agent +\(devel\)-3f2a1b +1 +Paused +1 +0 +\d+s ago *\n`,
	} {
		if !regexp.MustCompile(row).MatchString(out) {
			t.Errorf("status does not match %s:\n%s", row, out)
		}
	}
	if strings.ContainsRune(out, '\x1b') {
		t.Error("a pod's message sent a terminal control sequence through")
	}
}

func TestStatusExplainsAFailedSeekAndAStaleStatus(t *testing.T) {
	ns := namespace(t, "status-seek-failed")
	index := int64(7)
	newFlow(t, ns, "orders", func(f *subflowv1.SubscriptionFlow) {
		f.Spec.Seek = &subflowv1.SeekSpec{ID: "replay-2", Index: &index}
	})
	setStatus(t, ns, "orders", func(f *subflowv1.SubscriptionFlow) {
		f.Status.ObservedGeneration = f.Generation - 1
		f.Status.Seek = &subflowv1.SeekStatus{ID: "replay-2", Executor: "orders-0"}
		f.Status.Conditions = []metav1.Condition{condition(subflowv1.ConditionSeekCompleted, metav1.ConditionFalse,
			subflowv1.ReasonIndexMetadataDisabled, "broker stores no entry index: enable AppendIndexMetadataInterceptor")}
	})

	out := mustSucceed(t, "status", "orders", "-n", ns).stdout

	for _, want := range []string{
		"Override:        <none>\n",
		"Effective state: <not reported yet>\n",
		"Observed:        generation 0 of 1: the controller has not caught up yet\n",
		"Seek:            id replay-2 (index 7): Failed (IndexMetadataDisabled): broker stores no entry index: enable AppendIndexMetadataInterceptor, executor orders-0\n",
		"Agents:\n  <no pod matched>\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
}

func TestListLikeKubectlGet(t *testing.T) {
	a := namespace(t, "list-a")
	b := namespace(t, "list-b")
	empty := namespace(t, "list-empty")
	newFlow(t, a, "orders", func(f *subflowv1.SubscriptionFlow) { f.Spec.State = subflowv1.StatePaused })
	newFlow(t, a, "payments", nil)
	newFlow(t, b, "billing", nil)
	setStatus(t, a, "orders", func(f *subflowv1.SubscriptionFlow) {
		f.Status.EffectiveState, f.Status.StateSource = subflowv1.StateStopped, subflowv1.SourceOverride
		f.Status.Consumers.Halted = "3/3"
		f.Status.Conditions = []metav1.Condition{condition(subflowv1.ConditionReady, metav1.ConditionTrue, subflowv1.ReasonSynced, "")}
	})

	out := mustSucceed(t, "list", "-n", a).stdout
	want := `^NAME +STATE +EFFECTIVE +PAUSED +READY +SOURCE +AGE\n` +
		`orders +Paused +Stopped +3/3 +True +Override +\d+s\n` +
		`payments +Running +\d+s\n$`
	if !regexp.MustCompile(want).MatchString(out) {
		t.Errorf("list -n %s:\n%s\nwant to match %s", a, out, want)
	}

	out = mustSucceed(t, "list", "-A").stdout
	for _, row := range []string{`(?m)^NAMESPACE +NAME +STATE`, `(?m)^list-a +orders +Paused +Stopped`, `(?m)^list-a +payments +Running`, `(?m)^list-b +billing +Running`} {
		if !regexp.MustCompile(row).MatchString(out) {
			t.Errorf("list -A lacks %s:\n%s", row, out)
		}
	}

	if r := subflow("list", "-n", empty); r.code != 0 || r.stdout != "" || r.stderr != "No resources found in list-empty namespace.\n" {
		t.Errorf("empty namespace: %s", r)
	}
}

// A flow that paused itself: status says which condition holds, since when and what was seen,
// and which does not and why its last reading failed.
func TestStatusShowsWhyAFlowPausedItself(t *testing.T) {
	ns := namespace(t, "pausewhen")
	above := resource.MustParse("30")
	newFlow(t, ns, "guarded", func(f *subflowv1.SubscriptionFlow) {
		f.Spec.PauseWhen = []subflowv1.PauseCondition{
			{Name: "orders-db-down", Kubernetes: &subflowv1.ObjectConditionSource{APIVersion: "apps/v1", Kind: "Deployment",
				Name: "orders-db", ConditionType: "Available", Status: "False"}},
			{Name: "lag", Prometheus: &subflowv1.PrometheusSource{Query: "max(lag_seconds)", Above: &above}},
			{Name: "new", Kubernetes: &subflowv1.ObjectConditionSource{APIVersion: "apps/v1", Kind: "StatefulSet",
				Name: "cache", ConditionType: "Ready", Status: "False"}},
			{Name: "payments", HTTP: &subflowv1.HTTPSource{Service: subflowv1.HTTPServiceReference{Name: "payments",
				Port: intstr.FromString("http"), Path: "/ready"}}},
			{Name: "fast-lags", Backlog: &subflowv1.BacklogSource{Subscription: "orders-fast", Above: 10000}},
		}
	})
	since := metav1.NewTime(time.Now().Add(-30 * time.Minute)) // "30m": from 10 minutes on, a second late prints the same
	setStatus(t, ns, "guarded", func(f *subflowv1.SubscriptionFlow) {
		f.Status = subflowv1.SubscriptionFlowStatus{ObservedGeneration: f.Generation,
			EffectiveState: subflowv1.StatePaused, StateSource: subflowv1.SourceCondition,
			PauseWhen: []subflowv1.PauseConditionStatus{
				{Name: "orders-db-down", Holds: true, Since: &since, Seen: "Available=False"},
				{Name: "lag", Error: `query "max(lag_seconds)" returned 0 series, want 1`},
				{Name: "payments", Seen: "HTTP 200"},
				{Name: "fast-lags", Seen: "12 messages wait"},
			},
			Conditions: []metav1.Condition{condition(subflowv1.ConditionAutoPaused, metav1.ConditionTrue, subflowv1.ReasonConditionHolds,
				"condition orders-db-down holds: Available=False")},
		}
	})

	out := mustSucceed(t, "status", "guarded", "-n", ns).stdout
	for _, want := range []string{
		"Effective state: Paused (source: Condition)\n",
		"Pause when:      \n",
		"                 orders-db-down (Deployment orders-db Available=False): HOLDS since 30m ago, seen Available=False, read every 10s\n",
		`                 lag (max(lag_seconds) > 30): does not hold, last reading failed: query "max(lag_seconds)" returned 0 series, want 1, read every 10s` + "\n",
		"                 new (StatefulSet cache Ready=False): not evaluated yet\n",
		"                 payments (http Service payments:http/ready not 200-399): does not hold, seen HTTP 200, read every 10s\n",
		"                 fast-lags (backlog of orders-fast > 10000): does not hold, seen 12 messages wait, read every 10s\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`(?m)^  AutoPaused +True +ConditionHolds +\S+ +condition orders-db-down holds: Available=False$`).MatchString(out) {
		t.Errorf("the conditions do not show AutoPaused:\n%s", out)
	}
}

// A condition's since after this machine's clock (the controller's clock ahead) is printed as a
// time, not as kubectl's "<invalid>" age.
func TestSinceAheadOfThisClockIsATime(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	if got := sinceText(now.Add(-30*time.Minute), now); got != "30m ago" {
		t.Errorf("30 minutes before: %q, want 30m ago", got)
	}
	if got := sinceText(now.Add(90*time.Second), now); got != "2026-12-05T12:01:30Z" {
		t.Errorf("90 s ahead: %q, want the time itself", got)
	}
}
