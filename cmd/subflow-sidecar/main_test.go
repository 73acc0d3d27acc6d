package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/go-logr/logr"

	"github.com/subflow-dev/subflow/agent/control"
	"github.com/subflow-dev/subflow/agent/protocol"
	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
)

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		name, wantErr string
		args          []string
	}{
		{name: "broker required", args: nil, wantErr: "--broker-url"},
		{name: "plain", args: []string{"--broker-url", "pulsar://b:6650"}},
		{name: "no token file", args: []string{"--broker-url", "pulsar://b:6650", "--token-file", ""}, wantErr: "--token-file"},
		{name: "no control address", args: []string{"--broker-url", "pulsar://b:6650", "--control-addr", ""}, wantErr: "--control-addr"},
		{name: "stray argument", args: []string{"--broker-url", "pulsar://b:6650", "extra"}, wantErr: "unexpected"},
		{name: "start gated", args: []string{"--broker-url", "pulsar://b:6650", "--start-gated", "--sync-timeout", "10s", "--fallback-state", "Paused"}},
		{name: "unknown fallback", args: []string{"--broker-url", "pulsar://b:6650", "--fallback-state", "Pausd"}, wantErr: "want Running, Paused or Stopped"},
		{name: "token grace", args: []string{"--broker-url", "pulsar://b:6650", "--token-grace", "30s"}},
		{name: "client limits", args: []string{"--broker-url", "pulsar://b:6650", "--max-connections", "16", "--frame-timeout", "5s", "--frame-memory", "8388608"}},
		{name: "CA for an https admin API", args: []string{"--broker-url", "pulsar://b:6650", "--admin-url", "https://a:8443", "--tls-ca-file", "/ca.crt"}},
		{name: "CA for TLS brokers", args: []string{"--broker-url", "pulsar+ssl://b:6651", "--tls-ca-file", "/ca.crt"}},
		{name: "CA nothing uses", args: []string{"--broker-url", "pulsar://b:6650", "--admin-url", "http://a:8080", "--tls-ca-file", "/ca.crt"}, wantErr: "--tls-ca-file"},
		{name: "negative token grace", args: []string{"--broker-url", "pulsar://b:6650", "--token-grace", "-1s"}, wantErr: "--token-grace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("PULSAR_BROKER_URL", "")
			_, err := parseFlags(tc.args)
			if tc.wantErr == "" && err != nil {
				t.Fatal(err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("error %v, want one naming %s", err, tc.wantErr)
			}
		})
	}
	if _, err := newLogger("loud"); err == nil {
		t.Error("an unknown log level was accepted")
	}
}

// --token-grace sets the control server's grace; 0 turns it off, which control.Options
// spells negative (its zero is the default).
func TestTokenGraceFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want time.Duration
	}{
		{nil, control.DefaultPreviousTokenGrace},
		{[]string{"--token-grace", "30s"}, 30 * time.Second},
		{[]string{"--token-grace", "0"}, -1},
	} {
		c, err := parseFlags(append([]string{"--broker-url", "pulsar://b:6650"}, tc.args...))
		if err != nil {
			t.Fatal(err)
		}
		if got := c.controlOptions(logr.Discard()).PreviousTokenGrace; got != tc.want {
			t.Errorf("%q: PreviousTokenGrace %s, want %s", tc.args, got, tc.want)
		}
	}
}

// The binary serves a client, refuses a non-loopback listener unless asked, and exits 0 on
// SIGTERM.
func TestServesAndStopsOnSIGTERM(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "subflow-sidecar")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v: %s", err, out)
	}
	broker := pulsartest.Start(t)
	if out, err := exec.Command(bin, "--broker-url", broker.ServiceURL(), "--listen", "0.0.0.0:0").CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "not loopback") {
		t.Fatalf("a non-loopback listener was not refused: %v: %s", err, out)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--broker-url", broker.ServiceURL(), "--listen", addr, "--log-level", "debug",
		"--control-addr", "127.0.0.1:0", "--token-file", tokenFile)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	lines := bufio.NewScanner(stderr)
	var control string
	for lines.Scan() && !strings.Contains(lines.Text(), "Serving Pulsar clients") {
		var line struct{ Msg, Addr string }
		if json.Unmarshal(lines.Bytes(), &line) == nil && line.Msg == "Serving the control API" {
			control = "http://" + line.Addr
		}
	}
	if control == "" {
		t.Fatal("the sidecar did not say where its control API listens")
	}
	checkControlAPI(t, control)
	go func() {
		for lines.Scan() {
		}
	}()

	client, err := pulsar.NewClient(pulsar.ClientOptions{URL: "pulsar://" + addr, Logger: log.DefaultNopLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	producer, err := client.CreateProducer(pulsar.ProducerOptions{Topic: "sidecar-binary"})
	if err != nil {
		t.Fatalf("producer through the sidecar binary: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := producer.Send(ctx, &pulsar.ProducerMessage{Payload: []byte("x")}); err != nil {
		t.Fatalf("send through the sidecar binary: %v", err)
	}
	producer.Close()

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
}

// checkControlAPI: the binary's control API answers the startup probe, refuses a wrong token
// and reports itself a sidecar to the token its file holds.
func checkControlAPI(t *testing.T, base string) {
	t.Helper()
	get := func(path, token string) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = resp.Body.Close() })
		return resp
	}
	if resp := get("/healthz", ""); resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz: HTTP %d", resp.StatusCode)
	}
	if resp := get(protocol.PathPrefix+"/state", "wrong"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a wrong token: HTTP %d, want 401", resp.StatusCode)
	}
	resp := get(protocol.PathPrefix+"/state", "s3cret")
	var state protocol.AgentState
	if err := json.NewDecoder(resp.Body).Decode(&state); err != nil || resp.StatusCode != http.StatusOK || state.Kind != protocol.KindSidecar {
		t.Errorf("GET /state: HTTP %d kind %q (%v), want 200 sidecar", resp.StatusCode, state.Kind, err)
	}
}
