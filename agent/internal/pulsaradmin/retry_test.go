package pulsaradmin

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"syscall"
	"testing"
	"time"
)

// flakyAdmin answers the first `failures` requests with status, then serves resetcursor
// (checking its body) and getMessageIdByIndex.
type flakyAdmin struct {
	mu       sync.Mutex
	failures int
	status   int
	requests int
	bodies   []resetCursorData
}

func (f *flakyAdmin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.requests++
	fail := f.requests <= f.failures
	f.mu.Unlock()
	if fail {
		http.Error(w, `{"reason":"Topic is being unloaded"}`, f.status)
		return
	}
	if r.Method == http.MethodPost {
		var body resetCursorData
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		f.bodies = append(f.bodies, body)
		f.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
		return
	}
	_, _ = w.Write([]byte(`{"ledgerId":3,"entryId":7,"partitionIndex":-1}`))
}

func (f *flakyAdmin) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests
}

func flakyClient(t *testing.T, f *flakyAdmin) *Client {
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	a := New(srv.URL, srv.Client(), nil, nil)
	a.retryBackoff = time.Millisecond
	return a
}

// A broker answers 503 while a topic's ownership moves: the agent retries and the seek's
// calls succeed, a reset with its body intact.
func TestAdminRetriesTransientAnswers(t *testing.T) {
	for _, status := range []int{http.StatusServiceUnavailable, http.StatusTooManyRequests, http.StatusBadGateway, http.StatusGatewayTimeout} {
		f := &flakyAdmin{failures: 2, status: status}
		a := flakyClient(t, f)
		p, err := a.entryByIndex(context.Background(), testTopic, 5)
		if err != nil || p != (Position{Ledger: 3, Entry: 7}) || f.count() != 3 {
			t.Fatalf("status %d: entryByIndex = %v, %v after %d requests; want (3,7) after 3", status, p, err, f.count())
		}
		f = &flakyAdmin{failures: 2, status: status}
		a = flakyClient(t, f)
		if err := a.resetCursor(context.Background(), testTopic, "sub", Position{Ledger: 3, Entry: 7}, true); err != nil {
			t.Fatalf("status %d: resetCursor: %v", status, err)
		}
		want := resetCursorData{LedgerID: 3, EntryID: 7, PartitionIndex: -1, Excluded: true}
		if len(f.bodies) != 1 || f.bodies[0] != want {
			t.Fatalf("status %d: reset bodies %+v, want one %+v", status, f.bodies, want)
		}
	}
}

// A broker that keeps answering 503 fails the call after the retries, with its answer.
func TestAdminGivesUpAfterRetries(t *testing.T) {
	f := &flakyAdmin{failures: 1000, status: http.StatusServiceUnavailable}
	a := flakyClient(t, f)
	_, err := a.entryByIndex(context.Background(), testTopic, 5)
	var ae *adminError
	if !errors.As(err, &ae) || ae.Status != http.StatusServiceUnavailable || ae.Reason != "Topic is being unloaded" {
		t.Fatalf("err = %v, want the broker's 503 and its reason", err)
	}
	if f.count() != 1+adminRetries {
		t.Fatalf("%d requests, want %d", f.count(), 1+adminRetries)
	}
}

// A refusal is final: no retry.
func TestAdminDoesNotRetryRefusals(t *testing.T) {
	for _, status := range []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusPreconditionFailed, http.StatusInternalServerError} {
		f := &flakyAdmin{failures: 1000, status: status}
		a := flakyClient(t, f)
		if _, err := a.entryByIndex(context.Background(), testTopic, 5); err == nil {
			t.Fatalf("status %d: no error", status)
		}
		if f.count() != 1 {
			t.Fatalf("status %d: %d requests, want 1", status, f.count())
		}
	}
}

// The caller's deadline bounds the retries, and the error says what was being retried.
func TestAdminRetriesStopAtTheDeadline(t *testing.T) {
	f := &flakyAdmin{failures: 1000, status: http.StatusServiceUnavailable}
	a := flakyClient(t, f)
	a.retryBackoff = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := a.entryByIndex(ctx, testTopic, 5)
	var ae *adminError
	if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &ae) || ae.Status != http.StatusServiceUnavailable {
		t.Fatalf("err = %v, want the deadline and the 503 being retried", err)
	}
}

// A refused connection (a broker restarting) is retried.
func TestAdminRetriesARefusedConnection(t *testing.T) {
	srv := httptest.NewServer(&flakyAdmin{})
	defer srv.Close()
	var mu sync.Mutex
	refusals := 2
	var d net.Dialer
	transport := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		mu.Lock()
		defer mu.Unlock()
		if refusals > 0 {
			refusals--
			return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
		}
		return d.DialContext(ctx, network, addr)
	}}
	defer transport.CloseIdleConnections()
	a := New(srv.URL, &http.Client{Transport: transport}, nil, nil)
	a.retryBackoff = time.Millisecond
	p, err := a.entryByIndex(context.Background(), testTopic, 5)
	if err != nil || p != (Position{Ledger: 3, Entry: 7}) || refusals != 0 {
		t.Fatalf("entryByIndex = %v, %v with %d refusals left; want (3,7) after both", p, err, refusals)
	}
}
