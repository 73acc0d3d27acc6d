package pulsartest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsaradmin/pkg/admin"
	"github.com/apache/pulsar-client-go/pulsaradmin/pkg/admin/config"
	"github.com/apache/pulsar-client-go/pulsaradmin/pkg/utils"

	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

func newAdmin(t *testing.T, b *Broker) admin.Client {
	t.Helper()
	a, err := admin.New(&config.Config{WebServiceURL: b.AdminURL()})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func adminTopic(t *testing.T, name string) utils.TopicName {
	t.Helper()
	tn, err := utils.GetTopicName(name)
	if err != nil {
		t.Fatal(err)
	}
	return *tn
}

func get(t *testing.T, url string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body []byte
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		body = append(body, buf[:n]...)
		if err != nil {
			break
		}
	}
	return resp, body
}

func TestAdminInternalStatsShowLedgers(t *testing.T) {
	b := Start(t, Options{EntriesPerLedger: 4})
	c := newClient(t, b)
	testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "stats-ledgers", SubscriptionName: "sub"})
	testkit.Produce(t, testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "stats-ledgers", DisableBatching: true}), "m", 10)

	st, err := newAdmin(t, b).Topics().GetInternalStats(adminTopic(t, "stats-ledgers"))
	if err != nil {
		t.Fatal(err)
	}
	if st.NumberOfEntries != 10 || len(st.Ledgers) != 3 || st.CurrentLedgerEntries != 2 {
		t.Fatalf("internal stats %+v", st)
	}
	// As in Pulsar, closed ledgers carry their entry count and the open one 0.
	if st.Ledgers[0].Entries != 4 || st.Ledgers[1].Entries != 4 || st.Ledgers[2].Entries != 0 {
		t.Fatalf("ledgers %+v", st.Ledgers)
	}
	last := st.Ledgers[2].LedgerID
	if st.LastConfirmedEntry != fmt.Sprintf("%d:1", last) {
		t.Fatalf("lastConfirmedEntry %s", st.LastConfirmedEntry)
	}
	cur, ok := st.Cursors["sub"]
	if !ok || cur.MarkDeletePosition != fmt.Sprintf("%d:-1", st.Ledgers[0].LedgerID) {
		t.Fatalf("cursor %+v", st.Cursors)
	}
}

func TestAdminMessageByIDCarriesBrokerEntryHeaders(t *testing.T) {
	b := Start(t)
	c := newClient(t, b)
	p := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "by-id", BatchingMaxMessages: 5, BatchingMaxPublishDelay: time.Hour})
	testkit.ProduceAsync(t, p, "m", 10, nil) // two entries of five
	st, err := newAdmin(t, b).Topics().GetInternalStats(adminTopic(t, "by-id"))
	if err != nil || st.NumberOfEntries != 2 {
		t.Fatalf("stats %+v, %v", st, err)
	}
	ledger := st.Ledgers[0].LedgerID
	resp, _ := get(t, fmt.Sprintf("%s/admin/v2/persistent/public/default/by-id/ledger/%d/entry/1", b.AdminURL(), ledger))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if got := resp.Header.Get("X-Pulsar-Broker-Entry-METADATA-index"); got != "9" {
		t.Fatalf("index header %q, want the entry's last index 9", got)
	}
	if resp.Header.Get("X-Pulsar-num-batch-message") != "5" || resp.Header.Get("X-Pulsar-Broker-Entry-METADATA-timestamp") == "" {
		t.Fatalf("headers %v", resp.Header)
	}
	msgs, err := newAdmin(t, b).Subscriptions().GetMessagesByID(adminTopic(t, "by-id"), ledger, 1)
	if err != nil || len(msgs) != 5 || string(msgs[0].Payload) != "m-5" {
		t.Fatalf("pulsaradmin read %d messages: %v", len(msgs), err)
	}
	// Past the current ledger's last entry the broker fails the read (500,
	// "LastConfirmedEntry is ..."); an unknown ledger is not found.
	if resp, _ := get(t, fmt.Sprintf("%s/admin/v2/persistent/public/default/by-id/ledger/%d/entry/7", b.AdminURL(), ledger)); resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("entry past the end answered %d", resp.StatusCode)
	}
	if resp, _ := get(t, fmt.Sprintf("%s/admin/v2/persistent/public/default/by-id/ledger/%d/entry/0", b.AdminURL(), ledger+1000)); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("entry of an unknown ledger answered %d", resp.StatusCode)
	}
}

func TestAdminMessageIDByIndex(t *testing.T) {
	cases := []struct {
		name   string
		opts   Options
		status int
	}{
		{"enabled", Options{EntriesPerLedger: 2}, http.StatusOK},
		{"no index metadata", Options{DisableIndexMetadata: true}, http.StatusPreconditionFailed},
		{"before PIP-415", Options{DisableIndexLookup: true}, http.StatusNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := Start(t, tc.opts)
			c := newClient(t, b)
			ids := testkit.Produce(t, testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "by-index", DisableBatching: true}), "m", 5)
			resp, body := get(t, b.AdminURL()+"/admin/v2/persistent/public/default/by-index/getMessageIdByIndex?index=3")
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			if tc.status != http.StatusOK {
				return
			}
			var id utils.MessageID
			if err := json.Unmarshal(body, &id); err != nil {
				t.Fatal(err)
			}
			if id.LedgerID != ids[3].LedgerID() || id.EntryID != ids[3].EntryID() {
				t.Fatalf("index 3 is %+v, want %v", id, ids[3])
			}
			if resp, _ := get(t, b.AdminURL()+"/admin/v2/persistent/public/default/by-index/getMessageIdByIndex?index=99"); resp.StatusCode != http.StatusNotFound {
				t.Fatalf("index past the end answered %d", resp.StatusCode)
			}
		})
	}
}

func TestAdminResetCursorAndStats(t *testing.T) {
	b := Start(t)
	c := newClient(t, b)
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "reset", SubscriptionName: "sub", Name: "c1", ReceiverQueueSize: 20})
	ids := testkit.Produce(t, testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "reset", DisableBatching: true}), "m", 10)
	testkit.ReceiveAndAck(t, cons, 10, waitFor)
	adm := newAdmin(t, b)
	testkit.Eventually(t, waitFor, "acks applied", func() bool { return b.Subscription("reset", "sub").Backlog == 0 })

	target := utils.MessageID{LedgerID: ids[6].LedgerID(), EntryID: ids[6].EntryID(), PartitionIndex: -1}
	if err := adm.Subscriptions().ResetCursorToMessageID(adminTopic(t, "reset"), "sub", target); err != nil {
		t.Fatal(err)
	}
	if got := payloads(testkit.ReceiveAndAck(t, cons, 4, waitFor)); got[0] != "m-6" {
		t.Fatalf("after reset got %v", got)
	}
	var stats utils.TopicStats
	testkit.Eventually(t, waitFor, "stats settle", func() bool {
		var err error
		stats, err = adm.Topics().GetStats(adminTopic(t, "reset"))
		return err == nil && len(stats.Subscriptions["sub"].Consumers) == 1 && stats.Subscriptions["sub"].MsgBacklog == 0
	})
	cs := stats.Subscriptions["sub"].Consumers[0]
	snap := b.Subscription("reset", "sub").Consumers[0]
	if cs.ConsumerName != "c1" || int64(cs.AvailablePermits) != snap.Permits || cs.MsgOutCounter != 4 || cs.UnAckedMessages != 0 {
		t.Fatalf("consumer stats %+v, broker view %+v", cs, snap)
	}
	if stats.MsgCounterIn != 10 {
		t.Fatalf("msgInCounter %d", stats.MsgCounterIn)
	}
}

func TestAdminCreatePartitionedTopic(t *testing.T) {
	b := Start(t)
	req, _ := http.NewRequest(http.MethodPut, b.AdminURL()+"/admin/v2/persistent/public/default/made/partitions", strings.NewReader("2"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("create: %v %v", resp, err)
	}
	resp.Body.Close()
	if n := b.partitionsOf(mustFull("made")); n != 2 {
		t.Fatalf("partitions %d", n)
	}
	_, body := get(t, b.AdminURL()+"/admin/v2/persistent/public/default/made/partitions")
	if !strings.Contains(string(body), strconv.Quote("partitions")+":2") {
		t.Fatalf("metadata %s", body)
	}
}

func TestTopicNames(t *testing.T) {
	cases := map[string]string{
		"t":                              "persistent://public/default/t",
		"tenant/ns/t":                    "persistent://tenant/ns/t",
		"persistent://public/default/t":  "persistent://public/default/t",
		"persistent://a/b/t-partition-3": "persistent://a/b/t-partition-3",
		"persistent://a/b/deep/name":     "persistent://a/b/deep/name",
	}
	for in, want := range cases {
		tn, err := parseTopic(in)
		if err != nil || tn.full != want {
			t.Errorf("parseTopic(%q) = %q, %v; want %q", in, tn.full, err, want)
		}
	}
	tn, _ := parseTopic("persistent://a/b/t-partition-3")
	if tn.partition != 3 || tn.base() != "persistent://a/b/t" {
		t.Errorf("partition %d base %s", tn.partition, tn.base())
	}
	for _, bad := range []string{"", "a/b", "non-persistent://a/b/c", "a//c"} {
		if _, err := parseTopic(bad); err == nil {
			t.Errorf("parseTopic(%q) accepted", bad)
		}
	}
}

func TestUpdatePartitionedTopicOnlyGrows(t *testing.T) {
	b := Start(t)
	if err := b.UpdatePartitionedTopic("missing", 3); err == nil {
		t.Fatal("updated a topic that does not exist")
	}
	if err := b.CreatePartitionedTopic("grow", 2); err != nil {
		t.Fatal(err)
	}
	if err := b.UpdatePartitionedTopic("grow", 2); err == nil {
		t.Fatal("an update to the same count was accepted")
	}
	if err := b.UpdatePartitionedTopic("persistent://public/default/grow", 4); err != nil {
		t.Fatal(err)
	}
	if got := b.partitionsOf("persistent://public/default/grow"); got != 4 {
		t.Fatalf("partitions = %d, want 4", got)
	}
}

// POST .../partitions grows a partitioned topic as PersistentTopicsBase's
// update does, and a client subscribed to it finds the new partition.
func TestAdminUpdatePartitionedTopic(t *testing.T) {
	b := Start(t)
	url := b.AdminURL() + topicPath("upd") + "/partitions"
	mustDo(t, http.MethodPost, url, "3", http.StatusConflict) // not partitioned
	mustDo(t, http.MethodPut, url, "1", http.StatusNoContent)
	c := newClient(t, b)
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "upd", SubscriptionName: "sub", AutoDiscoveryPeriod: 50 * time.Millisecond})
	for _, bad := range []struct {
		body string
		code int
	}{{"0", http.StatusNotAcceptable}, {"-2", http.StatusNotAcceptable}, {"1", http.StatusConflict}, {"x", http.StatusBadRequest}} {
		mustDo(t, http.MethodPost, url, bad.body, bad.code)
	}
	if got := b.partitionsOf("persistent://public/default/upd"); got != 1 {
		t.Fatalf("refused updates changed the topic: %d partitions", got)
	}
	mustDo(t, http.MethodPost, url, "2", http.StatusNoContent)
	var meta struct{ Partitions int }
	testkit.GetJSON(t, url, &meta)
	if meta.Partitions != 2 {
		t.Fatalf("partition metadata after the update: %+v", meta)
	}
	// The consumer subscribes to the new partition; a message there reaches it.
	testkit.Eventually(t, waitFor, "the consumer subscribed to the new partition", func() bool {
		return len(b.Subscription("persistent://public/default/upd-partition-1", "sub").Consumers) > 0
	})
	testkit.Produce(t, testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "upd-partition-1"}), "new", 1)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if m, err := cons.Receive(ctx); err != nil || string(m.Payload()) != "new-0" {
		t.Fatalf("message on the new partition: %v %v", m, err)
	}
}

// PersistentTopicsBase.internalGetPartitionedMetadataAsync, the same in 4.0.7 and 4.2.4: GET
// .../partitions of a topic that does not exist answers 404 "Topic ... not found", unless the
// caller passes checkAllowAutoCreation=true (auto-creation is on, as by default); a
// non-partitioned topic that exists answers {partitions: 0}.
func TestAdminPartitionsOfMissingTopic(t *testing.T) {
	b := Start(t)
	base := b.AdminURL() + topicPath("")
	resp, body := get(t, base+"nowhere/partitions")
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), "Topic persistent://public/default/nowhere not found") {
		t.Errorf("missing topic: %d %s, want 404 naming it", resp.StatusCode, body)
	}
	resp, body = get(t, base+"nowhere/partitions?checkAllowAutoCreation=true")
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(body)) != `{"partitions":0,"deleted":false}` {
		t.Errorf("missing topic with checkAllowAutoCreation: %d %s, want 200 {partitions: 0}", resp.StatusCode, body)
	}
	if err := b.AppendEntries("here", 1, 1); err != nil {
		t.Fatal(err)
	}
	if resp, body = get(t, base+"here/partitions"); resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"partitions":0`) {
		t.Errorf("existing non-partitioned topic: %d %s", resp.StatusCode, body)
	}
	if err := b.CreatePartitionedTopic("parted", 2); err != nil {
		t.Fatal(err)
	}
	if resp, body = get(t, base+"parted-partition-1/partitions"); resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"partitions":0`) {
		t.Errorf("partition of a partitioned topic: %d %s", resp.StatusCode, body)
	}
}
