// Package fleetbench measures the controller at fleet scale: the controller runs as a process of
// its own (main.go's binary) against an envtest API server, and thousands of pods are simulated
// by fake agents that speak the real control protocol (agent/protocol) on loopback and record
// when they were told each state. The benchmarks are in fleet_test.go; docs/fleet-scale-findings.md
// says what they found.
package fleetbench

import (
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// Agent is one fake pod's agent. It holds one rule per flow, as the real rules book does: a
// lower revision of the same UID is refused, and each state change is timestamped.
type Agent struct {
	Name string
	IP   string
	Port int

	mu    sync.Mutex
	rules map[string]*rule // namespace/name
}

type rule struct {
	uid      string
	revision int64
	state    protocol.State
	since    time.Time // when the agent was first told the current state
	puts     int       // PUTs answered
	firstPut time.Time // the first PUT since ResetFirstPuts, for the full resync
}

// Told returns the state the agent was last told for a flow and when it was first told it.
func (a *Agent) Told(flow string) (protocol.State, time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r := a.rules[flow]; r != nil {
		return r.state, r.since
	}
	return "", time.Time{}
}

// FirstPut returns when the first PUT for a flow came since ResetFirstPuts; zero if none did.
func (a *Agent) FirstPut(flow string) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r := a.rules[flow]; r != nil {
		return r.firstPut
	}
	return time.Time{}
}

// ResetFirstPuts forgets every rule's first PUT, before a resync is timed.
func (a *Agent) ResetFirstPuts() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, r := range a.rules {
		r.firstPut = time.Time{}
	}
}

// Fleet serves many fake agents from one http.Server: each agent has a listener of its own on a
// distinct loopback address (127.1.x.y, one port for all, as pods share the agent port), and the
// handler finds the agent by the address the connection reached.
type Fleet struct {
	Token  string
	Agents []*Agent

	srv     *http.Server
	byAddr  map[string]*Agent
	lns     []net.Listener
	hanging []net.Listener
	wg      sync.WaitGroup
}

// loopbackIP is the i-th address of 127.1.0.0/16 (the whole of 127/8 is local on Linux), so that
// ten thousand listeners need no ephemeral ports of their own.
func loopbackIP(i int) string {
	return fmt.Sprintf("127.1.%d.%d", i/250, i%250+1)
}

// StartFleet starts n fake agents named prefix-NNNNN. The first listener picks the port; the
// others bind the same port on their own address.
func StartFleet(token, prefix string, n int) (*Fleet, error) {
	f := &Fleet{Token: token, byAddr: make(map[string]*Agent, n)}
	f.srv = &http.Server{Handler: http.HandlerFunc(f.serve), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 60 * time.Second}
	port := 0
	for i := range n {
		ln, err := net.Listen("tcp", net.JoinHostPort(loopbackIP(i), fmt.Sprint(port)))
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("fake agent %d: %w", i, err)
		}
		port = ln.Addr().(*net.TCPAddr).Port
		a := &Agent{Name: fmt.Sprintf("%s-%05d", prefix, i), IP: loopbackIP(i), Port: port, rules: map[string]*rule{}}
		f.Agents = append(f.Agents, a)
		f.byAddr[ln.Addr().String()] = a
		f.lns = append(f.lns, ln)
	}
	for _, ln := range f.lns {
		f.wg.Add(1)
		go func() { defer f.wg.Done(); _ = f.srv.Serve(ln) }()
	}
	return f, nil
}

// StartHanging starts a listener that accepts connections and never answers, as a wedged pod
// does; it returns its port on 127.0.0.1.
func (f *Fleet) StartHanging() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	f.hanging = append(f.hanging, ln)
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, conn); conn.Close() }() // held until the client gives up
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Close stops every listener and connection.
func (f *Fleet) Close() {
	_ = f.srv.Close()
	for _, ln := range append(f.lns, f.hanging...) {
		_ = ln.Close()
	}
	f.wg.Wait()
}

func (f *Fleet) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/healthz" {
		_, _ = io.WriteString(w, "ok")
		return
	}
	local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	a := f.byAddr[fmt.Sprint(local)]
	if a == nil {
		fail(w, http.StatusNotFound, protocol.ReasonNotFound, "no agent at this address")
		return
	}
	auth := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	if subtle.ConstantTimeCompare([]byte(auth), []byte(f.Token)) != 1 {
		w.Header().Set("Connection", "close")
		fail(w, http.StatusUnauthorized, protocol.ReasonUnauthorized, "bad token")
		return
	}
	flow, ok := strings.CutPrefix(r.URL.Path, protocol.PathPrefix+"/flows/")
	switch {
	case r.URL.Path == protocol.PathPrefix+"/state" && r.Method == http.MethodGet:
		a.state(w)
	case !ok || strings.Count(flow, "/") != 1:
		fail(w, http.StatusNotFound, protocol.ReasonNotFound, "no such endpoint")
	case r.Method == http.MethodPut:
		a.put(w, r, flow)
	case r.Method == http.MethodDelete:
		a.delete(w, r, flow)
	default:
		fail(w, http.StatusMethodNotAllowed, protocol.ReasonBadRequest, "method not allowed")
	}
}

// put applies a FlowRequest and answers the FlowStatus a real agent with one matched, connected
// consumer would: the consumer is in the requested state at once.
func (a *Agent) put(w http.ResponseWriter, r *http.Request, flow string) {
	var req protocol.FlowRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&req); err != nil || req.UID == "" || req.Revision < 1 || !req.State.Valid() {
		fail(w, http.StatusBadRequest, protocol.ReasonBadRequest, fmt.Sprintf("bad request: %v", err))
		return
	}
	now := time.Now()
	a.mu.Lock()
	cur := a.rules[flow]
	if cur != nil && cur.uid == req.UID && req.Revision < cur.revision {
		rev := cur.revision
		a.mu.Unlock()
		writeJSON(w, http.StatusConflict, protocol.Error{Reason: protocol.ReasonStaleRevision, Message: "stale revision", AppliedRevision: rev})
		return
	}
	if cur == nil || cur.uid != req.UID {
		cur = &rule{uid: req.UID}
		a.rules[flow] = cur
	}
	if cur.state != req.State {
		cur.state, cur.since = req.State, now
	}
	cur.revision, cur.puts = req.Revision, cur.puts+1
	if cur.firstPut.IsZero() {
		cur.firstPut = now
	}
	since := cur.since
	a.mu.Unlock()
	topic := req.Topic
	if topic == "" {
		topic = "persistent://public/default/fleet"
	}
	writeJSON(w, http.StatusOK, protocol.FlowStatus{Pod: a.Name, AppliedRevision: req.Revision, Consumers: []protocol.ConsumerStatus{{
		Topic: topic, Subscription: req.Subscription, Name: a.Name, State: req.State, Since: since, Connected: true}}})
}

func (a *Agent) delete(w http.ResponseWriter, r *http.Request, flow string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	cur := a.rules[flow]
	switch {
	case cur == nil:
		fail(w, http.StatusNotFound, protocol.ReasonNotFound, "no rule")
	case cur.uid != r.URL.Query().Get("uid"):
		fail(w, http.StatusConflict, protocol.ReasonUIDMismatch, "another uid")
	default:
		delete(a.rules, flow)
		w.WriteHeader(http.StatusNoContent)
	}
}

func (a *Agent) state(w http.ResponseWriter) {
	a.mu.Lock()
	st := protocol.AgentState{Pod: a.Name}
	for key, r := range a.rules {
		ns, name, _ := strings.Cut(key, "/")
		st.Flows = append(st.Flows, protocol.FlowSummary{Namespace: ns, Name: name, UID: r.uid, AppliedRevision: r.revision, State: r.state})
	}
	a.mu.Unlock()
	writeJSON(w, http.StatusOK, st)
}

func fail(w http.ResponseWriter, status int, reason, msg string) {
	writeJSON(w, status, protocol.Error{Reason: reason, Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
