package agent

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
)

// bearer presents the token the test cluster's admin API wants.
func bearer(r *http.Request) error {
	r.Header.Set("Authorization", "Bearer app-token")
	return nil
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
	if _, err := c.SeekByIndex(ctx, 2); err == nil || !strings.Contains(err.Error(), "HTTP 401") {
		t.Fatalf("seek without credentials: %v, want HTTP 401 from the admin API", err)
	}
	e.produce(t, topic, 5, 1, 1)
	if m := testkit.ReceiveAndAck(t, c, 1, receiveLimit)[0]; seqOfMessage(t, m) != 5 {
		t.Fatalf("after the failed seek the application got %d, want the new message 5", seqOfMessage(t, m))
	}
}
