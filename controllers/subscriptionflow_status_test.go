package controllers

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

func agentAnswer(states ...protocol.State) *protocol.FlowStatus {
	st := &protocol.FlowStatus{AppliedRevision: 3}
	for i, s := range states {
		st.Consumers = append(st.Consumers, protocol.ConsumerStatus{Name: "c" + string(rune('0'+i)), Topic: "orders", State: s})
	}
	return st
}

func TestComputeStatusConditions(t *testing.T) {
	paused := Effective{State: subflowv1.StatePaused, Source: subflowv1.SourceSpec}
	running := Effective{State: subflowv1.StateRunning, Source: subflowv1.SourceSpec}
	unauthorized := &AgentError{Status: 401, Reason: "Unauthorized", Message: "missing or wrong bearer token"}
	tooOld := &AgentError{Status: 422, Reason: protocol.ReasonAgentTooOld, ProtocolVersion: 2, MissingFeatures: []string{"seek.x", "state=Draining"}}
	full := &AgentError{Status: 409, Reason: protocol.ReasonTooManyFlows, ProtocolVersion: 2}
	tests := []struct {
		name          string
		eff           Effective
		outcomes      []podOutcome
		wantReady     string // "True/Reason" or "False/Reason"
		wantPaused    string
		wantPausedMsg string // part of the Paused message
		wantStalled   bool
		wantMessage   string // part of the Ready message
		wantHalted    string
		wantMatched   int32
		wantReachable int32
	}{
		{name: "all paused", eff: paused,
			outcomes:  []podOutcome{{Pod: "a", Status: agentAnswer(protocol.Paused, protocol.Paused)}, {Pod: "b", Status: agentAnswer(protocol.Paused)}},
			wantReady: "True/Synced", wantPaused: "True/ConsumersPaused", wantHalted: "3/3", wantMatched: 2, wantReachable: 2},
		{name: "stopped counts as paused", eff: Effective{State: subflowv1.StateStopped, Source: subflowv1.SourceWindow},
			outcomes:  []podOutcome{{Pod: "a", Status: agentAnswer(protocol.Stopped)}},
			wantReady: "True/Synced", wantPaused: "True/ConsumersPaused", wantHalted: "1/1", wantMatched: 1, wantReachable: 1},
		{name: "one consumer still running", eff: paused,
			outcomes:  []podOutcome{{Pod: "a", Status: agentAnswer(protocol.Paused, protocol.Running)}},
			wantReady: "False/ConsumersConverging", wantPaused: "False/PausePending", wantMessage: "a/c1 on orders (Running)",
			wantHalted: "1/2", wantMatched: 1, wantReachable: 1},
		{name: "one consumer still running, counted", eff: paused,
			outcomes:  []podOutcome{{Pod: "a", Status: agentAnswer(protocol.Paused, protocol.Running)}, {Pod: "b", Status: agentAnswer(protocol.Paused)}},
			wantReady: "False/ConsumersConverging", wantPaused: "False/PausePending", wantPausedMsg: "1 of 3 consumers still running",
			wantHalted: "2/3", wantMatched: 2, wantReachable: 2},
		{name: "unreachable agent is named", eff: paused,
			outcomes:  []podOutcome{{Pod: "a", Status: agentAnswer(protocol.Paused)}, {Pod: "b", Err: errors.New("connection refused")}},
			wantReady: "False/AgentsUnreachable", wantPaused: "False/PausePending", wantMessage: "b (connection refused)",
			wantPausedMsg: "0 of the 1 consumers in reachable pods still running; 1 pod unreachable, its consumers' state unknown: b",
			wantHalted:    "1/1", wantMatched: 2, wantReachable: 1},
		{name: "no agent answered", eff: paused,
			outcomes:  []podOutcome{{Pod: "a", Err: &noAnswer{}}, {Pod: "b", Err: errors.New("connection refused")}},
			wantReady: "False/AgentsUnreachable", wantPaused: "False/PausePending",
			wantPausedMsg: "No agent answered; 2 pods unreachable, their consumers' state unknown: a, b",
			wantHalted:    "0/0", wantMatched: 2},
		{name: "pod without IP", eff: running, outcomes: []podOutcome{{Pod: "new"}},
			wantReady: "False/AgentsUnreachable", wantPaused: "False/Running", wantMessage: "new (no pod IP yet)", wantHalted: "0/0", wantMatched: 1},
		{name: "wrong token stalls", eff: paused, outcomes: []podOutcome{{Pod: "a", Err: unauthorized}},
			wantReady: "False/AgentAuthFailed", wantPaused: "False/PausePending", wantStalled: true,
			wantMessage: "Agents in a refused the token from Secret", wantHalted: "0/0", wantMatched: 1},
		{name: "an agent too old: named, not paused", eff: paused,
			outcomes:  []podOutcome{{Pod: "a", Status: agentAnswer(protocol.Paused)}, {Pod: "b", Err: tooOld}},
			wantReady: "False/AgentTooOld", wantPaused: "False/PausePending",
			wantMessage:   "1 of 2 agents are too old for revision 3 and changed nothing: b (agent protocol 2 lacks seek.x, state=Draining); upgrade the application's agent or the sidecar image",
			wantPausedMsg: "0 of the 1 consumers in reachable pods still running; 1 pod refused revision 3, its consumers not known to be paused: b (AgentTooOld)",
			wantHalted:    "1/1", wantMatched: 2, wantReachable: 1},
		{name: "every agent refused: not paused, not a typo", eff: paused,
			outcomes:  []podOutcome{{Pod: "a", Err: full}, {Pod: "b", Err: tooOld}},
			wantReady: "False/AgentTooOld", wantPaused: "False/PausePending",
			wantPausedMsg: "No agent applied revision 3; 2 pods refused revision 3, their consumers not known to be paused: a (TooManyFlows), b (AgentTooOld)",
			wantHalted:    "0/0", wantMatched: 2},
		{name: "an agent full: named", eff: running,
			outcomes:  []podOutcome{{Pod: "a", Status: agentAnswer(protocol.Running)}, {Pod: "b", Err: full}},
			wantReady: "False/TooManyFlows", wantPaused: "False/Running",
			wantMessage: "1 of 2 agents hold as many flow rules as they may and refused this flow: b (the agent holds as many flow rules as it may); release another flow that selects the pod",
			wantHalted:  "0/1", wantMatched: 2, wantReachable: 1},
		{name: "unreachable before too old", eff: paused,
			outcomes:  []podOutcome{{Pod: "a", Err: errors.New("connection refused")}, {Pod: "b", Err: tooOld}},
			wantReady: "False/AgentsUnreachable", wantPaused: "False/PausePending", wantMessage: "1 of 2 agents unreachable: a (connection refused)",
			wantPausedMsg: "No agent applied revision 3; 1 pod unreachable, its consumers' state unknown: a; 1 pod refused revision 3, its consumers not known to be paused: b (AgentTooOld)",
			wantHalted:    "0/0", wantMatched: 2},
		{name: "no pods: nothing is paused", eff: paused, wantReady: "True/NoMatchingPods", wantPaused: "False/NoMatchingPods", wantHalted: "0/0"},
		{name: "a typo in the subscription: nothing is paused", eff: paused,
			outcomes: []podOutcome{{Pod: "a", Status: &protocol.FlowStatus{AppliedRevision: 3,
				OtherConsumers: []protocol.ConsumerRef{{Subscription: "ingest", Topic: "persistent://public/default/orders"}}}}},
			wantReady: "False/NoMatchingConsumers", wantPaused: "False/NoMatchingConsumers",
			wantMessage: `No consumer of subscription "ingset" in the 1 matched pods, so nothing is paused; their agents consume "ingest" on persistent://public/default/orders`,
			wantHalted:  "0/0", wantMatched: 1, wantReachable: 1},
		{name: "running", eff: running, outcomes: []podOutcome{{Pod: "a", Status: agentAnswer(protocol.Running)}},
			wantReady: "True/Synced", wantPaused: "False/Running", wantHalted: "0/1", wantMatched: 1, wantReachable: 1},
		{name: "another rule holds a consumer paused: never Ready", eff: running,
			outcomes:  []podOutcome{{Pod: "a", Status: agentAnswer(protocol.Paused)}},
			wantReady: "False/HeldByOtherRule", wantPaused: "False/Running", wantHalted: "1/1", wantMatched: 1, wantReachable: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			flow := &subflowv1.SubscriptionFlow{ObjectMeta: metav1.ObjectMeta{Generation: 4}, Spec: subflowv1.SubscriptionFlowSpec{Subscription: "ingset"}}
			st := computeStatus(flow, observation{Effective: tt.eff, Revision: 3, Outcomes: tt.outcomes, Now: time.Now(), TokenRef: "ns/t key token"})
			assertCondition(t, st, subflowv1.ConditionReady, tt.wantReady)
			assertCondition(t, st, subflowv1.ConditionPaused, tt.wantPaused)
			if got := meta.IsStatusConditionTrue(st.Conditions, subflowv1.ConditionStalled); got != tt.wantStalled {
				t.Errorf("Stalled = %v, want %v", got, tt.wantStalled)
			}
			reconciling := meta.FindStatusCondition(st.Conditions, subflowv1.ConditionReconciling)
			readyTrue := meta.IsStatusConditionTrue(st.Conditions, subflowv1.ConditionReady)
			if (reconciling != nil) == (readyTrue || tt.wantStalled) {
				t.Errorf("Reconciling present = %v with Ready %v and Stalled %v", reconciling != nil, readyTrue, tt.wantStalled)
			}
			if msg := meta.FindStatusCondition(st.Conditions, subflowv1.ConditionReady).Message; !strings.Contains(msg, tt.wantMessage) {
				t.Errorf("Ready message %q does not contain %q", msg, tt.wantMessage)
			}
			if msg := meta.FindStatusCondition(st.Conditions, subflowv1.ConditionPaused).Message; !strings.Contains(msg, tt.wantPausedMsg) {
				t.Errorf("Paused message %q does not contain %q", msg, tt.wantPausedMsg)
			}
			if st.Consumers.Halted != tt.wantHalted || st.Pods.Matched != tt.wantMatched || st.Pods.Synced != tt.wantReachable {
				t.Errorf("halted %s matched %d synced %d, want %s %d %d", st.Consumers.Halted, st.Pods.Matched, st.Pods.Synced,
					tt.wantHalted, tt.wantMatched, tt.wantReachable)
			}
			if st.ObservedGeneration != 4 || st.Revision != 3 {
				t.Errorf("observedGeneration %d revision %d", st.ObservedGeneration, st.Revision)
			}
		})
	}
}

// Agents' texts are not trusted to be short: 1000 agents each failing with its own 4 KiB body
// leave every condition message and agent entry bounded (the API refuses a condition message
// over 32768 bytes, and with it the whole status), and the aggregate says how many it left out.
func TestComputeStatusBoundsAgentTexts(t *testing.T) {
	var outcomes []podOutcome
	for i := range 1000 {
		body := fmt.Sprintf("pod %d: %s", i, strings.Repeat("é", 2048)) // 4 KiB, multi-byte runes
		outcomes = append(outcomes, podOutcome{Pod: fmt.Sprintf("pod-%04d", i), Err: &AgentError{Status: 500, Message: body}})
	}
	outcomes = append(outcomes, podOutcome{Pod: "conflicted", Status: &protocol.FlowStatus{Conflict: strings.Repeat("x", 65536),
		Consumers: []protocol.ConsumerStatus{{Name: strings.Repeat("n", 65536), Topic: "t", State: protocol.Running}}}})
	flow := &subflowv1.SubscriptionFlow{ObjectMeta: metav1.ObjectMeta{Generation: 2}}
	st := computeStatus(flow, observation{Effective: Effective{State: subflowv1.StatePaused, Source: subflowv1.SourceSpec},
		Revision: 1, Outcomes: outcomes, Now: time.Now()})
	for _, c := range st.Conditions {
		if len(c.Message) > maxConditionMessage || !utf8.ValidString(c.Message) {
			t.Errorf("%s message is %d bytes (valid UTF-8: %v)", c.Type, len(c.Message), utf8.ValidString(c.Message))
		}
	}
	ready := meta.FindStatusCondition(st.Conditions, subflowv1.ConditionReady)
	if !strings.Contains(ready.Message, "1000 of 1001 agents unreachable") || !strings.Contains(ready.Message, "and 990 more") {
		t.Errorf("Ready message does not count what it left out: %.300q", ready.Message)
	}
	if len(st.Agents) != maxAgentsListed {
		t.Errorf("%d agents listed, want %d", len(st.Agents), maxAgentsListed)
	}
	for _, a := range st.Agents {
		if len(a.Message) > maxAgentText || !utf8.ValidString(a.Message) {
			t.Errorf("agent %s message is %d bytes", a.Pod, len(a.Message))
		}
	}
}

func assertCondition(t *testing.T, st subflowv1.SubscriptionFlowStatus, condType, want string) {
	t.Helper()
	c := meta.FindStatusCondition(st.Conditions, condType)
	if c == nil {
		t.Errorf("%s missing, want %s", condType, want)
		return
	}
	if got := string(c.Status) + "/" + c.Reason; got != want {
		t.Errorf("%s = %s (%s), want %s", condType, got, c.Message, want)
	}
}

func TestComputeStatusSeek(t *testing.T) {
	index := int64(42)
	flow := &subflowv1.SubscriptionFlow{Spec: subflowv1.SubscriptionFlowSpec{Seek: &subflowv1.SeekSpec{ID: "s1", Index: &index}}}
	done := agentAnswer(protocol.Paused)
	done.Seek = &protocol.SeekStatus{ID: "s1", State: protocol.SeekSucceeded,
		Positions: []protocol.SeekPosition{{Partition: -1, Index: 42, MessageID: "7:3:-1:-1"}}}
	st := computeStatus(flow, observation{Effective: Effective{State: subflowv1.StatePaused}, Revision: 1, Executor: "a",
		Outcomes: []podOutcome{{Pod: "a", Status: done}}, Now: time.Now()})
	assertCondition(t, st, subflowv1.ConditionSeekCompleted, "True/SeekSucceeded")
	if st.Seek.CompletionTime == nil || len(st.Seek.Positions) != 1 || st.Seek.Positions[0].MessageID != "7:3:-1:-1" {
		t.Fatalf("seek status %+v", st.Seek)
	}

	failed := agentAnswer(protocol.Paused)
	failed.Seek = &protocol.SeekStatus{ID: "s1", State: protocol.SeekFailed, Reason: "IndexMetadataDisabled", Error: "enable brokerEntryMetadataInterceptors"}
	st = computeStatus(flow, observation{Effective: Effective{State: subflowv1.StatePaused}, Revision: 1, Executor: "a",
		Outcomes: []podOutcome{{Pod: "a", Status: failed}}, Now: time.Now()})
	assertCondition(t, st, subflowv1.ConditionSeekCompleted, "False/IndexMetadataDisabled")

	st = computeStatus(flow, observation{Effective: Effective{State: subflowv1.StatePaused}, Revision: 1, Now: time.Now()})
	assertCondition(t, st, subflowv1.ConditionSeekCompleted, "False/SeekPending")
}

// A failed seek's SeekCompleted reason is the executor's, and stays so at every later reconcile,
// also once the seek was dropped from the spec and added back (status.seek is all that is left
// of it then); an executor that gave no reason fails it with SeekFailed.
func TestFailedSeekKeepsTheExecutorsReason(t *testing.T) {
	index := int64(42)
	for agentReason, want := range map[string]string{
		protocol.SeekTimedOut:                 "SeekTimedOut",
		protocol.SeekNoConsumer:               "NoConsumer",
		subflowv1.ReasonIndexMetadataDisabled: "IndexMetadataDisabled",
		subflowv1.ReasonSeekFailed:            "SeekFailed",
		"SeekRefusedByAFutureBroker":          "SeekRefusedByAFutureBroker", // a newer agent's own
		"":                                    "SeekFailed",
		// A peer's reason that no condition can carry would make the whole status unwritable.
		"it broke!":             "SeekFailed",
		"Seek: failed":          "SeekFailed",
		strings.Repeat("A", 65): "SeekFailed",
	} {
		flow := &subflowv1.SubscriptionFlow{Spec: subflowv1.SubscriptionFlowSpec{Seek: &subflowv1.SeekSpec{ID: "s1", Index: &index}}}
		failed := agentAnswer(protocol.Paused)
		failed.Seek = &protocol.SeekStatus{ID: "s1", State: protocol.SeekFailed, Reason: agentReason, Error: "it broke: at 10:00"}
		obs := observation{Effective: Effective{State: subflowv1.StatePaused}, Revision: 1, Executor: "a",
			Outcomes: []podOutcome{{Pod: "a", Status: failed}}, Now: time.Now()}
		flow.Status = computeStatus(flow, obs)
		assertCondition(t, flow.Status, subflowv1.ConditionSeekCompleted, "False/"+want)
		if got, wantMessage := flow.Status.Seek.Message, want+": it broke: at 10:00"; got != wantMessage {
			t.Errorf("status.seek.message %q, want %q", got, wantMessage)
		}
		if flow.Status.Seek.Reason != want {
			t.Errorf("status.seek.reason %q, want %q", flow.Status.Seek.Reason, want)
		}
		later := observation{Effective: Effective{State: subflowv1.StatePaused}, Revision: 2, Now: time.Now()}
		flow.Status = computeStatus(flow, later)
		assertCondition(t, flow.Status, subflowv1.ConditionSeekCompleted, "False/"+want)
		seek := flow.Spec.Seek
		flow.Spec.Seek = nil
		flow.Status = computeStatus(flow, later)
		flow.Spec.Seek = seek
		flow.Status = computeStatus(flow, later)
		assertCondition(t, flow.Status, subflowv1.ConditionSeekCompleted, "False/"+want)
	}
}

// A failed seek an older controller recorded has no status.seek.reason, only "Reason: error" in
// the message and the reason in SeekCompleted: after the upgrade SeekCompleted keeps it.
func TestFailedSeekRecordedBeforeAnUpgradeKeepsItsReason(t *testing.T) {
	index := int64(42)
	done := metav1.Now()
	flow := &subflowv1.SubscriptionFlow{Spec: subflowv1.SubscriptionFlowSpec{Seek: &subflowv1.SeekSpec{ID: "s1", Index: &index}}}
	flow.Status.Seek = &subflowv1.SeekStatus{ID: "s1", Executor: "a", CompletionTime: &done, Message: "SeekTimedOut: no answer in 30s"}
	flow.Status.Conditions = []metav1.Condition{{Type: subflowv1.ConditionSeekCompleted, Status: metav1.ConditionFalse,
		Reason: protocol.SeekTimedOut, Message: "Seek s1 failed on a: SeekTimedOut: no answer in 30s"}}
	later := observation{Effective: Effective{State: subflowv1.StatePaused}, Revision: 2, Now: time.Now()}
	flow.Status = computeStatus(flow, later)
	assertCondition(t, flow.Status, subflowv1.ConditionSeekCompleted, "False/SeekTimedOut")

	// Without the condition (the seek was dropped from the spec and added back), the message is
	// not parsed for a reason: SeekFailed, and the message says the rest.
	flow.Status.Conditions = nil
	flow.Status = computeStatus(flow, later)
	assertCondition(t, flow.Status, subflowv1.ConditionSeekCompleted, "False/SeekFailed")
	if c := meta.FindStatusCondition(flow.Status.Conditions, subflowv1.ConditionSeekCompleted); !strings.Contains(c.Message, "SeekTimedOut: no answer in 30s") {
		t.Fatalf("SeekCompleted message %q", c.Message)
	}
}

// The seek s1 ran to index 42; the spec drops it, and later names s1 with index 43 (which
// admission cannot compare): the condition says it does not run again and what to do, and no
// agent is asked to execute it.
func TestSeekIDReusedWithAnotherTargetIsReportedNotRun(t *testing.T) {
	index, other := int64(42), int64(43)
	flow := &subflowv1.SubscriptionFlow{Spec: subflowv1.SubscriptionFlowSpec{Seek: &subflowv1.SeekSpec{ID: "s1", Index: &index}}}
	done := agentAnswer(protocol.Paused)
	done.Seek = &protocol.SeekStatus{ID: "s1", State: protocol.SeekSucceeded,
		Positions: []protocol.SeekPosition{{Partition: -1, Index: 42, MessageID: "7:3:-1:-1"}}}
	obs := observation{Effective: Effective{State: subflowv1.StatePaused}, Revision: 1, Executor: "a",
		Outcomes: []podOutcome{{Pod: "a", Status: done}}, Now: time.Now()}
	flow.Status = computeStatus(flow, obs)
	assertCondition(t, flow.Status, subflowv1.ConditionSeekCompleted, "True/SeekSucceeded")

	// Removed, reconciled, then added back with the old id and a new target.
	flow.Spec.Seek = nil
	flow.Status = computeStatus(flow, obs)
	if flow.Status.Seek == nil || flow.Status.Seek.ID != "s1" {
		t.Fatalf("the last seek is not kept once the spec drops it: %+v", flow.Status.Seek)
	}
	flow.Spec.Seek = &subflowv1.SeekSpec{ID: "s1", Index: &other}
	st := computeStatus(flow, obs)
	assertCondition(t, st, subflowv1.ConditionSeekCompleted, "False/SeekIDReused")
	if c := meta.FindStatusCondition(st.Conditions, subflowv1.ConditionSeekCompleted); !strings.Contains(c.Message, "give the new target a new seek.id") {
		t.Fatalf("message %q", c.Message)
	}
	if req := desiredRequest(flow, obs.Effective, 2, true); req.Seek.Execute {
		t.Fatal("the reused id is sent for execution")
	}
	flow.Spec.Seek = &subflowv1.SeekSpec{ID: "s1", Index: &index}
	assertCondition(t, computeStatus(flow, obs), subflowv1.ConditionSeekCompleted, "True/SeekSucceeded")
}

// A seek past the topic's end runs (the agent seeks to the latest entry and reports the index it
// resolved, not the one asked for): status keeps the index requested, and the same spec reads as
// the seek that ran at every later reconcile, not as its id reused for another target.
func TestSeekPastTheEndStaysSucceeded(t *testing.T) {
	index := int64(120034)
	flow := &subflowv1.SubscriptionFlow{Spec: subflowv1.SubscriptionFlowSpec{Seek: &subflowv1.SeekSpec{ID: "s1", Index: &index}}}
	done := agentAnswer(protocol.Paused)
	done.Seek = &protocol.SeekStatus{ID: "s1", State: protocol.SeekSucceeded,
		Positions: []protocol.SeekPosition{{Partition: -1, Index: 2133, MessageID: "11:2132:-1:1"}}}
	obs := observation{Effective: Effective{State: subflowv1.StatePaused}, Revision: 1, Executor: "a",
		Outcomes: []podOutcome{{Pod: "a", Status: done}}, Now: time.Now()}
	for range 2 { // the first reconcile records the seek, the next compares the spec with it
		flow.Status = computeStatus(flow, obs)
		assertCondition(t, flow.Status, subflowv1.ConditionSeekCompleted, "True/SeekSucceeded")
	}
	if p := flow.Status.Seek.Positions[0]; p.Index != 120034 || p.MessageID != "11:2132:-1:1" {
		t.Fatalf("position %+v, want the index requested and the message the cursor went to", p)
	}

	seek := &subflowv1.SeekSpec{ID: "s2", Partitions: []subflowv1.PartitionIndex{{Partition: 0, Index: 5}, {Partition: 1, Index: 1 << 40}}}
	flow = &subflowv1.SubscriptionFlow{Spec: subflowv1.SubscriptionFlowSpec{Seek: seek}}
	done.Seek = &protocol.SeekStatus{ID: "s2", State: protocol.SeekSucceeded, Positions: []protocol.SeekPosition{
		{Partition: 0, Index: 30, MessageID: "7:0:0:-1"}, {Partition: 1, Index: 61, MessageID: "9:1:1:3"}}}
	for range 2 {
		flow.Status = computeStatus(flow, obs)
		assertCondition(t, flow.Status, subflowv1.ConditionSeekCompleted, "True/SeekSucceeded")
	}
}

func TestReadyFlowIsCurrentForKstatus(t *testing.T) {
	flow := &subflowv1.SubscriptionFlow{
		TypeMeta:   metav1.TypeMeta{APIVersion: subflowv1.GroupVersion.String(), Kind: "SubscriptionFlow"},
		ObjectMeta: metav1.ObjectMeta{Name: "f", Namespace: "ns", Generation: 2},
	}
	flow.Status = computeStatus(flow, observation{Effective: Effective{State: subflowv1.StatePaused}, Revision: 1,
		Outcomes: []podOutcome{{Pod: "a", Status: agentAnswer(protocol.Paused)}}, Now: time.Now()})
	if got := kstatusOf(t, flow); got != status.CurrentStatus {
		t.Fatalf("kstatus of a Ready flow = %s, want Current", got)
	}
	flow.Status = computeStatus(flow, observation{Effective: Effective{State: subflowv1.StatePaused}, Revision: 1,
		Outcomes: []podOutcome{{Pod: "a", Err: errors.New("timeout")}}, Now: time.Now()})
	if got := kstatusOf(t, flow); got != status.InProgressStatus {
		t.Fatalf("kstatus of a converging flow = %s, want InProgress", got)
	}
	flow.Status = stalledStatus(flow, subflowv1.ReasonInvalidSpec, "bad window", time.Now())
	if got := kstatusOf(t, flow); got != status.FailedStatus {
		t.Fatalf("kstatus of a stalled flow = %s, want Failed", got)
	}
}

func kstatusOf(t *testing.T, flow *subflowv1.SubscriptionFlow) status.Status {
	t.Helper()
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(flow)
	if err != nil {
		t.Fatal(err)
	}
	res, err := status.Compute(&unstructured.Unstructured{Object: raw})
	if err != nil {
		t.Fatal(err)
	}
	return res.Status
}

// Every time in one status comes from the reconciler's clock: a condition that changes status
// is dated by it (not by the wall clock), one that keeps its status keeps its date.
func TestConditionTransitionsAreDatedByTheReconcilersClock(t *testing.T) {
	then := time.Date(2031, time.March, 30, 1, 30, 0, 0, time.UTC)
	paused := []podOutcome{{Pod: "a", Status: &protocol.FlowStatus{AppliedRevision: 1,
		Consumers: []protocol.ConsumerStatus{{Name: "c", Topic: "t", State: protocol.Paused}}}}}
	flow := &subflowv1.SubscriptionFlow{ObjectMeta: metav1.ObjectMeta{Generation: 1}}
	obs := observation{Effective: Effective{State: subflowv1.StatePaused, Source: subflowv1.SourceSpec}, Revision: 1,
		Outcomes: paused, Now: then}
	flow.Status = computeStatus(flow, obs)
	for _, c := range flow.Status.Conditions {
		if !c.LastTransitionTime.Time.Equal(then) {
			t.Errorf("%s=%s dated %s, want the reconciler's %s", c.Type, c.Status, c.LastTransitionTime, then)
		}
	}
	obs.Now = then.Add(time.Hour)
	obs.Outcomes = nil // the pod went away: Paused turns False, Ready stays False
	st := computeStatus(flow, obs)
	for _, c := range st.Conditions {
		old := meta.FindStatusCondition(flow.Status.Conditions, c.Type)
		want := then
		if old == nil || old.Status != c.Status {
			want = obs.Now
		}
		if !c.LastTransitionTime.Time.Equal(want) {
			t.Errorf("%s=%s dated %s, want %s", c.Type, c.Status, c.LastTransitionTime, want)
		}
	}
}

// A Ready reason longer than a condition message allows (rules held by a dozen orphaned
// flows, each named with its release command) leaves the notes after it whole: an expired
// override, and the Key_Shared stall whose event is found by its note's first words.
func TestReadyKeepsEveryNoteAfterALongReason(t *testing.T) {
	var outcomes []podOutcome
	orphaned := map[string]bool{}
	for i := range 12 {
		uid := fmt.Sprintf("uid-%02d", i)
		orphaned[uid] = true
		st := agentAnswer(protocol.Paused)
		st.HeldBy = []protocol.RuleRef{{Namespace: "ns", Name: fmt.Sprintf("%s-%02d", strings.Repeat("retained", 30), i), UID: uid, State: protocol.Paused}}
		outcomes = append(outcomes, podOutcome{Pod: fmt.Sprintf("pod-%02d", i), Status: st})
	}
	expired := "override subflow.dev/override-state=Paused expired at 2026-12-01T00:00:00Z and is ignored"
	st := computeStatus(&subflowv1.SubscriptionFlow{}, observation{
		Effective: Effective{State: subflowv1.StateRunning, Source: subflowv1.SourceSpec, Notes: []string{expired}},
		Revision:  1, Outcomes: outcomes, Now: time.Now(), Orphaned: orphaned, Selector: strings.Repeat("app=worker,", 30) + "tier=x",
		Reporter: "pod-00", BacklogLeadTime: time.Hour})
	ready := meta.FindStatusCondition(st.Conditions, subflowv1.ConditionReady)
	if ready.Reason != subflowv1.ReasonHeldByOtherRule || len(ready.Message) > maxConditionMessage || !utf8.ValidString(ready.Message) {
		t.Fatalf("Ready %s, %d bytes (valid UTF-8: %v)", ready.Reason, len(ready.Message), utf8.ValidString(ready.Message))
	}
	if !strings.HasSuffix(ready.Message, "; "+expired) {
		t.Fatalf("Ready's message does not end with the whole note: ...%q", ready.Message[len(ready.Message)-200:])
	}
	if !strings.Contains(ready.Message, "pod-00/c0 (Paused)") || !strings.Contains(ready.Message, "…") {
		t.Fatalf("Ready's reason is not kept from its beginning, clipped: %.200q", ready.Message)
	}
}

func TestFitKeepsEveryPartsBeginning(t *testing.T) {
	long, short := strings.Repeat("é", 400), "the key part"
	for _, c := range []struct {
		name  string
		parts []string
		want  []string // each part's beginning
	}{
		{"all fit", []string{"a", "", "b"}, []string{"a; b"}},
		{"a long first part leaves the second whole", []string{long, short}, []string{"éé", "…; " + short}},
		{"a long last part is clipped", []string{short, long}, []string{short + "; éé", "…"}},
		{"two long parts share the room", []string{"x" + long, "y" + long}, []string{"xé", "…; yé"}},
	} {
		got := fit(100, "; ", c.parts...)
		if len(got) > 100 || !utf8.ValidString(got) {
			t.Errorf("%s: %d bytes, valid UTF-8 %v", c.name, len(got), utf8.ValidString(got))
		}
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q does not contain %q", c.name, got, w)
			}
		}
	}
}

// Each pod's entry says what serves it - its agent's version and protocol (none reported: 1) -
// and, for an agent that refused the revision, why and what to do; the pods are counted as
// refused, neither synced nor unreachable.
func TestAgentsShowVersionsAndRefusals(t *testing.T) {
	long := strings.Repeat("v", 100)
	outcomes := []podOutcome{
		{Pod: "new", Status: &protocol.FlowStatus{Kind: protocol.KindSidecar, ProtocolVersion: 2, AgentVersion: "v0.9.0", AppliedRevision: 3,
			Consumers: []protocol.ConsumerStatus{{Name: "c", State: protocol.Paused}}}},
		{Pod: "old", Status: &protocol.FlowStatus{AppliedRevision: 3, Consumers: []protocol.ConsumerStatus{{Name: "c", State: protocol.Paused}}}},
		{Pod: "long", Status: &protocol.FlowStatus{AgentVersion: long, ProtocolVersion: 7, AppliedRevision: 3,
			Consumers: []protocol.ConsumerStatus{{Name: "c", State: protocol.Paused}}}},
		{Pod: "too-old", Err: &AgentError{Status: 422, Reason: protocol.ReasonAgentTooOld, ProtocolVersion: 2, MissingFeatures: []string{"seek.x"}}},
		{Pod: "full", Err: &AgentError{Status: 409, Reason: protocol.ReasonTooManyFlows}},
	}
	flow := &subflowv1.SubscriptionFlow{ObjectMeta: metav1.ObjectMeta{Generation: 1}}
	st := computeStatus(flow, observation{Effective: Effective{State: subflowv1.StatePaused, Source: subflowv1.SourceSpec},
		Revision: 3, Outcomes: outcomes, Now: time.Now()})
	want := map[string]subflowv1.AgentStatus{
		"new":  {Kind: "sidecar", State: "Paused", AgentVersion: "v0.9.0", ProtocolVersion: 2},
		"old":  {Kind: "agent", State: "Paused", ProtocolVersion: 1},
		"long": {Kind: "agent", State: "Paused", AgentVersion: clip(long, maxAgentVersion), ProtocolVersion: 7},
		"too-old": {State: "AgentTooOld", ProtocolVersion: 2,
			Message: "agent protocol 2 lacks seek.x: upgrade the application's agent or the sidecar image"},
		"full": {State: "TooManyFlows", ProtocolVersion: 1,
			Message: "the agent holds as many flow rules as it may: release another flow that selects the pod"},
	}
	for _, a := range st.Agents {
		w := want[a.Pod]
		if a.Kind != w.Kind || a.State != w.State || a.AgentVersion != w.AgentVersion || a.ProtocolVersion != w.ProtocolVersion || a.Message != w.Message {
			t.Errorf("%s: kind %q state %q version %q protocol %d message %q, want %q %q %q %d %q", a.Pod, a.Kind, a.State, a.AgentVersion,
				a.ProtocolVersion, a.Message, w.Kind, w.State, w.AgentVersion, w.ProtocolVersion, w.Message)
		}
	}
	if len(st.Agents[len(st.Agents)-1].AgentVersion) > maxAgentVersion {
		t.Error("an agent version longer than the CRD allows")
	}
	if st.Pods != (subflowv1.PodCounts{Matched: 5, Synced: 3, Refused: 2}) {
		t.Errorf("pods %+v, want 5 matched, 3 synced, 2 refused", st.Pods)
	}
	if got := (observation{Outcomes: outcomes}).agentStates(); got["AgentTooOld"] != 1 || got["TooManyFlows"] != 1 || got["Unreachable"] != 0 {
		t.Errorf("agent states for metrics: %v", got)
	}
}
