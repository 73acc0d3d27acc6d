package pulsartest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// startWithClock starts a broker whose checks run only when a test calls them.
func startWithClock(t *testing.T, clock *clocktesting.FakeClock, opts Options) *Broker {
	opts.Clock = clock.Now
	opts.MessageExpiryCheckInterval, opts.BacklogQuotaCheckInterval = -1, -1
	return Start(t, opts)
}

const nsPath = "/admin/v2/namespaces/public/default"

func topicPath(topic string) string { return "/admin/v2/persistent/public/default/" + topic }

func mustDo(t testing.TB, method, url, body string, want int) string {
	t.Helper()
	code, out := testkit.Request(t, method, url, body)
	if code != want {
		t.Fatalf("%s %s: %d %s, want %d", method, url, code, out, want)
	}
	return out
}

func subStats(t testing.TB, b *Broker, topic, sub string) subscriptionStatsJSON {
	t.Helper()
	var out topicStatsJSON
	testkit.GetJSON(t, b.AdminURL()+topicPath(topic)+"/stats?getEarliestTimeInBacklog=true", &out)
	return out.Subscriptions[sub]
}

// parkSubscription creates a durable subscription and closes its consumer,
// so that what is produced next stays on the broker.
func parkSubscription(t *testing.T, c pulsar.Client, topic string) {
	cons, err := c.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub"})
	if err != nil {
		t.Fatal(err)
	}
	cons.Close()
}

// PersistentMessageExpiryMonitor.expireMessages: a subscription whose
// backlog waits (no consumer) loses the messages older than the TTL when the
// broker's expiry check runs; the next consumer gets only the newer ones.
func TestMessageTTLExpiresAWaitingBacklog(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Now())
	b := startWithClock(t, clock, Options{})
	c := newClient(t, b)
	parkSubscription(t, c, "ttl")
	p := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "ttl", DisableBatching: true})
	testkit.Produce(t, p, "old", 5)
	clock.Step(45 * time.Second)
	testkit.Produce(t, p, "new", 5)
	clock.Step(30 * time.Second) // old: 75 s, new: 30 s
	mustDo(t, http.MethodPost, b.AdminURL()+nsPath+"/messageTTL", "60", http.StatusNoContent)

	if s := subStats(t, b, "ttl", "sub"); s.MsgBacklog != 10 {
		t.Fatalf("backlog %d before the check: nothing expires until the broker checks", s.MsgBacklog)
	}
	b.RunExpiryCheck()
	s := subStats(t, b, "ttl", "sub")
	if s.MsgBacklog != 5 || s.TotalMsgExpired != 5 || s.LastExpireTimestamp != clock.Now().UnixMilli() {
		t.Fatalf("after expiry: %+v", s)
	}
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "ttl", SubscriptionName: "sub"})
	got := payloads(testkit.ReceiveAndAck(t, cons, 5, waitFor))
	if !slices.Equal(got, []string{"new-0", "new-1", "new-2", "new-3", "new-4"}) {
		t.Fatalf("received %v", got)
	}
	expectNothing(t, cons, 200*time.Millisecond)
}

// A topic's messageTTL overrides its namespace's (HierarchyTopicPolicies).
func TestTopicTTLOverridesNamespaceTTL(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Now())
	b := startWithClock(t, clock, Options{DefaultMessageTTL: 10 * time.Second})
	c := newClient(t, b)
	parkSubscription(t, c, "ttl-topic")
	testkit.Produce(t, testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "ttl-topic"}), "m", 3)
	clock.Step(90 * time.Second)
	mustDo(t, http.MethodPost, b.AdminURL()+nsPath+"/messageTTL", "60", http.StatusNoContent)
	mustDo(t, http.MethodPost, b.AdminURL()+topicPath("ttl-topic")+"/messageTTL?messageTTL=120", "", http.StatusNoContent)
	b.RunExpiryCheck()
	if s := subStats(t, b, "ttl-topic", "sub"); s.MsgBacklog != 3 {
		t.Fatalf("the topic's 120 s TTL must win over the namespace's 60 s: backlog %d", s.MsgBacklog)
	}
	mustDo(t, http.MethodDelete, b.AdminURL()+topicPath("ttl-topic")+"/messageTTL", "", http.StatusNoContent)
	b.RunExpiryCheck()
	if s := subStats(t, b, "ttl-topic", "sub"); s.MsgBacklog != 0 || s.TotalMsgExpired != 3 {
		t.Fatalf("the namespace's 60 s TTL applies once the topic's is removed: %+v", s)
	}
}

// The broker runs the expiry check by itself every
// messageExpiryCheckIntervalInMinutes.
func TestExpiryCheckRunsPeriodically(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Now())
	b := Start(t, Options{Clock: clock.Now, MessageExpiryCheckInterval: 10 * time.Millisecond, DefaultMessageTTL: time.Minute})
	c := newClient(t, b)
	parkSubscription(t, c, "ttl-tick")
	testkit.Produce(t, testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "ttl-tick"}), "m", 2)
	clock.Step(2 * time.Minute)
	testkit.Eventually(t, waitFor, "the periodic check expired the backlog", func() bool {
		return b.Subscription("ttl-tick", "sub").Backlog == 0
	})
}

// The REST shapes of Namespaces and PersistentTopics for messageTTL and
// backlog quotas, with applied=true resolving topic > namespace > broker.
func TestRetentionPolicyREST(t *testing.T) {
	b := Start(t)
	c := newClient(t, b)
	testkit.Produce(t, testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "pol"}), "m", 1)
	ns, tp := b.AdminURL()+nsPath, b.AdminURL()+topicPath("pol")

	// Unset: 200 with an empty body, as the real broker answers a null Integer.
	if got := mustDo(t, http.MethodGet, ns+"/messageTTL", "", http.StatusOK); got != "" {
		t.Fatalf("unset namespace TTL %q", got)
	}
	mustDo(t, http.MethodPost, ns+"/messageTTL", "300", http.StatusNoContent)
	if got := mustDo(t, http.MethodGet, ns+"/messageTTL", "", http.StatusOK); got != "300" {
		t.Fatalf("namespace TTL %q", got)
	}
	if got := mustDo(t, http.MethodGet, tp+"/messageTTL", "", http.StatusOK); got != "" {
		t.Fatalf("unset topic TTL %q", got)
	}
	if got := mustDo(t, http.MethodGet, tp+"/messageTTL?applied=true", "", http.StatusOK); got != "300" {
		t.Fatalf("applied TTL %q", got)
	}
	mustDo(t, http.MethodPost, tp+"/messageTTL?messageTTL=30", "", http.StatusNoContent)
	if got := mustDo(t, http.MethodGet, tp+"/messageTTL?applied=true", "", http.StatusOK); got != "30" {
		t.Fatalf("applied TTL %q after the topic's", got)
	}

	mustDo(t, http.MethodPost, ns+"/backlogQuota?backlogQuotaType=message_age",
		`{"limitSize":-1,"limitTime":3600,"policy":"consumer_backlog_eviction"}`, http.StatusNoContent)
	mustDo(t, http.MethodPost, tp+"/backlogQuota", `{"limit":2048,"policy":"consumer_backlog_eviction"}`, http.StatusNoContent)
	var nsMap, topicMap, appliedMap map[string]backlogQuotaJSON
	testkit.GetJSON(t, ns+"/backlogQuotaMap", &nsMap)
	testkit.GetJSON(t, tp+"/backlogQuotaMap", &topicMap)
	testkit.GetJSON(t, tp+"/backlogQuotaMap?applied=true", &appliedMap)
	ageQuota := backlogQuotaJSON{Limit: -1, LimitSize: -1, LimitTime: 3600, Policy: ConsumerBacklogEviction}
	sizeQuota := backlogQuotaJSON{Limit: 2048, LimitSize: 2048, Policy: ConsumerBacklogEviction}
	if len(nsMap) != 1 || nsMap[QuotaMessageAge] != ageQuota {
		t.Fatalf("namespace map %+v", nsMap)
	}
	if len(topicMap) != 1 || topicMap[QuotaDestinationStorage] != sizeQuota {
		t.Fatalf("topic map %+v", topicMap)
	}
	if appliedMap[QuotaDestinationStorage] != sizeQuota || appliedMap[QuotaMessageAge] != ageQuota {
		t.Fatalf("applied map %+v", appliedMap)
	}
	mustDo(t, http.MethodDelete, ns+"/backlogQuota?backlogQuotaType=message_age", "", http.StatusNoContent)
	testkit.GetJSON(t, tp+"/backlogQuotaMap?applied=true", &appliedMap)
	if want := (backlogQuotaJSON{Limit: -1, LimitSize: -1, LimitTime: -1, Policy: ProducerRequestHold}); appliedMap[QuotaMessageAge] != want {
		t.Fatalf("broker default not applied: %+v", appliedMap[QuotaMessageAge])
	}

	// Bad input gets a clear error and changes nothing.
	for _, bad := range []struct {
		method, url, body string
		code              int
	}{
		{http.MethodPost, ns + "/messageTTL", "-1", http.StatusPreconditionFailed},
		{http.MethodPost, ns + "/messageTTL", "soon", http.StatusBadRequest},
		{http.MethodPost, tp + "/messageTTL?messageTTL=-5", "", http.StatusPreconditionFailed},
		{http.MethodPost, ns + "/backlogQuota", `{"limitSize":1,"policy":"drop_everything"}`, http.StatusBadRequest},
		{http.MethodPost, ns + "/backlogQuota?backlogQuotaType=disk", `{"limitSize":1,"policy":"producer_exception"}`, http.StatusBadRequest},
		{http.MethodPost, ns + "/backlogQuota", `{"limitSize":`, http.StatusBadRequest},
		{http.MethodGet, b.AdminURL() + topicPath("no-such-topic") + "/messageTTL", "", http.StatusNotFound},
	} {
		code, body := testkit.Request(t, bad.method, bad.url, bad.body)
		var reason struct{ Reason string }
		if code != bad.code || json.Unmarshal([]byte(body), &reason) != nil || reason.Reason == "" {
			t.Fatalf("%s %s %q: %d %s, want %d with a reason", bad.method, bad.url, bad.body, code, body, bad.code)
		}
	}
	if got := mustDo(t, http.MethodGet, ns+"/messageTTL", "", http.StatusOK); got != "300" {
		t.Fatalf("a refused update changed the TTL to %q", got)
	}
}

// BacklogQuotaManager.dropBacklogForSizeLimit: past limitSize the slowest
// cursor skips the share of its backlog that brings it to 90% of the limit.
// The consumer is connected but has asked for nothing (zero queue, the
// paused case), so nothing was dispatched before the eviction.
func TestBacklogQuotaEvictsBySize(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Now())
	b := startWithClock(t, clock, Options{})
	c := newClient(t, b)
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "quota-size", SubscriptionName: "sub", EnableZeroQueueConsumer: true})
	testkit.Produce(t, testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "quota-size", DisableBatching: true}), "m", 10)
	stats := adminStats(t, b, "quota-size")
	entry := stats.StorageSize / 10
	if stats.StorageSize != entry*10 || stats.BacklogSize != stats.StorageSize {
		t.Fatalf("entries of unequal size or backlog size wrong: %+v", stats)
	}
	// Limit: 5 entries; target 4.5; skip int(5.5/10 x 10) = 5 entries.
	mustDo(t, http.MethodPost, b.AdminURL()+topicPath("quota-size")+"/backlogQuota?backlogQuotaType=destination_storage",
		fmt.Sprintf(`{"limitSize":%d,"limitTime":-1,"policy":"consumer_backlog_eviction"}`, 5*entry), http.StatusNoContent)
	b.CheckBacklogQuotas()
	if s := subStats(t, b, "quota-size", "sub"); s.MsgBacklog != 5 || s.BacklogSize != 5*entry {
		t.Fatalf("after eviction: %+v", s)
	}
	got := payloads(testkit.ReceiveAndAck(t, cons, 5, waitFor))
	if !slices.Equal(got, []string{"m-5", "m-6", "m-7", "m-8", "m-9"}) {
		t.Fatalf("received %v", got)
	}
}

// BacklogQuotaManager.dropBacklogForTimeLimit: by default whole closed
// ledgers older than limitTime are skipped; with
// preciseTimeBasedBacklogQuotaCheck, messages older than 90% of limitTime.
func TestBacklogQuotaEvictsByAge(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"whole ledgers", Options{EntriesPerLedger: 5}},
		{"precise", Options{PreciseTimeBasedBacklogQuotaCheck: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := clocktesting.NewFakeClock(time.Now())
			b := startWithClock(t, clock, tc.opts)
			c := newClient(t, b)
			parkSubscription(t, c, "quota-age")
			p := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "quota-age", DisableBatching: true})
			testkit.Produce(t, p, "old", 5)
			clock.Step(30 * time.Second)
			testkit.Produce(t, p, "new", 5)
			clock.Step(5 * time.Second) // old: 35 s, new: 5 s
			mustDo(t, http.MethodPost, b.AdminURL()+nsPath+"/backlogQuota?backlogQuotaType=message_age",
				`{"limitSize":-1,"limitTime":20,"policy":"consumer_backlog_eviction"}`, http.StatusNoContent)
			b.CheckBacklogQuotas()
			if s := subStats(t, b, "quota-age", "sub"); s.MsgBacklog != 5 {
				t.Fatalf("after eviction: %+v", s)
			}
			cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "quota-age", SubscriptionName: "sub"})
			if got := payloads(testkit.ReceiveAndAck(t, cons, 5, waitFor)); got[0] != "new-0" || got[4] != "new-4" {
				t.Fatalf("received %v", got)
			}
			expectNothing(t, cons, 200*time.Millisecond)
		})
	}
}

// A quota not exceeded, or with a producer_* policy, moves no cursor.
func TestBacklogQuotaLeavesBacklogBelowLimitOrOtherPolicy(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Now())
	b := startWithClock(t, clock, Options{})
	c := newClient(t, b)
	parkSubscription(t, c, "quota-keep")
	testkit.Produce(t, testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "quota-keep"}), "m", 4)
	size := adminStats(t, b, "quota-keep").StorageSize
	url := b.AdminURL() + topicPath("quota-keep") + "/backlogQuota"
	mustDo(t, http.MethodPost, url, fmt.Sprintf(`{"limitSize":%d,"policy":"consumer_backlog_eviction"}`, size+1), http.StatusNoContent)
	b.CheckBacklogQuotas()
	mustDo(t, http.MethodPost, url, `{"limitSize":1,"policy":"producer_request_hold"}`, http.StatusNoContent)
	b.CheckBacklogQuotas()
	if s := subStats(t, b, "quota-keep", "sub"); s.MsgBacklog != 4 || s.EarliestMsgPublishTimeInBacklog == 0 {
		t.Fatalf("backlog moved: %+v", s)
	}
}

// In a cluster each broker checks the topics it owns; the policies live in
// the shared metadata, so a namespace TTL set through any broker applies.
func TestClusterExpiresOnTheOwner(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Now())
	cl := StartCluster(t, 2, Options{Clock: clock.Now, MessageExpiryCheckInterval: -1, BacklogQuotaCheckInterval: -1})
	if err := cl.MoveTopic("ttl-cluster", 1); err != nil {
		t.Fatal(err)
	}
	c := testkit.NewClient(t, cl.Broker(0).ServiceURL())
	parkSubscription(t, c, "ttl-cluster")
	testkit.Produce(t, testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "ttl-cluster"}), "m", 3)
	clock.Step(time.Hour)
	mustDo(t, http.MethodPost, cl.Broker(0).AdminURL()+nsPath+"/messageTTL", "60", http.StatusNoContent)
	cl.Broker(0).RunExpiryCheck()
	if got := cl.Broker(0).Subscription("ttl-cluster", "sub").Backlog; got != 3 {
		t.Fatalf("a non-owner expired the backlog: %d left", got)
	}
	cl.RunExpiryCheck()
	if got := cl.Broker(0).Subscription("ttl-cluster", "sub").Backlog; got != 0 {
		t.Fatalf("the owner did not expire the backlog: %d left", got)
	}
}

// PersistentTopic.getLastMessageId on a topic without entries answers the
// last confirmed entry (ledgerId, -1); the client reads entry id -1 as "no
// message" (isEntryIDValid), so a reader has nothing next.
func TestLastMessageIDOfAnEmptyTopic(t *testing.T) {
	b := Start(t)
	c := newClient(t, b)
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "empty", SubscriptionName: "sub"})
	ids, err := cons.GetLastMessageIDs()
	if err != nil || len(ids) != 1 || ids[0].EntryID() != -1 {
		t.Fatalf("last message ids %v, %v", ids, err)
	}
	r, err := c.CreateReader(pulsar.ReaderOptions{Topic: "empty", StartMessageID: pulsar.EarliestMessageID()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.HasNext() {
		t.Fatal("a reader of an empty topic has a next message")
	}
	testkit.Produce(t, testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "empty"}), "m", 1)
	if !r.HasNext() {
		t.Fatal("no next message after one was produced")
	}
}
