package controllers_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/testing/podsim"
	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

func heldTotal(f *subflowv1.SubscriptionFlow) int64 {
	var n int64
	for _, a := range f.Status.Agents {
		n += a.HeldMessages
	}
	return n
}

// TestFailedSeekDropsNothing: a seek that fails (the broker keeps no entry indexes) leaves
// every message the agents hold where it was; after resume each produced message is delivered
// without any reconnect needed to recover stranded ones.
func TestFailedSeekDropsNothing(t *testing.T) {
	noIndex, err := pulsartest.New(pulsartest.Options{DisableIndexMetadata: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = noIndex.Close() })
	ns := namespace(t, true)
	topic := "noindex-" + ns
	var pods []*podsim.Pod
	for i := range 2 {
		name := fmt.Sprintf("worker-%d", i)
		p, err := podsim.Start(podsim.Options{Name: name, ServiceURL: noIndex.ServiceURL(), AdminURL: noIndex.AdminURL(),
			Token: testToken, Topic: topic, Subscription: "ingest", Type: pulsar.Shared, ReceiverQueueSize: 10,
			ProcessingTime: 5 * time.Millisecond}) // a slow downstream: the client's queue stays full
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		createPod(t, ns, name, p.Port)
		pods = append(pods, p)
	}
	flow := newFlow(ns, "noindex", topic, subflowv1.StateRunning)
	create(t, flow)
	waitFlow(t, flow, "Ready", func(f *subflowv1.SubscriptionFlow) bool { return isTrue(f, subflowv1.ConditionReady) && current(f) })

	// Pause while a backlog streams in, so that the gates hold messages.
	const total = 500
	client := testkit.Client(t, pulsar.ClientOptions{URL: noIndex.ServiceURL(), Logger: nopLogger})
	producer := testkit.NewProducer(t, client, pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	for i := range total {
		producer.SendAsync(context.Background(), &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("m-%d", i))}, nil)
		if i == total/10 {
			// Pause once messages flow to the pods, so that the rest streams into held gates.
			eventually(t, "the first messages delivered", func() bool { return totalReceived(pods...) >= 10 })
			patchFlow(t, flow, `{"spec":{"state":"Paused"}}`)
		}
	}
	if err := producer.Flush(); err != nil {
		t.Fatal(err)
	}
	paused := waitFlow(t, flow, "Paused", func(f *subflowv1.SubscriptionFlow) bool { return isTrue(f, subflowv1.ConditionPaused) && current(f) })
	held := heldTotal(paused)
	t.Logf("held by the gates at the pause: %d; delivered before it: %d", held, totalReceived(pods...))
	if held == 0 {
		t.Fatal("no message held at the pause: the test would prove nothing")
	}

	patchFlow(t, flow, `{"spec":{"seek":{"id":"replay","index":5}}}`)
	failed := waitFlow(t, flow, "the seek to fail", func(f *subflowv1.SubscriptionFlow) bool {
		c := condition(f, subflowv1.ConditionSeekCompleted)
		return c != nil && c.Reason == subflowv1.ReasonIndexMetadataDisabled
	})
	waitEvent(t, ns, "noindex", "SeekFailed", 1)
	if n := flowEvents(t, ns, "noindex")["SeekCompleted"]; n != 0 {
		t.Fatalf("%d SeekCompleted events for a failed seek", n)
	}
	if got := heldTotal(failed); got != held {
		t.Fatalf("held messages went from %d to %d across a failed seek", held, got)
	}
	patchFlow(t, flow, `{"spec":{"state":"Running"}}`)
	eventually(t, "every message delivered", func() bool { return distinct(pods) == total }, func() string {
		return fmt.Sprintf("%d of %d distinct delivered", distinct(pods), total)
	})
}

// waitSeekFailed waits until the flow's SeekCompleted says SeekFailed, and returns the flow.
func waitSeekFailed(t *testing.T, flow *subflowv1.SubscriptionFlow) *subflowv1.SubscriptionFlow {
	t.Helper()
	return waitFlow(t, flow, "SeekFailed", func(f *subflowv1.SubscriptionFlow) bool {
		c := condition(f, subflowv1.ConditionSeekCompleted)
		return c != nil && c.Reason == subflowv1.ReasonSeekFailed
	})
}

func distinct(pods []*podsim.Pod) int {
	seen := map[string]bool{}
	for _, p := range pods {
		for _, payload := range p.Payloads() {
			seen[payload] = true
		}
	}
	return len(seen)
}

// TestSeekToAMissingPartitionFails: the executor's own error is reported as SeekFailed, with the
// agent's message, and the consumers keep running.
func TestSeekToAMissingPartitionFails(t *testing.T) {
	ns := namespace(t, true)
	topic := "nopart-" + ns
	p := startPod(t, ns, "worker-0", topic, testToken)
	flow := newFlow(ns, "nopart", topic, subflowv1.StateRunning)
	flow.Spec.Seek = &subflowv1.SeekSpec{ID: "bad", Partitions: []subflowv1.PartitionIndex{{Partition: 3, Index: 5}}}
	create(t, flow)
	got := waitSeekFailed(t, flow)
	if c := condition(got, subflowv1.ConditionSeekCompleted); !strings.Contains(c.Message, "partition 3") {
		t.Fatalf("SeekCompleted message %q does not name the partition", c.Message)
	}
	waitEvent(t, ns, "nopart", "SeekFailed", 1)
	if p.Consumer.State() != protocol.Running {
		t.Fatalf("consumer %s after a failed seek", p.Consumer.State())
	}
}

// An agent that gives a failed seek a reason no condition can carry (a hostile or broken peer):
// the status is still written, with SeekFailed and the agent's error, as the API server refuses
// a whole status whose condition reason is not a word.
func TestSeekFailedWithAReasonNoConditionCanCarry(t *testing.T) {
	ns := namespace(t, true)
	topic := "oddreason-" + ns
	p, err := podsim.Start(podsim.Options{Name: "worker-0", ServiceURL: broker.ServiceURL(), AdminURL: broker.AdminURL(),
		Token: testToken, Topic: topic, Subscription: "ingest", Type: pulsar.Shared, ReceiverQueueSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	createPod(t, ns, "worker-0", oddSeekReasons(t, p.Port))
	flow := newFlow(ns, "oddreason", topic, subflowv1.StateRunning)
	flow.Spec.Seek = &subflowv1.SeekSpec{ID: "bad", Partitions: []subflowv1.PartitionIndex{{Partition: 3, Index: 5}}}
	create(t, flow)
	got := waitSeekFailed(t, flow)
	if got.Status.Seek.Reason != subflowv1.ReasonSeekFailed || !strings.Contains(got.Status.Seek.Message, "partition 3") {
		t.Fatalf("status.seek %+v", got.Status.Seek)
	}
}

// oddSeekReasons is a proxy in front of an agent's port that makes every failed seek's reason
// one no condition can carry; it returns the proxy's port.
func oddSeekReasons(t *testing.T, agentPort int) int {
	t.Helper()
	forward := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", agentPort)})
	forward.ModifyResponse = func(resp *http.Response) error {
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		body = []byte(strings.ReplaceAll(string(body), `"reason":"`+protocol.SeekError+`"`, `"reason":"it broke, badly!"`))
		resp.Body, resp.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
		return nil
	}
	s := httptest.NewServer(forward)
	t.Cleanup(s.Close)
	_, port, _ := net.SplitHostPort(s.Listener.Addr().String())
	n, _ := strconv.Atoi(port)
	return n
}

// TestPartitionedSeekFailingHalfWay: a seek whose cursor reset fails on one partition after
// another moved reports the truth (the moved partition with its position, the failed one with
// the broker's error) and an event; every pod drops what it held of the moved partition only,
// so nothing from before the target reaches the application and nothing of the other partition
// is lost; a retry of the failed partition under a new id replays it and nothing else.
func TestPartitionedSeekFailingHalfWay(t *testing.T) {
	ns := namespace(t, true)
	topic := "persistent://public/default/halfway-" + ns
	adminPut(t, broker.AdminURL()+"/admin/v2/persistent/public/default/halfway-"+ns+"/partitions", "2")
	admin, failing := failingResets(t, broker.AdminURL(), "halfway-"+ns+"-partition-1/")
	var pods []*podsim.Pod
	for i := range 2 {
		pods = append(pods, startPodWith(t, ns, podsim.Options{Name: fmt.Sprintf("worker-%d", i), Token: testToken,
			Topic: topic, AdminURL: admin.URL, ProcessingTime: 5 * time.Millisecond})) // a slow downstream: the queues stay full
	}
	flow := newFlow(ns, "halfway", topic, subflowv1.StateRunning)
	create(t, flow)
	waitFlow(t, flow, "Ready", func(f *subflowv1.SubscriptionFlow) bool { return isTrue(f, subflowv1.ConditionReady) && current(f) })

	const perPartition, target = 200, 150
	produceToPartitions(t, topic, perPartition, func() { patchFlow(t, flow, `{"spec":{"state":"Paused"}}`) })
	paused := waitFlow(t, flow, "Paused", func(f *subflowv1.SubscriptionFlow) bool { return isTrue(f, subflowv1.ConditionPaused) && current(f) })
	if heldTotal(paused) == 0 {
		t.Fatal("no message held at the pause: the test would prove nothing")
	}

	patchFlow(t, flow, fmt.Sprintf(`{"spec":{"seek":{"id":"replay","partitions":[{"partition":0,"index":%d},{"partition":1,"index":%d}]}}}`, target, target))
	partial := waitFlow(t, flow, "the seek to report a partial outcome", func(f *subflowv1.SubscriptionFlow) bool {
		c := condition(f, subflowv1.ConditionSeekCompleted)
		return c != nil && c.Reason == subflowv1.ReasonSeekPartiallyApplied
	})
	seek := partial.Status.Seek
	if len(seek.Positions) != 1 || seek.Positions[0].Partition != 0 || seek.Positions[0].Index != target ||
		len(seek.FailedPartitions) != 1 || seek.FailedPartitions[0].Partition != 1 || !strings.Contains(seek.FailedPartitions[0].Message, "500") {
		t.Fatalf("status.seek %+v: want partition 0 moved to %d and partition 1 failed with the broker's 500", seek, target)
	}
	if c := condition(partial, subflowv1.ConditionSeekCompleted); !strings.Contains(c.Message, "kubectl subflow seek halfway --retry") {
		t.Fatalf("SeekCompleted message %q does not say how to finish", c.Message)
	}
	waitEvent(t, ns, "halfway", subflowv1.ReasonSeekPartiallyApplied, 1)
	// Once every agent has heard of the outcome, what each delivers is from the cursors.
	waitFlow(t, flow, "every agent told of the outcome", func(f *subflowv1.SubscriptionFlow) bool { return current(f) })
	before := received(pods)

	patchFlow(t, flow, `{"spec":{"state":"Running"}}`)
	eventually(t, "partition 1 delivered whole, partition 0 from the target", func() bool {
		got := receivedByPartition(append(before, newSince(pods, before)...))
		return len(got[1]) == perPartition && containsRange(got[0], target, perPartition)
	}, func() string { return fmt.Sprintf("%d delivered", len(received(pods))) })
	for _, payload := range newSince(pods, before) {
		if p, i := partitionAndIndex(t, payload); p == 0 && i < target {
			t.Fatalf("%s reached the application after partition 0's cursor moved to %d", payload, target)
		}
	}

	// Acks still in the clients' grouping window when a cursor moves make them drop the
	// replayed copies as duplicates (README, "Seek and grouped acks"): wait for them to land.
	eventually(t, "every delivered message acknowledged", func() bool {
		return partitionBacklog(t, "halfway-"+ns, 1) == 0
	})
	failing.Store(false)
	retried := received(pods)
	patchFlow(t, flow, fmt.Sprintf(`{"spec":{"seek":{"id":"replay-retry","partitions":[{"partition":1,"index":%d}]}}}`, target))
	waitFlow(t, flow, "the retry to succeed", func(f *subflowv1.SubscriptionFlow) bool { return isTrue(f, subflowv1.ConditionSeekCompleted) })
	eventually(t, "partition 1 replayed from the target", func() bool {
		return containsRange(receivedByPartition(newSince(pods, retried))[1], target, perPartition)
	})
	for _, payload := range newSince(pods, retried) {
		if p, i := partitionAndIndex(t, payload); p != 1 || i < target {
			t.Fatalf("the retry of partition 1 delivered %s", payload)
		}
	}
}

// failingResets is a reverse proxy in front of the admin API that answers 500 to every cursor
// reset of a path containing failTopic while failing is set, as a broker losing a partition's
// owner mid-seek would.
func failingResets(t *testing.T, adminURL, failTopic string) (s *httptest.Server, failing *atomic.Bool) {
	t.Helper()
	target, err := url.Parse(adminURL)
	if err != nil {
		t.Fatal(err)
	}
	failing = &atomic.Bool{}
	failing.Store(true)
	forward := httputil.NewSingleHostReverseProxy(target)
	s = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() && r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/resetcursor") && strings.Contains(r.URL.Path, failTopic) {
			http.Error(w, `{"reason":"the partition's owner went away"}`, http.StatusInternalServerError)
			return
		}
		forward.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s, failing
}

// partitionBacklog is the subscription's backlog on one partition, from the admin API.
func partitionBacklog(t *testing.T, topic string, partition int) int64 {
	t.Helper()
	url := fmt.Sprintf("%s/admin/v2/persistent/public/default/%s-partition-%d/stats", broker.AdminURL(), topic, partition)
	var stats struct {
		Subscriptions map[string]struct {
			MsgBacklog int64 `json:"msgBacklog"`
		} `json:"subscriptions"`
	}
	testkit.GetJSON(t, url, &stats)
	return stats.Subscriptions["ingest"].MsgBacklog
}

func adminPut(t *testing.T, url, body string) {
	t.Helper()
	if code, out := testkit.Request(t, http.MethodPut, url, body); code/100 != 2 {
		t.Fatalf("PUT %s: %d %s", url, code, out)
	}
}

// produceToPartitions sends n messages "p<partition>-<index>" to each partition, one entry
// each, calling midway once a tenth is sent.
func produceToPartitions(t *testing.T, topic string, n int, midway func()) {
	t.Helper()
	client, err := pulsar.NewClient(pulsar.ClientOptions{URL: broker.ServiceURL(), Logger: nopLogger})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	for p := range 2 {
		producer, err := client.CreateProducer(pulsar.ProducerOptions{Topic: fmt.Sprintf("%s-partition-%d", topic, p), DisableBatching: true})
		if err != nil {
			t.Fatal(err)
		}
		for i := range n {
			producer.SendAsync(context.Background(), &pulsar.ProducerMessage{Payload: fmt.Appendf(nil, "p%d-%d", p, i)}, nil)
			if p == 1 && i == n/10 {
				midway()
			}
		}
		if err := producer.Flush(); err != nil {
			t.Fatal(err)
		}
		producer.Close()
	}
}

func received(pods []*podsim.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Payloads()...)
	}
	return out
}

// newSince is what the pods received after the snapshot before (per pod, in order).
func newSince(pods []*podsim.Pod, before []string) []string {
	seen := map[string]int{}
	for _, s := range before {
		seen[s]++
	}
	var out []string
	for _, s := range received(pods) {
		if seen[s] > 0 {
			seen[s]--
			continue
		}
		out = append(out, s)
	}
	return out
}

func partitionAndIndex(t *testing.T, payload string) (partition, index int) {
	t.Helper()
	if _, err := fmt.Sscanf(payload, "p%d-%d", &partition, &index); err != nil {
		t.Fatalf("payload %q: %v", payload, err)
	}
	return partition, index
}

// receivedByPartition is the distinct indexes received per partition.
func receivedByPartition(payloads []string) map[int]map[int]bool {
	out := map[int]map[int]bool{0: {}, 1: {}}
	for _, s := range payloads {
		var p, i int
		if _, err := fmt.Sscanf(s, "p%d-%d", &p, &i); err == nil {
			out[p][i] = true
		}
	}
	return out
}

func containsRange(got map[int]bool, from, to int) bool {
	for i := from; i < to; i++ {
		if !got[i] {
			return false
		}
	}
	return true
}
