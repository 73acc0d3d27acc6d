package pulsaradmin

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
)

// owner answers like the broker that owns the topic: internal stats, only with credentials.
func owner(t *testing.T, seen *atomic.Value, calls *atomic.Int64) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		seen.Store(r.Header.Get("Authorization"))
		if r.Header.Get("Authorization") != "Bearer app-token" {
			http.Error(w, `{"reason":"unauthorized"}`, http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte(`{"currentLedgerEntries":3,"ledgers":[{"ledgerId":7,"entries":0}]}`))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// redirector answers every call with 307 to target, as a broker that does not own the topic.
func redirector(t *testing.T, target string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target+r.URL.RequestURI(), http.StatusTemporaryRedirect)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// localhostURL names a test server by "localhost", so that a redirect to 127.0.0.1 goes to
// another host as far as net/http is concerned.
func localhostURL(t *testing.T, srv *httptest.Server) string {
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return "http://localhost:" + u.Port()
}

func bearer(r *http.Request) error {
	r.Header.Set("Authorization", "Bearer app-token")
	return nil
}

func TestAdminFollowsRedirectToTrustedOwnerWithCredentials(t *testing.T) {
	var seen atomic.Value
	var calls atomic.Int64
	own := owner(t, &seen, &calls)
	front := redirector(t, own.URL) // own.URL is http://127.0.0.1:port
	a := New(localhostURL(t, front), nil, bearer, []string{"127.0.0.1"})
	spans, err := a.ledgers(context.Background(), "persistent://public/default/t")
	if err != nil {
		t.Fatalf("admin call through a redirect: %v (owner saw Authorization %q)", err, seen.Load())
	}
	if len(spans) != 1 || spans[0].entries != 3 || seen.Load() != "Bearer app-token" {
		t.Fatalf("spans %+v, owner saw Authorization %q", spans, seen.Load())
	}
}

func TestAdminRefusesRedirectToUntrustedHost(t *testing.T) {
	var seen atomic.Value
	var calls atomic.Int64
	own := owner(t, &seen, &calls)
	front := redirector(t, own.URL)
	a := New(localhostURL(t, front), nil, bearer, nil)
	_, err := a.ledgers(context.Background(), "persistent://public/default/t")
	if err == nil || !strings.Contains(err.Error(), "untrusted") || !strings.Contains(err.Error(), "AdminRedirectHosts") {
		t.Fatalf("err = %v, want a refusal naming AdminRedirectHosts", err)
	}
	if calls.Load() != 0 {
		t.Fatalf("the untrusted host got %d calls", calls.Load())
	}
}

func TestTrustedRedirect(t *testing.T) {
	cases := []struct {
		origin, target string
		trusted        []string
		want           bool
	}{
		{"http://broker.pulsar.svc:8080", "http://broker.pulsar.svc:8081/x", nil, true},
		{"http://broker.pulsar.svc:8080", "http://broker-1.broker.pulsar.svc:8080/x", nil, true},
		{"http://broker.pulsar.svc:8080", "http://evil.example.com/x", nil, false},
		{"http://broker.pulsar.svc:8080", "http://notbroker.pulsar.svc/x", nil, false},
		{"http://broker.pulsar.svc:8080", "http://10.0.0.5:8080/x", []string{"10.0.0.5"}, true},
		{"http://broker.pulsar.svc:8080", "http://b-2.pulsar.example.com/x", []string{"*.pulsar.example.com"}, true},
		{"http://broker.pulsar.svc:8080", "http://pulsar.example.com.evil.io/x", []string{"*.pulsar.example.com"}, false},
		{"http://broker:8080", "http://[fd00::5]:8080/x", []string{"[fd00::5]"}, true},
		{"https://broker.pulsar.svc", "http://broker.pulsar.svc/x", nil, false},
		{"https://broker.pulsar.svc", "http://10.0.0.5/x", []string{"10.0.0.5"}, false},
	}
	for _, tc := range cases {
		o, _ := url.Parse(tc.origin)
		u, _ := url.Parse(tc.target)
		if got := trustedRedirect(o, u, tc.trusted); got != tc.want {
			t.Errorf("%s -> %s (trusted %v) = %v, want %v", tc.origin, tc.target, tc.trusted, got, tc.want)
		}
	}
}
