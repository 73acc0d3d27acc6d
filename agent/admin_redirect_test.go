package agent

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
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
	a := newAdminClient(localhostURL(t, front), nil, bearer, []string{"127.0.0.1"})
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
	a := newAdminClient(localhostURL(t, front), nil, bearer, nil)
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

// clusterEnv is env on a two-broker pulsartest cluster whose admin API wants the bearer token
// "app-token": the client reaches the brokers through the wire recorder, which follows lookups
// to the owner; the agent's admin URL names broker 0 by adminHost ("127.0.0.1" as the broker
// advertises itself, or "localhost").
func clusterEnv(t *testing.T, adminHost string, opts Options) (*env, *pulsartest.Cluster) {
	t.Helper()
	if _, _, ok := remoteBroker(t); ok {
		t.Skip("needs a two-broker pulsartest cluster with a secured admin API")
	}
	cl := pulsartest.StartCluster(t, 2, pulsartest.Options{AdminToken: "app-token"})
	wire := wirerec.StartT(t, cl.Broker(0).ServiceURL(), wirerec.Options{RewriteLookups: true})
	u, err := url.Parse(cl.Broker(0).AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	opts.Name, opts.AdminURL = "test", "http://"+adminHost+":"+u.Port()
	e := &env{wire: wire, adminURL: opts.AdminURL, client: testkit.Client(t, pulsar.ClientOptions{URL: wire.ServiceURL()})}
	e.agent = newTestAgent(t, opts)
	return e, cl
}

// Issue 11 item 5, end to end: the topic is owned by broker 1 and the agent talks to broker 0,
// whose admin API answers 307 to broker 1's admin address (127.0.0.1, another port); the owner
// refuses calls without the token. SeekByIndex succeeds, and the next message the application
// gets is the target, only if the redirected calls carry AdminAuth's header:
//   - same host, another port: trusted by default (net/http keeps the header too: it compares
//     host names, not ports);
//   - another host name (the agent says "localhost"): net/http drops Authorization, the host is
//     trusted through AdminRedirectHosts and the agent applies AdminAuth again.
func TestIntegrationSeekFollowsAdminRedirectToOwnerWithCredentials(t *testing.T) {
	for _, tc := range []struct {
		name, adminHost string
		trusted         []string
	}{
		{"same host other port", "127.0.0.1", nil},
		{"other host listed", "localhost", []string{"127.0.0.1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, cl := clusterEnv(t, tc.adminHost, Options{AdminAuth: bearer, AdminRedirectHosts: tc.trusted})
			topic := uniqueTopic(t)
			if err := cl.MoveTopic(topic, 1); err != nil {
				t.Fatal(err)
			}
			c := e.subscribe(t, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub"})
			e.produce(t, topic, 0, 20, 1)
			if owner := cl.Owner(topic); owner != 1 {
				t.Fatalf("topic owned by broker %d, want 1 (not the agent's AdminURL)", owner)
			}
			testkit.ReceiveAndAck(t, c, 20, receiveLimit)
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			res, err := c.SeekByIndex(ctx, 7)
			if err != nil {
				t.Fatalf("seek through the redirect: %v", err)
			}
			if len(res.Positions) != 1 || res.Positions[0].Index != 7 {
				t.Fatalf("positions %+v", res.Positions)
			}
			if m := testkit.ReceiveAndAck(t, c, 1, receiveLimit)[0]; seqOfMessage(t, m) != 7 || m.Index() == nil || *m.Index() != 7 {
				t.Fatalf("first message after the seek: payload %s index %v, want 7", m.Payload(), m.Index())
			}
		})
	}
}

// The control case: without credentials the same seek fails with the owner's 401 (so the test
// above passes because the header reached the owner), and nothing moved: no message is
// redelivered.
func TestIntegrationSeekWithoutCredentialsFailsAndMovesNothing(t *testing.T) {
	e, cl := clusterEnv(t, "127.0.0.1", Options{})
	topic := uniqueTopic(t)
	if err := cl.MoveTopic(topic, 1); err != nil {
		t.Fatal(err)
	}
	c := e.subscribe(t, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub"})
	e.produce(t, topic, 0, 5, 1)
	testkit.ReceiveAndAck(t, c, 5, receiveLimit)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_, err := c.SeekByIndex(ctx, 2)
	var ae *adminError
	if !errors.As(err, &ae) || ae.Status != http.StatusUnauthorized {
		t.Fatalf("seek without credentials: %v, want HTTP 401 from the admin API", err)
	}
	e.produce(t, topic, 5, 1, 1)
	if m := testkit.ReceiveAndAck(t, c, 1, receiveLimit)[0]; seqOfMessage(t, m) != 5 {
		t.Fatalf("after the failed seek the application got %d, want the new message 5", seqOfMessage(t, m))
	}
}
