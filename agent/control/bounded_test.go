package control_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/subflow-dev/subflow/agent"
	"github.com/subflow-dev/subflow/agent/control"
	"github.com/subflow-dev/subflow/agent/protocol"
)

// The kubelet may rewrite a Secret's file so that size and modification time stay the same;
// the new token must apply at once and the old one stop working.
func TestTokenFileRotationWithSameSizeAndModTime(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("token-aaaa\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	ts := newServer(t, control.Options{TokenFile: file, PreviousTokenGrace: -1})
	url := ts.URL + protocol.PathPrefix + "/state"
	if code, _ := call(t, http.MethodGet, url, "token-aaaa", ""); code != http.StatusOK {
		t.Fatalf("first token refused: %d", code)
	}
	if err := os.WriteFile(file, []byte("token-bbbb\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(file, info.ModTime(), info.ModTime()); err != nil {
		t.Fatal(err)
	}
	if now, _ := os.Stat(file); now.Size() != info.Size() || !now.ModTime().Equal(info.ModTime()) {
		t.Fatalf("the rewrite changed size or time: %v %v", now.Size(), now.ModTime())
	}
	if code, _ := call(t, http.MethodGet, url, "token-bbbb", ""); code != http.StatusOK {
		t.Errorf("rotated token refused: %d", code)
	}
	if code, _ := call(t, http.MethodGet, url, "token-aaaa", ""); code != http.StatusUnauthorized {
		t.Errorf("old token still accepted: %d", code)
	}
}

// Serve that fails (TLS files missing) leaves no goroutine behind waiting for its context.
func TestFailedServeLeavesNoGoroutine(t *testing.T) {
	a, err := agent.New(agent.Options{Name: "pod-a"})
	if err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing.pem")
	srv, err := control.New(a, control.Options{Token: token, TLSCertFile: missing, TLSKeyFile: missing})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // only at the end: a leaked goroutine would still be waiting meanwhile
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Serve(ctx, l); err == nil || !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("Serve with missing TLS files: %v, want a not-exist error", err)
		}
		if _, err := net.Dial("tcp", l.Addr().String()); err == nil {
			t.Fatalf("the failed Serve left its listener open")
		}
	}
	eventually(t, "no goroutine of a failed Serve", func() bool {
		return !strings.Contains(allStacks(), "agent/control.(*Server).Serve")
	})
}

func allStacks() string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return string(buf[:n])
		}
		buf = make([]byte, 2*len(buf))
	}
}

// /metrics needs no token by default (Prometheus scrapes it); MetricsRequireToken changes that.
func TestMetricsToken(t *testing.T) {
	open := newServer(t, control.Options{Token: token})
	if code, body := call(t, http.MethodGet, open.URL+"/metrics", "", ""); code != http.StatusOK {
		t.Fatalf("metrics without a token: %d %s", code, body)
	}
	closed := newServer(t, control.Options{Token: token, MetricsRequireToken: true})
	if code, _ := call(t, http.MethodGet, closed.URL+"/metrics", "", ""); code != http.StatusUnauthorized {
		t.Fatalf("metrics requiring the token answered %d without it, want 401", code)
	}
	if code, _ := call(t, http.MethodGet, closed.URL+"/metrics", token, ""); code != http.StatusOK {
		t.Fatalf("metrics with the token: %d", code)
	}
	if code, _ := call(t, http.MethodGet, closed.URL+"/healthz", "", ""); code != http.StatusOK {
		t.Fatalf("healthz needs no token: %d", code)
	}
}
