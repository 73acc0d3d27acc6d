package controllers_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// refuse answers every push as an agent that works but refuses the flow would.
func refuse(code int, e protocol.Error) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(e)
	}
}

// A paused flow over three pods: one whose agent applies it (an old agent that reports no
// protocol version, with its build's version), one too old for what the request requires
// (422 AgentTooOld) and one holding as many flow rules as it may (409 TooManyFlows). The
// status names each refusing pod with why and what to do, Ready says so, Paused is not True,
// the refusing pods are not pushed to again at every retry, and every push carried this
// controller's protocol version.
func TestIntegrationAgentsThatRefuseTheFlowAreReportedNotRetried(t *testing.T) {
	const window = 8 * time.Second // the retries at 1, 2 and 4 s, within the refresh period
	ns := namespace(t, true)
	var mu sync.Mutex
	var versions []string
	applies := startBrokenAgent(t, ns, "worker-0", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		versions = append(versions, r.Header.Get(protocol.VersionHeader))
		mu.Unlock()
		var req protocol.FlowRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		_ = json.NewEncoder(w).Encode(protocol.FlowStatus{Pod: "worker-0", AgentVersion: "v0.9.0-skew", AppliedRevision: req.Revision,
			Consumers: []protocol.ConsumerStatus{{Topic: "t", Subscription: req.Subscription, Name: "c0", State: req.State, Connected: true}}})
	})
	tooOld := startBrokenAgent(t, ns, "worker-1", refuse(http.StatusUnprocessableEntity, protocol.Error{Reason: protocol.ReasonAgentTooOld,
		Message: "upgrade it", ProtocolVersion: 2, MissingFeatures: []string{"seek.positions[].cursor"}}))
	full := startBrokenAgent(t, ns, "worker-2", refuse(http.StatusConflict, protocol.Error{Reason: protocol.ReasonTooManyFlows,
		Message: "release a flow first", ProtocolVersion: 2}))
	flow := newFlow(ns, "orders", "", subflowv1.StatePaused)
	create(t, flow)

	agent := func(f *subflowv1.SubscriptionFlow, pod string) subflowv1.AgentStatus {
		i := slices.IndexFunc(f.Status.Agents, func(a subflowv1.AgentStatus) bool { return a.Pod == pod })
		if i < 0 {
			return subflowv1.AgentStatus{}
		}
		return f.Status.Agents[i]
	}
	waitFlow(t, flow, "the refusing pods named", func(f *subflowv1.SubscriptionFlow) bool {
		ready := condition(f, subflowv1.ConditionReady)
		return current(f) && ready != nil && ready.Reason == subflowv1.ReasonAgentTooOld &&
			ready.Message == "1 of 3 agents are too old for revision 1 and changed nothing: worker-1 (agent protocol 2 lacks "+
				"seek.positions[].cursor); upgrade the application's agent or the sidecar image" &&
			agent(f, "worker-1") == subflowv1.AgentStatus{Pod: "worker-1", State: "AgentTooOld", ProtocolVersion: 2,
				Message: "agent protocol 2 lacks seek.positions[].cursor: upgrade the application's agent or the sidecar image"} &&
			agent(f, "worker-2") == subflowv1.AgentStatus{Pod: "worker-2", State: "TooManyFlows", ProtocolVersion: 2,
				Message: "the agent holds as many flow rules as it may: release another flow that selects the pod"} &&
			f.Status.Pods == subflowv1.PodCounts{Matched: 3, Synced: 1, Refused: 2}
	})
	eventuallyWithin(t, window+5*time.Second, "the window to pass", func() bool {
		return time.Since(tooOld.first()) > window && time.Since(full.first()) > window
	})
	for _, a := range []*brokenAgent{tooOld, full} {
		n, offsets := a.requests(window)
		if n > 2 {
			t.Errorf("%s, which refused the flow, got %d pushes within %s of its first, want at most 2: %v", a.name, n, window, offsets)
		}
		t.Logf("%s: %d pushes within %s of its first: %v", a.name, n, window, offsets)
	}

	f := getFlow(t, flow)
	paused := condition(f, subflowv1.ConditionPaused)
	if paused == nil || paused.Status == "True" || paused.Reason != subflowv1.ReasonPausePending {
		t.Errorf("Paused = %+v, want False PausePending: two pods' agents refused the pause", paused)
	}
	if a := agent(f, "worker-0"); a.AgentVersion != "v0.9.0-skew" || a.ProtocolVersion != 1 || a.State != "Paused" {
		t.Errorf("the applying pod's entry %+v, want version v0.9.0-skew, protocol 1 (it reported none), Paused", a)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, v := range versions {
		if v != fmt.Sprint(protocol.Version) {
			t.Errorf("a push carried %s %q, want %d", protocol.VersionHeader, v, protocol.Version)
		}
	}
	if len(versions) == 0 || applies.total() == 0 {
		t.Error("the applying agent was never pushed to")
	}
}
