package controllers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// Requests and answers far larger than a connection's buffers pass whole, on new and on reused
// connections alike.
func TestPushesLargerThanTheConnectionBuffers(t *testing.T) {
	var consumers []protocol.ConsumerStatus
	for i := range 500 {
		consumers = append(consumers, protocol.ConsumerStatus{Topic: fmt.Sprintf("persistent://public/default/t-%d", i),
			Subscription: "s", Name: fmt.Sprintf("consumer-%d", i), State: protocol.Paused})
	}
	answer, err := json.Marshal(protocol.FlowStatus{Pod: "p", AppliedRevision: 3, Consumers: consumers})
	if err != nil {
		t.Fatal(err)
	}
	longHeader := strings.Repeat("h", 4*agentBufferSize)
	var gotBody []int
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		gotBody = append(gotBody, len(body))
		w.Header().Set("X-Long", longHeader)
		_, _ = w.Write(answer)
	}))
	defer agent.Close()
	req := paused
	req.Subscription = strings.Repeat("s", 8*agentBufferSize)
	want, _ := json.Marshal(req)
	client := NewHTTPAgentClient(5*time.Second, nil)
	target := AgentTarget{Pod: "p", BaseURL: agent.URL, Token: "t", Namespace: "ns", Name: "f"}
	for range 3 {
		status, err := client.PutFlow(context.Background(), target, req)
		if err != nil {
			t.Fatal(err)
		}
		if len(status.Consumers) != len(consumers) || status.Consumers[499].Name != "consumer-499" {
			t.Fatalf("the answer came back with %d consumers, want %d", len(status.Consumers), len(consumers))
		}
	}
	for _, n := range gotBody {
		if n != len(want) {
			t.Fatalf("the agent read bodies of %v bytes, want %d each", gotBody, len(want))
		}
	}
}

// A flow larger than the idle pool does not keep its connections; a smaller one reuses them.
func TestConnectionsAreKeptOnlyForFlowsTheIdlePoolHolds(t *testing.T) {
	var mu sync.Mutex
	opened := 0
	agent := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(protocol.FlowStatus{Pod: "p"})
	}))
	agent.Config.ConnState = func(_ net.Conn, state http.ConnState) {
		if state == http.StateNew {
			mu.Lock()
			opened++
			mu.Unlock()
		}
	}
	agent.Start()
	defer agent.Close()
	client := NewHTTPAgentClient(5*time.Second, nil)
	for _, tc := range []struct {
		pods int
		want int
	}{{agentIdlePool, 1}, {agentIdlePool + 1, 3}} {
		mu.Lock()
		opened = 0
		mu.Unlock()
		client.HTTP.CloseIdleConnections()
		target := AgentTarget{Pod: "p", BaseURL: agent.URL, Token: "t", Namespace: "ns", Name: "f", Unpooled: !wantPooled(tc.pods)}
		for range 3 {
			if _, err := client.PutFlow(context.Background(), target, paused); err != nil {
				t.Fatal(err)
			}
		}
		mu.Lock()
		got := opened
		mu.Unlock()
		if got != tc.want {
			t.Errorf("a flow of %d pods opened %d connections for 3 pushes to one agent, want %d", tc.pods, got, tc.want)
		}
	}
}

// Every call tells the agent this controller's protocol version; a request that requires
// features names them, and one that requires none sends no Subflow-Requires header.
func TestCallsCarryTheProtocolVersionAndRequiredFeatures(t *testing.T) {
	var mu sync.Mutex
	var got []http.Header
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Clone())
		mu.Unlock()
		if r.Method == http.MethodDelete {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		_ = json.NewEncoder(w).Encode(protocol.FlowStatus{Pod: "p"})
	}))
	defer agent.Close()
	client := NewHTTPAgentClient(5*time.Second, nil)
	target := AgentTarget{Pod: "p", BaseURL: agent.URL, Token: "t", Namespace: "ns", Name: "f"}
	if _, err := client.PutFlow(context.Background(), target, paused); err != nil {
		t.Fatal(err)
	}
	if err := client.DeleteFlow(context.Background(), target, "uid-1"); err != nil {
		t.Fatal(err)
	}
	requires := []string{"seek.positions[].cursor", "state=Draining"}
	if err := client.do(context.Background(), http.MethodPut, target, target.flowURL(), []byte(`{}`), requires, nil); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 3 {
		t.Fatalf("the agent got %d calls, want 3", len(got))
	}
	for i, h := range got {
		if v := h.Get(protocol.VersionHeader); v != fmt.Sprint(protocol.Version) {
			t.Errorf("call %d: %s = %q, want %d", i, protocol.VersionHeader, v, protocol.Version)
		}
	}
	for i, h := range got[:2] {
		if v, ok := h[protocol.RequiresHeader]; ok {
			t.Errorf("call %d requires nothing but sent %s: %q", i, protocol.RequiresHeader, v)
		}
	}
	if v := got[2].Get(protocol.RequiresHeader); v != "seek.positions[].cursor,state=Draining" {
		t.Errorf("%s = %q, want the required features comma-separated", protocol.RequiresHeader, v)
	}
}

// An agent's AgentTooOld and TooManyFlows answers are told apart from other refusals, with
// the agent's protocol version and the features it lacks, bounded whatever it sends.
func TestRefusalsOfAWorkingAgentAreRead(t *testing.T) {
	var missing []string
	for i := range 30 {
		missing = append(missing, fmt.Sprintf("feature-%d-%s", i, strings.Repeat("é", 100)))
	}
	answers := map[string]struct {
		code int
		body protocol.Error
	}{
		"too-old":   {http.StatusUnprocessableEntity, protocol.Error{Reason: protocol.ReasonAgentTooOld, Message: "upgrade it", ProtocolVersion: 3, MissingFeatures: missing}},
		"full":      {http.StatusConflict, protocol.Error{Reason: protocol.ReasonTooManyFlows, Message: "release a flow first", ProtocolVersion: 2}},
		"stale-uid": {http.StatusConflict, protocol.Error{Reason: protocol.ReasonStaleUID, Message: "replaced"}},
	}
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a := answers[r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]]
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.code)
		_ = json.NewEncoder(w).Encode(a.body)
	}))
	defer agent.Close()
	client := NewHTTPAgentClient(5*time.Second, nil)
	push := func(name string) error {
		_, err := client.PutFlow(context.Background(), AgentTarget{Pod: "p", BaseURL: agent.URL, Token: "t", Namespace: "ns", Name: name}, paused)
		return err
	}

	err := push("too-old")
	var agentErr *AgentError
	if !IsAgentTooOld(err) || IsTooManyFlows(err) || !errors.As(err, &agentErr) {
		t.Fatalf("a 422 AgentTooOld read as %#v", err)
	}
	if agentErr.ProtocolVersion != 3 || len(agentErr.MissingFeatures) != protocol.MaxMissingFeatures {
		t.Errorf("protocol %d and %d missing features, want 3 and %d", agentErr.ProtocolVersion, len(agentErr.MissingFeatures), protocol.MaxMissingFeatures)
	}
	for _, f := range agentErr.MissingFeatures {
		if len(f) > maxFeatureName || !utf8.ValidString(f) || !strings.HasPrefix(f, "feature-") {
			t.Errorf("missing feature %q: want at most %d bytes of valid UTF-8, from its beginning", f, maxFeatureName)
		}
	}
	if err := push("full"); !IsTooManyFlows(err) || IsAgentTooOld(err) {
		t.Errorf("a 409 TooManyFlows read as %#v", err)
	}
	if err := push("stale-uid"); IsTooManyFlows(err) || IsAgentTooOld(err) || err == nil {
		t.Errorf("a 409 StaleUID read as a refusal of a working agent: %#v", err)
	}
}
