package main

import (
	"bufio"
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"

	"github.com/subflow-dev/subflow/internal/pulsartest"
)

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		name, wantErr string
		args          []string
	}{
		{name: "broker required", args: nil, wantErr: "--broker-url"},
		{name: "plain", args: []string{"--broker-url", "pulsar://b:6650"}},
		{name: "stray argument", args: []string{"--broker-url", "pulsar://b:6650", "extra"}, wantErr: "unexpected"},
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
	cmd := exec.Command(bin, "--broker-url", broker.ServiceURL(), "--listen", addr, "--log-level", "debug")
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	lines := bufio.NewScanner(stderr)
	for lines.Scan() && !strings.Contains(lines.Text(), "Serving Pulsar clients") {
	}
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
