package control

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/subflow-dev/subflow/agent"
	"github.com/subflow-dev/subflow/agent/protocol"
)

// acceptor accepts from l for the whole test.
func acceptor(t *testing.T, l *limitListener) <-chan net.Conn {
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	return accepted
}

// dialLimited connects and returns the server side, or nil when nothing was accepted within wait.
func dialLimited(t *testing.T, l *limitListener, accepted <-chan net.Conn, wait time.Duration) (client net.Conn, server *limitedConn) {
	t.Helper()
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	select {
	case c := <-accepted:
		return client, c.(*limitedConn)
	case <-time.After(wait):
		return client, nil
	}
}

// closedByServer reports whether the server side closed the connection.
func closedByServer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err := c.Read(make([]byte, 1))
	return err == io.EOF || (err != nil && !strings.Contains(err.Error(), "timeout"))
}

func TestLimitListenerEvictsTheOldestUnauthenticated(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newLimitListener(inner, 3)
	defer l.Close()
	accepted := acceptor(t, l)
	const wait = 5 * time.Second
	oldUntrusted, _ := dialLimited(t, l, accepted, wait)
	_, trusted := dialLimited(t, l, accepted, wait)
	trusted.trusted.Store(true)
	youngUntrusted, youngServer := dialLimited(t, l, accepted, wait)
	// Full: a newcomer evicts the oldest connection that has not authenticated.
	_, newcomer := dialLimited(t, l, accepted, wait)
	if newcomer == nil {
		t.Fatal("a newcomer was refused while unauthenticated connections were open")
	}
	if !closedByServer(oldUntrusted) {
		t.Fatal("the oldest unauthenticated connection was not evicted")
	}
	if got := l.open(); got != 3 {
		t.Fatalf("%d connections open, want the cap of 3", got)
	}
	// The oldest unauthenticated one left is young: it keeps its slot for the grace period.
	newcomer.trusted.Store(true)
	_, second := dialLimited(t, l, accepted, wait)
	if second == nil {
		t.Fatal("the young unauthenticated connection was not evicted for a newcomer")
	}
	if waited := time.Since(youngServer.accepted); waited < evictionGrace {
		t.Fatalf("a connection %s old was evicted, before its grace of %s", waited, evictionGrace)
	}
	if !closedByServer(youngUntrusted) {
		t.Fatal("young unauthenticated connection still open")
	}
	second.trusted.Store(true)
	refused, none := dialLimited(t, l, accepted, 200*time.Millisecond)
	if none != nil || !closedByServer(refused) {
		t.Fatal("a newcomer got a slot while every open connection had authenticated")
	}
	// A closed connection frees its slot.
	_ = trusted.Close()
	if _, again := dialLimited(t, l, accepted, wait); again == nil {
		t.Fatal("the slot of a closed connection was not freed")
	}
}

// Seek records stay bounded: those of rules held, plus a short history; a released rule's
// records leave the live set.
func TestSeekRecordsAreBounded(t *testing.T) {
	a, err := agent.New(agent.Options{Name: "pod-a"})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(a, Options{Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	do := func(method, path, body string) int {
		req, _ := http.NewRequest(method, ts.URL+protocol.PathPrefix+"/flows/"+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer t")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	seek := func(flow, uid string, revision int, id string) {
		body := fmt.Sprintf(`{"uid":%q,"revision":%d,"subscription":"s","state":"Running","seek":{"id":%q,"index":1,"execute":true}}`, uid, revision, id)
		if code := do(http.MethodPut, "ns/"+flow, body); code != http.StatusOK {
			t.Fatalf("push: %d", code)
		}
	}
	// One flow whose seek id changes 200 times.
	for i := range 200 {
		seek("f", "u", i+1, fmt.Sprintf("s%d", i))
	}
	if got := srv.rules.seekCount(); got > 1+seekHistory {
		t.Fatalf("%d seek records for one flow, want at most %d", got, 1+seekHistory)
	}
	// 100 flows created and released.
	for i := range 100 {
		flow := fmt.Sprintf("g%d", i)
		seek(flow, flow, 1, "s")
		if code := do(http.MethodDelete, "ns/"+flow+"?uid="+flow, ""); code != http.StatusNoContent {
			t.Fatalf("delete: %d", code)
		}
	}
	if got := srv.rules.seekCount(); got > 1+seekHistory {
		t.Fatalf("%d seek records after releasing 100 flows, want at most %d", got, 1+seekHistory)
	}
	// 100 recreations of one flow (a new uid each time) retire uids, bounded too.
	for i := range 100 {
		seek("h", fmt.Sprintf("h%d", i), 1, "s")
	}
	if got := srv.rules.seekCount(); got > 2+seekHistory {
		t.Fatalf("%d seek records after 100 recreations, want at most %d", got, 2+seekHistory)
	}
}

// Tombstones are bounded, the oldest release forgotten first: its older revisions are accepted
// again, as before tombstones, while later releases still fence theirs. Releasing one flow
// again and again keeps one tombstone.
func TestTombstonesAreBounded(t *testing.T) {
	a, err := agent.New(agent.Options{Name: "pod-a"})
	if err != nil {
		t.Fatal(err)
	}
	rs := newRules(AgentHost(a), logr.Discard(), time.Minute, tombstonesPerAgent+10)
	rule := func(flow string, revision int64) *rule {
		return newRule("ns", flow, protocol.FlowRequest{UID: "u-" + flow, Revision: revision, Subscription: "s", State: protocol.Paused})
	}
	putAndRelease := func(flow string) {
		t.Helper()
		if err := rs.put(rule(flow, 5)); err != nil {
			t.Fatal(err)
		}
		if _, err := rs.remove("ns/"+flow, "u-"+flow); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		putAndRelease("again")
	}
	if len(rs.tombstones) != 1 || len(rs.tombOrder) != 1 {
		t.Fatalf("%d tombstones, %d in line after releasing one flow three times, want 1", len(rs.tombstones), len(rs.tombOrder))
	}
	for i := range tombstonesPerAgent {
		putAndRelease(fmt.Sprint("f", i))
	}
	if len(rs.tombstones) != tombstonesPerAgent || len(rs.tombOrder) != tombstonesPerAgent {
		t.Fatalf("%d tombstones, %d in line, want %d", len(rs.tombstones), len(rs.tombOrder), tombstonesPerAgent)
	}
	if err := rs.put(rule("again", 2)); err != nil {
		t.Fatalf("the oldest release is still fenced after %d others: %v", tombstonesPerAgent, err)
	}
	var stale *errStale
	if err := rs.put(rule("f1", 2)); !errors.As(err, &stale) {
		t.Fatalf("a recent release is not fenced: %v", err)
	}
}
