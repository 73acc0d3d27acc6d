package main

import (
	"encoding/pem"
	"io"
	stdlog "log"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/go-logr/logr"

	"github.com/subflow-dev/subflow/agent/protocol"
	"github.com/subflow-dev/subflow/agent/sidecar"
	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// An https admin URL signed by a private CA: the sidecar reads backlogs through it once
// --tls-ca-file names that CA (the bundle the webhook mounts from the namespace's
// configuration), also when the brokers themselves speak plaintext; without it the backlog is
// unknown and the report says the certificate was not trusted.
func TestAdminURLTrustsTheCAFile(t *testing.T) {
	broker := pulsartest.Start(t)
	target, err := url.Parse(broker.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	admin := httptest.NewUnstartedServer(httputil.NewSingleHostReverseProxy(target))
	admin.Config.ErrorLog = stdlog.New(io.Discard, "", 0) // the refused handshake is expected
	admin.StartTLS()
	t.Cleanup(admin.Close)
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: admin.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	topic := "persistent://public/default/orders"
	subscribe(t, broker.ServiceURL(), topic, "ingest")
	newProducer(t, broker.ServiceURL(), topic).send(t, "m", 0, 3)

	backlog := func(args ...string) (messages int64, unknown string) {
		t.Helper()
		cfg, err := parseFlags(append([]string{"--broker-url", broker.ServiceURL(), "--admin-url", admin.URL}, args...))
		if err != nil {
			t.Fatal(err)
		}
		// The sidecar still starts: the CA is for the admin API here, the brokers are plaintext.
		s, err := sidecar.New(cfg.opts)
		if err != nil {
			t.Fatalf("the sidecar does not start with %q: %v", args, err)
		}
		admin, err := cfg.admin(logr.Discard())
		if err != nil {
			t.Fatal(err)
		}
		defer admin.Close()
		// The control server's backlog watch, as a push with reportBacklog starts it.
		host := s.ControlHost(admin)
		host.WatchBacklog(topic, "ingest")
		var got []protocol.BacklogStatus
		testkit.Eventually(t, 15*time.Second, "the first backlog read", func() bool {
			got = host.LatestBacklog(topic, "ingest")
			return got != nil
		})
		if len(got) != 1 {
			t.Fatalf("backlog = %+v, want one topic", got)
		}
		return got[0].Messages, got[0].Unknown
	}
	if _, unknown := backlog(); !strings.Contains(unknown, "certificate signed by unknown authority") {
		t.Errorf("without --tls-ca-file: backlog unknown %q, want the certificate refused", unknown)
	}
	if messages, unknown := backlog("--tls-ca-file", caFile); unknown != "" || messages != 3 {
		t.Errorf("with --tls-ca-file: backlog %d (unknown %q), want 3 read over https", messages, unknown)
	}
}

// subscribe creates the subscription through the broker directly; its consumer takes nothing.
func subscribe(t *testing.T, serviceURL, topic, subscription string) {
	t.Helper()
	c, err := pulsar.NewClient(pulsar.ClientOptions{URL: serviceURL, Logger: log.DefaultNopLogger()})
	if err != nil {
		t.Fatal(err)
	}
	consumer, err := c.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: subscription, Type: pulsar.Shared})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { consumer.Close(); c.Close() })
}
