package pulsaradmin

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/subflow-dev/subflow/agent/protocol"
	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// parkSubscription creates the durable subscription and closes its consumer, so that what is
// produced next waits on the broker with nobody consuming.
func (e *testBroker) parkSubscription(t testing.TB, topic, sub string) {
	t.Helper()
	c := testkit.Subscribe(t, e.client, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: sub})
	c.Close()
}

// setRetention sets the topic's message TTL and backlog quotas through the admin API, as an
// operator would, and waits until the broker applies them (topic policies propagate
// asynchronously on a real broker).
func (e *testBroker) setRetention(t testing.TB, topic string, ttlSeconds int, quotas map[string]string) {
	t.Helper()
	path, err := TopicPath(topic)
	if err != nil {
		t.Fatal(err)
	}
	e.adminJSON(t, http.MethodPost, path+"/messageTTL?messageTTL="+strconv.Itoa(ttlSeconds), "", nil)
	for kind, body := range quotas {
		e.adminJSON(t, http.MethodPost, path+"/backlogQuota?backlogQuotaType="+kind, body, nil)
	}
	poll.Eventually(t, "the policies applied", func() bool {
		var ttl int
		var applied map[string]map[string]any
		e.adminJSON(t, http.MethodGet, path+"/messageTTL?applied=true", "", &ttl)
		e.adminJSON(t, http.MethodGet, path+"/backlogQuotaMap?applied=true", "", &applied)
		for kind := range quotas {
			if applied[kind]["policy"] == nil {
				return false
			}
		}
		return ttl == ttlSeconds
	})
}

// subscriptionBacklog reads msgBacklog and backlogSize the way an operator would.
func (e *testBroker) subscriptionBacklog(t testing.TB, topic, sub string) (messages, bytes int64) {
	t.Helper()
	path, err := TopicPath(topic)
	if err != nil {
		t.Fatal(err)
	}
	var ts struct {
		Subscriptions map[string]struct {
			MsgBacklog  int64 `json:"msgBacklog"`
			BacklogSize int64 `json:"backlogSize"`
		} `json:"subscriptions"`
	}
	e.adminJSON(t, http.MethodGet, path+"/stats", "", &ts)
	s := ts.Subscriptions[sub]
	return s.MsgBacklog, s.BacklogSize
}

const (
	sizeQuotaEvicting = `{"limitSize":1048576,"limitTime":-1,"policy":"consumer_backlog_eviction"}`
	ageQuotaHolding   = `{"limitSize":-1,"limitTime":3600,"policy":"producer_request_hold"}`
)

// The values the agent reports are the broker's: the backlog in entries and bytes as its stats
// give them, the oldest message's time within the produce window, the TTL and both quotas as
// set through the admin API.
func TestIntegrationBacklogReportsBacklogAndRetention(t *testing.T) {
	e := newTestBroker(t)
	topic := uniqueTopic(t)
	e.parkSubscription(t, topic, "sub")
	e.setRetention(t, topic, 120, map[string]string{"destination_storage": sizeQuotaEvicting, "message_age": ageQuotaHolding})
	before := time.Now().Add(-time.Second) // broker and test clocks may differ a little
	e.produce(t, topic, 10)
	after := time.Now().Add(time.Second)

	got := e.api.Backlog(context.Background(), topic, "sub")
	if len(got) != 1 || got[0].Unknown != "" {
		t.Fatalf("backlog %+v", got)
	}
	st := got[0]
	messages, bytes := e.subscriptionBacklog(t, topic, "sub")
	if st.Topic != topic || st.Messages != 10 || st.Messages != messages || st.Bytes != bytes || st.Bytes <= 0 {
		t.Fatalf("reported %+v, the admin API says %d messages, %d bytes", st, messages, bytes)
	}
	if st.OldestPublishTime == nil || st.OldestPublishTime.Before(before) || st.OldestPublishTime.After(after) {
		t.Fatalf("oldest publish time %v, produced between %v and %v", st.OldestPublishTime, before, after)
	}
	if st.MessageTTLSeconds == nil || *st.MessageTTLSeconds != 120 {
		t.Fatalf("message TTL %v, want 120", st.MessageTTLSeconds)
	}
	want := []protocol.BacklogQuota{
		{Type: "destination_storage", LimitBytes: 1 << 20, Policy: "consumer_backlog_eviction"},
		{Type: "message_age", LimitSeconds: 3600, Policy: "producer_request_hold"},
	}
	if len(st.Quotas) != 2 || st.Quotas[0] != want[0] || st.Quotas[1] != want[1] {
		t.Fatalf("quotas %+v, want %+v", st.Quotas, want)
	}
	if time.Since(st.ReadAt) > time.Minute || st.ReadAt.IsZero() {
		t.Fatalf("read at %v", st.ReadAt)
	}
}

// A partitioned topic gives one entry per partition, each with that partition's backlog and
// the topic's policies; a topic without TTL or quota reports none.
func TestIntegrationBacklogPerPartition(t *testing.T) {
	e := newTestBroker(t)
	topic := uniqueTopic(t)
	e.createPartitioned(t, topic, 3)
	e.parkSubscription(t, topic, "sub")
	none := e.api.Backlog(context.Background(), topic, "sub")
	e.setRetention(t, topic, 30, nil)
	e.produce(t, topic, 30)

	got := e.api.Backlog(context.Background(), topic, "sub")
	if len(got) != 3 || len(none) != 3 {
		t.Fatalf("got %d and %d entries, want 3 (one per partition): %+v", len(got), len(none), got)
	}
	var total int64
	for i, st := range got {
		partition := topic + "-partition-" + strconv.Itoa(i)
		messages, _ := e.subscriptionBacklog(t, partition, "sub")
		if st.Unknown != "" || st.Topic != partition || st.Messages != messages {
			t.Fatalf("partition %d: %+v, the admin API says %d messages", i, st, messages)
		}
		if st.MessageTTLSeconds == nil || *st.MessageTTLSeconds != 30 {
			t.Fatalf("partition %d: TTL %v, want the topic's 30", i, st.MessageTTLSeconds)
		}
		if n := none[i]; n.Unknown != "" || n.Messages != 0 || n.OldestPublishTime != nil || n.MessageTTLSeconds != nil || len(n.Quotas) != 0 {
			t.Fatalf("partition %d before any message or policy: %+v", i, n)
		}
		total += st.Messages
	}
	if total != 30 {
		t.Fatalf("%d messages over the partitions, want 30", total)
	}
}

// What cannot be read is Unknown with the reason, never an error: credentials refused (401
// without a token, 403 for policies with consume-level rights only), a subscription that does
// not exist, a broker that does not answer, no admin URL at all.
func TestBacklogUnknownWhenRefusedOrUnreachable(t *testing.T) {
	b := pulsartest.Start(t, pulsartest.Options{AdminToken: "app-token", AdminSuperToken: "root"})
	client := testkit.Client(t, pulsar.ClientOptions{URL: b.ServiceURL()})
	topic := uniqueTopic(t)
	c, err := client.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub"})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	// An admin API that hangs up on every connection. The port stays ours for the whole test: a
	// port closed at once could be taken meanwhile by another test's server, which answers.
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closed.Close() })
	go func() {
		for {
			conn, err := closed.Accept()
			if err != nil {
				return
			}
			_ = conn.Close()
		}
	}()
	root := func(r *http.Request) error { r.Header.Set("Authorization", "Bearer root"); return nil }
	cases := []struct {
		name, adminURL, sub string
		auth                func(*http.Request) error
		want                []string // fragments of Unknown; none means known
		wantRetention       []string // fragments of RetentionUnknown, for a known backlog
	}{
		{"no credentials", b.AdminURL(), "sub", nil, []string{"HTTP 401", "partition metadata", "lookup"}, nil},
		// Consume rights read the backlog; only the retention (topic policies) is refused.
		{"consume rights only", b.AdminURL(), "sub", bearer, nil, []string{"HTTP 403", "retention policies", "tenant admin"}},
		{"tenant admin", b.AdminURL(), "sub", root, nil, nil},
		{"no such subscription", b.AdminURL(), "nope", root, []string{`subscription "nope" does not exist`}, nil},
		{"unreachable", "http://" + closed.Addr().String(), "sub", root, []string{"unreachable"}, nil},
		{"no admin URL", "", "sub", nil, []string{"Options.AdminURL"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var a *Client // no admin URL
			if tc.adminURL != "" {
				a = New(tc.adminURL, nil, tc.auth, nil)
			}
			got := a.Backlog(context.Background(), topic, tc.sub)
			if len(got) != 1 {
				t.Fatalf("got %+v, want one entry", got)
			}
			st := got[0]
			if tc.want == nil {
				if st.Unknown != "" || st.Messages != 0 || st.ReadAt.IsZero() {
					t.Fatalf("got %+v, want known values", st)
				}
				for _, w := range tc.wantRetention {
					if !strings.Contains(st.RetentionUnknown, w) || st.MessageTTLSeconds != nil || st.Quotas != nil {
						t.Fatalf("retention unknown %q does not say %q, or values given: %+v", st.RetentionUnknown, w, st)
					}
				}
				if tc.wantRetention == nil && st.RetentionUnknown != "" {
					t.Fatalf("retention unknown %q for a tenant admin", st.RetentionUnknown)
				}
				return
			}
			for _, w := range tc.want {
				if !strings.Contains(st.Unknown, w) {
					t.Fatalf("unknown %q does not say %q", st.Unknown, w)
				}
			}
			if st.Messages != 0 || st.Bytes != 0 || st.OldestPublishTime != nil || st.MessageTTLSeconds != nil || st.Quotas != nil {
				t.Fatalf("an unknown entry carries values: %+v", st)
			}
		})
	}
}

// The reported values predict a TTL expiry: the first message is deleted by the broker's
// expiry check exactly when oldestPublishTime + TTL has passed, not before (pulsartest's
// clock moves, its expiry check runs on demand).
func TestIntegrationBacklogPredictsTTLExpiry(t *testing.T) {
	start := time.Now().Truncate(time.Millisecond)
	clock := clocktesting.NewFakeClock(start)
	e := newTestBroker(t, pulsartest.Options{Clock: clock.Now, MessageExpiryCheckInterval: -1})
	topic := uniqueTopic(t)
	e.parkSubscription(t, topic, "sub")
	e.setRetention(t, topic, 60, nil)
	e.produce(t, topic, 3)
	clock.SetTime(start.Add(10 * time.Second))
	e.produce(t, topic, 2)

	got := e.api.Backlog(context.Background(), topic, "sub")
	if len(got) != 1 || got[0].OldestPublishTime == nil || got[0].MessageTTLSeconds == nil || got[0].Messages != 5 {
		t.Fatalf("backlog %+v", got)
	}
	expiry := got[0].OldestPublishTime.Add(time.Duration(*got[0].MessageTTLSeconds) * time.Second)
	if !expiry.Equal(start.Add(time.Minute)) {
		t.Fatalf("predicted expiry %v, want %v", expiry, start.Add(time.Minute))
	}
	broker := e.pulsartest(t, "moves the broker's clock")
	clock.SetTime(expiry)
	broker.RunExpiryCheck()
	if messages, _ := e.subscriptionBacklog(t, topic, "sub"); messages != 5 {
		t.Fatalf("at the predicted time %d messages left, want all 5", messages)
	}
	clock.SetTime(expiry.Add(time.Millisecond))
	broker.RunExpiryCheck()
	if messages, _ := e.subscriptionBacklog(t, topic, "sub"); messages != 2 {
		t.Fatalf("just after the predicted time %d messages left, want the 2 newer ones", messages)
	}
	// The next read names the next expiry: the newer messages' time + TTL.
	next := e.api.Backlog(context.Background(), topic, "sub")
	if len(next) != 1 || next[0].OldestPublishTime == nil || !next[0].OldestPublishTime.Equal(start.Add(10*time.Second)) {
		t.Fatalf("after the expiry: %+v", next)
	}
}

// The same prediction against a real broker's own expiry check, which runs every
// messageExpiryCheckIntervalInMinutes (1 in hack/pulsar's configuration): no message is
// deleted before the predicted time, and the older ones are gone within one check interval
// after it. The lag between the two is logged: it is what the prediction means on a real
// broker. In-process, TestIntegrationBacklogPredictsTTLExpiry moves the clock instead.
func TestIntegrationBacklogPredictsRealTTLExpiry(t *testing.T) {
	e := newTestBroker(t)
	if e.local != nil {
		t.Skip("waits for a real broker's expiry check; in-process, TestIntegrationBacklogPredictsTTLExpiry moves the clock")
	}
	checkInterval := expiryCheckInterval(t, e)
	if checkInterval > 2*time.Minute {
		t.Skipf("the broker checks expiry every %v: too long a wait (hack/pulsar's brokers check every minute)", checkInterval)
	}
	const ttl = 15
	topic := uniqueTopic(t)
	e.parkSubscription(t, topic, "sub")
	e.setRetention(t, topic, ttl, nil)
	e.produce(t, topic, 3)
	got := e.api.Backlog(context.Background(), topic, "sub")
	if len(got) != 1 || got[0].OldestPublishTime == nil || got[0].MessageTTLSeconds == nil || got[0].Messages != 3 {
		t.Fatalf("backlog %+v", got)
	}
	expiry := got[0].OldestPublishTime.Add(time.Duration(*got[0].MessageTTLSeconds) * time.Second)
	if *got[0].MessageTTLSeconds != ttl {
		t.Fatalf("reported TTL %d s, want the topic's %d", *got[0].MessageTTLSeconds, ttl)
	}
	deadline := expiry.Add(checkInterval + 15*time.Second)
	for {
		messages, _ := e.subscriptionBacklog(t, topic, "sub")
		now := time.Now()
		if messages < 3 && now.Before(expiry) {
			t.Fatalf("%d of 3 messages left at %v, before the predicted expiry %v", messages, now, expiry)
		}
		if messages == 0 {
			t.Logf("TTL %d s: expired %v after the predicted time (the broker checks every %v)", ttl, now.Sub(expiry).Round(10*time.Millisecond), checkInterval)
			return
		}
		if now.After(deadline) {
			t.Fatalf("%d messages left at %v, a check interval after the predicted expiry %v", messages, now, expiry)
		}
		time.Sleep(200 * time.Millisecond) // polling the broker's stats; the expiry is the broker's
	}
}

// expiryCheckInterval reads messageExpiryCheckIntervalInMinutes from the broker's runtime
// configuration, or skips the test when the broker does not serve it (the test broker).
func expiryCheckInterval(t *testing.T, e *testBroker) time.Duration {
	t.Helper()
	var conf map[string]string
	if code := e.admin(t, http.MethodGet, "/admin/v2/brokers/configuration/runtime", "", &conf); code != http.StatusOK {
		t.Skipf("the broker does not tell its expiry check interval (GET /admin/v2/brokers/configuration/runtime answered %d)", code)
	}
	minutes, err := strconv.Atoi(conf["messageExpiryCheckIntervalInMinutes"])
	if err != nil {
		t.Fatalf("messageExpiryCheckIntervalInMinutes = %q: %v", conf["messageExpiryCheckIntervalInMinutes"], err)
	}
	return time.Duration(minutes) * time.Minute
}

// A watched subscription is read in the background: Latest follows the broker at the refresh
// period, and Stop forgets it.
func TestIntegrationWatchBacklogRefreshes(t *testing.T) {
	e := newTestBroker(t)
	a := NewWatches(e.api, 20*time.Millisecond)
	t.Cleanup(a.Close)
	topic := uniqueTopic(t)
	e.parkSubscription(t, topic, "sub")
	if got := a.Latest(topic, "sub"); got != nil {
		t.Fatalf("values before any watch: %+v", got)
	}
	a.Watch(topic, "sub")
	a.Watch(topic, "sub") // again: one watch
	messagesSeen := func(n int64) func() bool {
		return func() bool {
			got := a.Latest(topic, "sub")
			return len(got) == 1 && got[0].Unknown == "" && got[0].Messages == n
		}
	}
	poll.Eventually(t, "the first read", messagesSeen(0))
	e.produce(t, topic, 7)
	poll.Eventually(t, "a refresh showing 7 messages", messagesSeen(7))
	got := a.Latest(topic, "sub")
	got[0].Messages = 1000 // a caller's copy: the cache is not changed
	if !messagesSeen(7)() {
		t.Fatal("changing the returned values changed the cache")
	}
	a.Stop(topic, "sub")
	if got := a.Latest(topic, "sub"); got != nil {
		t.Fatalf("values after Stop: %+v", got)
	}
}

// Latest never waits on the admin API: while a read hangs it answers at once (nothing read
// yet), and Stop and Close end the hanging read.
func TestWatchBacklogNeverWaitsOnTheAdminAPI(t *testing.T) {
	entered := make(chan struct{}, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-r.Context().Done() // hangs until the agent gives up
	}))
	t.Cleanup(srv.Close)
	a := NewWatches(New(srv.URL, nil, nil, nil), time.Millisecond)
	a.Watch("t", "sub")
	a.Watch("u", "sub")
	<-entered
	if got := a.Latest("t", "sub"); got != nil {
		t.Fatalf("values while the first read hangs: %+v", got)
	}
	a.Stop("t", "sub")
	a.Close() // ends the other hanging read and returns
	a.Watch("v", "sub")
	if got := a.Latest("v", "sub"); got != nil {
		t.Fatalf("a watch started after Close: %+v", got)
	}
}
