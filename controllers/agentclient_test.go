package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

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
