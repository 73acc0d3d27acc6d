package sidecar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/go-logr/logr/testr"

	"github.com/subflow-dev/subflow/agent/control"
	"github.com/subflow-dev/subflow/agent/protocol"
	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
)

const controlToken = "sidecar-test-token"

// controlAPI is the agent's control server in front of a world's sidecar, reached as the
// controller reaches a pod: HTTP with the bearer token.
type controlAPI struct{ url string }

func startControl(t *testing.T, w *world) *controlAPI {
	t.Helper()
	admin := NewAdmin(AdminOptions{URL: w.admin})
	t.Cleanup(admin.Close)
	srv, err := control.NewForHost(w.sidecar.ControlHost(admin),
		control.Options{Token: controlToken, Logger: testr.NewWithOptions(t, testr.Options{Verbosity: 1})})
	if err != nil {
		t.Fatal(err)
	}
	return &controlAPI{url: "http://" + serveOnLoopback(t, "control server", srv.Serve) + protocol.PathPrefix}
}

// do sends a request and decodes a 200 answer into out; it returns the status code.
func (api *controlAPI) do(t *testing.T, method, path, token string, body, out any) int {
	t.Helper()
	var buf bytes.Buffer
	if body != nil {
		if err := json.NewEncoder(&buf).Encode(body); err != nil {
			t.Fatal(err)
		}
	}
	req, err := http.NewRequest(method, api.url+path, &buf)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode == http.StatusOK && out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode
}

// push PUTs a flow rule as the controller does and returns the pod's answer.
func (api *controlAPI) push(t *testing.T, flow string, req protocol.FlowRequest) protocol.FlowStatus {
	t.Helper()
	var st protocol.FlowStatus
	if code := api.do(t, http.MethodPut, "/flows/ns/"+flow, controlToken, req, &st); code != http.StatusOK {
		t.Fatalf("PUT flow %s: HTTP %d", flow, code)
	}
	return st
}

// awaitSeek pushes req, as the controller does on every reconcile, until the pod reports its
// seek finished, and returns that report.
func (api *controlAPI) awaitSeek(t *testing.T, flow string, req protocol.FlowRequest) *protocol.SeekStatus {
	t.Helper()
	var seek *protocol.SeekStatus
	eventually(t, "the seek to finish", func() bool {
		seek = api.push(t, flow, req).Seek
		return seek != nil && seek.State != protocol.SeekRunning
	})
	return seek
}

func consumerStates(st protocol.FlowStatus) []protocol.State {
	var out []protocol.State
	for _, c := range st.Consumers {
		out = append(out, c.State)
	}
	return out
}

// The controller drives a sidecar pod through the agent's control API, unchanged, for each
// client: a wrong token changes nothing; a pushed Paused rule pauses the application's
// consumer (no FLOW reaches the broker, nothing produced meanwhile reaches the application)
// and the answer names the pod a sidecar with its consumer Paused; a rule naming a
// subscription nobody consumes matches nothing and names what the pod does consume; Stopped
// closes the consumer on the broker; Running delivers everything.
func TestControlAPIDrivesTheSidecar(t *testing.T) {
	forEachPeer(t, func(t *testing.T, lang string) {
		w := newWorld(t, Options{Name: "pod-" + lang})
		api := startControl(t, w)
		topic, name := uniqueTopic(t), "app-"+lang
		producer := newClient(t, w.url)
		app := startPeer(t, lang, w.url, peerOptions{topic: topic, subscription: "s", name: name, subType: "Exclusive", queue: 10})
		before := produceUnbatched(t, producer, topic, "m", 0, 20)
		eventually(t, "the application to receive the first 20", func() bool { return len(missing(before, app.messages())) == 0 })

		rule := protocol.FlowRequest{UID: "uid-1", Revision: 1, Subscription: "s", Topic: topic, State: protocol.Paused}
		if code := api.do(t, http.MethodPut, "/flows/ns/orders", "wrong", rule, nil); code != http.StatusUnauthorized {
			t.Fatalf("a wrong token got HTTP %d, want 401", code)
		}
		c := consumerNamed(t, w.sidecar, "s", name)
		if st := c.Status().State; st != protocol.Running {
			t.Fatalf("after a refused push the consumer is %s, want Running", st)
		}

		awaitBrokerCredit(t, w, "s", name)
		st := api.push(t, "orders", rule)
		mark := w.rec.Mark()
		if st.Kind != protocol.KindSidecar || st.Pod != "pod-"+lang || !slices.Equal(consumerStates(st), []protocol.State{protocol.Paused}) {
			t.Fatalf("the answer to Paused is kind %q pod %q consumers %v, want sidecar pod-%s [Paused]", st.Kind, st.Pod, consumerStates(st), lang)
		}
		during := produceUnbatched(t, producer, topic, "m", 20, 40)
		eventually(t, "messages sent under earlier permits to be held", func() bool { return c.Counts().Held > 0 })
		onWire := wirerec.Filter{Subscription: "s", ConsumerName: name, Since: mark}
		if permits := w.rec.Permits(onWire); permits != 0 {
			t.Errorf("%d permits reached the broker after the pod answered Paused", permits)
		}
		if leaked := common(during, app.messages()); len(leaked) > 0 {
			t.Errorf("messages produced during the pause reached the application: %v", leaked)
		}

		typo := api.push(t, "typo", protocol.FlowRequest{UID: "uid-2", Revision: 1, Subscription: "s-typo", State: protocol.Paused})
		if len(typo.Consumers) != 0 || !slices.Contains(typo.OtherConsumers, protocol.ConsumerRef{Subscription: "s", Topic: topic}) {
			t.Errorf("a rule for a subscription nobody consumes answered consumers %v, others %v", typo.Consumers, typo.OtherConsumers)
		}
		var state protocol.AgentState
		if code := api.do(t, http.MethodGet, "/state", controlToken, nil, &state); code != http.StatusOK || state.Kind != protocol.KindSidecar || len(state.Flows) != 2 {
			t.Errorf("GET /state: HTTP %d kind %q flows %d, want 200 sidecar 2", code, state.Kind, len(state.Flows))
		}

		rule.Revision, rule.State = 2, protocol.Stopped
		if st := api.push(t, "orders", rule); !slices.Equal(consumerStates(st), []protocol.State{protocol.Stopped}) {
			t.Fatalf("the answer to Stopped has consumers %v", consumerStates(st))
		}
		if closes := w.rec.Events(onWire, pb.BaseCommand_CLOSE_CONSUMER); len(closes) == 0 {
			t.Error("Stopped did not close the consumer on the broker")
		}

		rule.Revision, rule.State = 3, protocol.Running
		if st := api.push(t, "orders", rule); !slices.Equal(consumerStates(st), []protocol.State{protocol.Running}) {
			t.Fatalf("the answer to Running has consumers %v", consumerStates(st))
		}
		all := append(before, during...)
		eventually(t, "the application to receive all 40 after Running", func() bool { return len(missing(all, app.messages())) == 0 })
	})
}

// A seek the controller asks a sidecar pod to execute, for each client, while the flow is
// paused: the cursor moves back to the target index, the broker closes the consumer and the
// client subscribes again through the sidecar, still paused (no FLOW reaches the broker and
// nothing is replayed yet); resumed, the application gets the messages from the target on
// again, and none before it, and the subscription ends with nothing unacknowledged. In batches
// (LZ4-compressed, 10 messages each) the target is the sixth message of the first entry, which
// the broker delivers again from its first: the sidecar cuts it to begin at the target.
func TestSeekExecutedBySidecar(t *testing.T) {
	for name, opts := range map[string]pulsar.ProducerOptions{
		"unbatched": {DisableBatching: true},
		"batched":   {CompressionType: pulsar.LZ4, BatchingMaxMessages: 10, BatchingMaxPublishDelay: time.Minute},
	} {
		t.Run(name, func(t *testing.T) { forEachPeer(t, func(t *testing.T, lang string) { seekWhilePaused(t, lang, opts) }) })
	}
}

func seekWhilePaused(t *testing.T, lang string, opts pulsar.ProducerOptions) {
	w := newWorld(t, Options{Name: "pod-" + lang})
	api := startControl(t, w)
	topic, name := uniqueTopic(t), "app-"+lang
	producer := newClient(t, w.url)
	app := startPeer(t, lang, w.url, peerOptions{topic: topic, subscription: "s", name: name, subType: "Shared"})
	opts.Topic = topic
	sent := produceWith(t, producer, opts, "m", 0, 20)
	eventually(t, "the application to receive 20", func() bool { return len(missing(sent, app.messages())) == 0 })
	// Acknowledgements the client still groups would reach the broker after the reset and
	// cancel the replay of those messages (docs/sidecar.md, Limits).
	eventually(t, "the broker to have every acknowledgement", func() bool { return w.unacked(t, topic, "s") == 0 })

	rule := protocol.FlowRequest{UID: "uid-1", Revision: 1, Subscription: "s", State: protocol.Paused}
	api.push(t, "orders", rule)
	mark := w.rec.Mark()
	index := int64(5)
	rule.Revision, rule.Seek = 2, &protocol.SeekRequest{ID: "seek-1", Index: &index, Execute: true}
	seek := api.awaitSeek(t, "orders", rule)
	if seek.State != protocol.SeekSucceeded || len(seek.Positions) != 1 || seek.Positions[0].Index != 5 {
		t.Fatalf("the sidecar's seek reported %+v, want Succeeded at index 5", *seek)
	}
	if batched := !opts.DisableBatching; batched != strings.HasSuffix(seek.Positions[0].MessageID, ":5") {
		t.Fatalf("the target is %s; want batch index 5 in batches, none unbatched", seek.Positions[0].MessageID)
	}
	c := consumerNamed(t, w.sidecar, "s", name)
	eventually(t, "the client to subscribe again, paused", func() bool { return c.Status().Connected })
	onWire := wirerec.Filter{Subscription: "s", ConsumerName: name, Since: mark}
	if permits := w.rec.Permits(onWire); permits != 0 {
		t.Errorf("%d permits reached the broker while paused across the seek", permits)
	}
	if n := app.count(); n != 20 {
		t.Errorf("the application received %d messages while paused, want the 20 from before", n)
	}

	rule.Revision, rule.State = 3, protocol.Running
	rule.Seek.Execute, rule.Seek.Succeeded, rule.Seek.Positions = false, true, seek.Positions
	api.push(t, "orders", rule)
	app.awaitReplay(t, "the application to receive m-5 to m-19 again", func() bool { return app.count() >= 35 })
	eventually(t, "the broker to have every acknowledgement after the replay", func() bool { return w.unacked(t, topic, "s") == 0 })
	counts := map[string]int{}
	for _, m := range app.messages() {
		counts[m]++
	}
	for i, v := range sent {
		if want := 1 + min(1, i/5); counts[v] != want && !(i >= 5 && counts[v] > 2) {
			t.Errorf("%s reached the application %d times, want %d", v, counts[v], want)
		}
	}
}

// A seek of a partitioned topic executed by a sidecar, whose consumers each read one
// partition: every partition's cursor moves back to its start, and resumed, the application
// gets everything again.
func TestPartitionedSeekExecutedBySidecar(t *testing.T) {
	forEachPeer(t, func(t *testing.T, lang string) {
		w := newWorld(t, Options{Name: "pod-" + lang})
		api := startControl(t, w)
		topic, name := uniqueTopic(t), "app-"+lang
		w.createPartitioned(t, topic, 2)
		producer := newClient(t, w.url)
		app := startPeer(t, lang, w.url, peerOptions{topic: topic, subscription: "s", name: name, subType: "Shared"})
		sent := produceUnbatched(t, producer, topic, "m", 0, 20)
		eventually(t, "the application to receive 20", func() bool { return len(missing(sent, app.messages())) == 0 })
		for p := range 2 {
			partition := fmt.Sprintf("%s-partition-%d", topic, p)
			eventually(t, "the broker to have every acknowledgement on "+partition, func() bool { return w.unacked(t, partition, "s") == 0 })
		}

		rule := protocol.FlowRequest{UID: "uid-1", Revision: 1, Subscription: "s", Topic: topic, State: protocol.Paused,
			Seek: &protocol.SeekRequest{ID: "seek-1", Partitions: []protocol.PartitionIndex{{Partition: 0, Index: 0}, {Partition: 1, Index: 0}}, Execute: true}}
		seek := api.awaitSeek(t, "orders", rule)
		if seek.State != protocol.SeekSucceeded || len(seek.Positions) != 2 {
			t.Fatalf("the sidecar's seek reported %+v, want Succeeded on both partitions", *seek)
		}
		rule.Revision, rule.State = 2, protocol.Running
		rule.Seek.Execute, rule.Seek.Succeeded, rule.Seek.Positions = false, true, seek.Positions
		api.push(t, "orders", rule)
		app.awaitReplay(t, "the application to receive all 20 again", func() bool { return app.count() >= 40 })
	})
}

func TestPartitionOf(t *testing.T) {
	for topic, want := range map[string]int32{
		"persistent://public/default/t":                         -1,
		"persistent://public/default/t-partition-3":             3,
		"persistent://public/default/t-partition-x":             -1,
		"persistent://public/default/a-partition-1-partition-2": 2,
	} {
		if got := partitionOf(topic); got != want {
			t.Errorf("partitionOf(%q) = %d, want %d", topic, got, want)
		}
	}
}

// unacked reads the subscription's backlog and unacknowledged messages from the admin API.
func (w *world) unacked(t *testing.T, topic, subscription string) int64 {
	t.Helper()
	var stats struct {
		Subscriptions map[string]struct {
			MsgBacklog      int64 `json:"msgBacklog"`
			UnackedMessages int64 `json:"unackedMessages"`
		} `json:"subscriptions"`
	}
	testkit.GetJSON(t, w.admin+"/admin/v2/persistent/"+strings.TrimPrefix(topic, "persistent://")+"/stats", &stats)
	sub := stats.Subscriptions[subscription]
	return sub.MsgBacklog + sub.UnackedMessages
}
