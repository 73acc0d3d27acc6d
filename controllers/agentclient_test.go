package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
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
