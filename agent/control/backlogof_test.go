package control_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"

	"github.com/subflow-dev/subflow/agent"
	"github.com/subflow-dev/subflow/agent/control"
	"github.com/subflow-dev/subflow/agent/protocol"
	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
)

// backlogBy returns the answer's entries about subscription.
func backlogBy(st protocol.FlowStatus, subscription string) []protocol.BacklogStatus {
	var out []protocol.BacklogStatus
	for _, b := range st.Backlog {
		if b.Subscription == subscription {
			out = append(out, b)
		}
	}
	return out
}

// subscribeAndAck subscribes "other" to topic (so that it exists before anything is produced)
// and returns a function that receives and acknowledges n messages with it.
func subscribeAndAck(t *testing.T, b *pulsartest.Broker, topic string) func(n int) {
	t.Helper()
	client, err := pulsar.NewClient(pulsar.ClientOptions{URL: b.ServiceURL(), Logger: log.DefaultNopLogger()})
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "other", Type: pulsar.Shared,
		ReceiverQueueSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); client.Close() })
	return func(n int) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for range n {
			msg, err := c.Receive(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Ack(msg); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// The high-priority subscription "other" lags on the flow's topic: the flow's reporter, asked
// for other's backlog, reports it (produced and not acknowledged by other), named, beside its
// own; a subscription the topic does not have is reported unknown, saying so. A later push
// that drops other stops its reads, and one that asks for nothing stops every read of the topic.
func TestBacklogOfReportsAnotherSubscriptionsBacklog(t *testing.T) {
	b := pulsartest.Start(t)
	suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
	topic := "persistent://public/default/backlogof-a-" + suffix
	clockTopic := "persistent://public/default/backlogof-clock-" + suffix
	ackOther := subscribeAndAck(t, b, topic)
	admin := newAdminGate(t, b.AdminURL(), "never-held")
	p := startTestPodWith(t, b, agent.Options{Name: "pod-a", AdminURL: admin.url, BacklogRefresh: 20 * time.Millisecond},
		topic, false, control.Options{})
	produce(t, b, topic, 10)
	ackOther(3)
	eventually(t, "other's acks to reach the broker", func() bool { return b.Subscription(topic, "other").Acked == 3 })

	req := protocol.FlowRequest{UID: "uid-shed", Revision: 1, Subscription: "sub", Topic: topic, State: protocol.Paused,
		ReportBacklog: true, BacklogOf: []string{"other", "missing"}}
	var st protocol.FlowStatus
	eventually(t, "the backlogs of sub, other and missing", func() bool {
		var code int
		code, st = putAt(t, p.addr, "shed", req)
		own, other, missing := backlogBy(st, "sub"), backlogBy(st, "other"), backlogBy(st, "missing")
		return code == http.StatusOK && len(st.Backlog) == 3 && len(own) == 1 && own[0].Messages == 10 &&
			len(other) == 1 && other[0].Messages == 7 && len(missing) == 1
	})
	if other := backlogBy(st, "other")[0]; other.Unknown != "" || other.Topic != topic || other.Bytes <= 0 {
		t.Fatalf("other's backlog %+v, want 7 messages read on %s", other, topic)
	}
	if m := backlogBy(st, "missing")[0]; !strings.Contains(m.Unknown, `subscription "missing" does not exist on the topic`) {
		t.Fatalf("a subscription the topic does not have: %+v, want unknown saying it does not exist", m)
	}

	// Dropped from the next push: other's entry is gone at once, sub's stays.
	req.Revision, req.BacklogOf = 2, nil
	code, st := putAt(t, p.addr, "shed", req)
	if code != http.StatusOK || len(st.Backlog) != 1 || st.Backlog[0].Subscription != "sub" || st.Backlog[0].Messages != 10 {
		t.Fatalf("after other was dropped: %d %+v, want sub's backlog only", code, st.Backlog)
	}

	// Nothing asked: no entry, and no read of the topic any more, while another flow's reads
	// (on clockTopic) go on.
	req.Revision, req.ReportBacklog = 3, false
	if code, st := putAt(t, p.addr, "shed", req); code != http.StatusOK || len(st.Backlog) != 0 {
		t.Fatalf("a push asking for no backlog: %d %+v, want none", code, st.Backlog)
	}
	reads := admin.requests("backlogof-a-" + suffix)
	clock := protocol.FlowRequest{UID: "uid-clock", Revision: 1, Subscription: "sub", Topic: clockTopic,
		State: protocol.Running, BacklogOf: []string{"other"}}
	if code, _ := putAt(t, p.addr, "clock", clock); code != http.StatusOK {
		t.Fatalf("the clock flow: %d", code)
	}
	eventually(t, "ten reads of the clock flow's topic", func() bool {
		return admin.requests("backlogof-clock-"+suffix+"/partitions") >= 10 // the first call of each read
	})
	// A stopped read is cancelled, but the one request it had sent may reach the admin API
	// late on a busy machine: at most one per watch stopped (sub's, other's, missing's). A
	// watch still running would have read as often as the clock flow's, four requests a read.
	if late := admin.requests("backlogof-a-"+suffix) - reads; late > 3 {
		t.Fatalf("the topic was read %d more times after no flow asked for its backlog", late)
	}
}

// Other subscriptions are bounded and checked: 9 of them, an empty name, a name twice, a
// control character or a name longer than 256 bytes are refused with 400, the rule unchanged.
func TestBacklogOfRefusesInvalidLists(t *testing.T) {
	ts := newServer(t, control.Options{Token: token})
	url := ts.URL + protocol.PathPrefix + "/flows/ns/f"
	if code, out := call(t, http.MethodPut, url, token, flowBody(1, protocol.Paused, `,"backlogOf":["a","b","c","d","e","f","g","h"]`)); code != http.StatusOK {
		t.Fatalf("8 other subscriptions: %d %s, want 200", code, out)
	}
	for _, tc := range []struct{ name, list, want string }{
		{"nine", `["a","b","c","d","e","f","g","h","i"]`, "backlogOf names 9 subscriptions: at most 8"},
		{"an empty name", `["a",""]`, "backlogOf[1] is empty"},
		{"a name twice", `["a","b","a"]`, `backlogOf[2] "a" appears twice`},
		{"a control character", `["a\nb"]`, `backlogOf[0] "a\nb" holds a control character`},
		{"a name too long", `["` + strings.Repeat("x", 257) + `"]`, "backlogOf[0] is 257 bytes long: at most 256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := call(t, http.MethodPut, url, token, flowBody(2, protocol.Running, `,"backlogOf":`+tc.list))
			e := errorReason(t, out)
			if code != http.StatusBadRequest || e.Reason != protocol.ReasonBadRequest || e.ProtocolVersion != protocol.Version ||
				!strings.Contains(e.Message, tc.want) {
				t.Fatalf("%d %s, want 400 BadRequest saying %s", code, out, tc.want)
			}
		})
	}
	if got := flows(t, ts.URL); len(got) != 1 || got[0].AppliedRevision != 1 || got[0].State != protocol.Paused {
		t.Fatalf("refused pushes changed the rule: %+v", got)
	}
	if code, _ := call(t, http.MethodPut, url, token, flowBody(2, protocol.Running, `,"backlogOf":["`+strings.Repeat("x", 256)+`"]`)); code != http.StatusOK {
		t.Fatalf("a name of 256 bytes: %d, want 200", code)
	}
}

// A controller that sets backlogOf requires the feature: this agent has it, applies the push
// and names the subscription of every entry, its own included (this agent has no admin URL:
// the entries say so).
func TestRequiringBacklogOfIsAccepted(t *testing.T) {
	ts := newServer(t, control.Options{Token: token})
	url := ts.URL + protocol.PathPrefix + "/flows/ns/f"
	body := flowBody(1, protocol.Paused, `,"reportBacklog":true,"backlogOf":["priority"]`)
	var st protocol.FlowStatus
	eventually(t, "both backlog entries", func() bool {
		code, out := callRaw(t, http.MethodPut, url, map[string]string{"Authorization": "Bearer " + token,
			"Content-Type": "application/json", protocol.RequiresHeader: "backlogOf", protocol.VersionHeader: "3"}, body)
		if code != http.StatusOK {
			t.Fatalf("a push requiring backlogOf: %d %s, want 200", code, out)
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatal(err)
		}
		return len(st.Backlog) == 2
	})
	if st.Backlog[0].Subscription != "sub" || st.Backlog[1].Subscription != "priority" || len(st.IgnoredFields) != 0 ||
		!strings.Contains(st.Backlog[1].Unknown, "no admin URL") {
		t.Fatalf("answer %+v, want the entries of sub and priority, each named, unknown for want of an admin URL", st)
	}
}
