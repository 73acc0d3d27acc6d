package control_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"

	"github.com/subflow-dev/subflow/agent/control"
	"github.com/subflow-dev/subflow/agent/protocol"
	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

func seekRequest(revision int64, state protocol.State, id string, index int64, execute bool) protocol.FlowRequest {
	return protocol.FlowRequest{UID: "u", Revision: revision, Subscription: "sub", State: state,
		Seek: &protocol.SeekRequest{ID: id, Index: &index, Execute: execute}}
}

// A seek slower than any push timeout: the push answers at once with Running, a pause pushed
// meanwhile applies at once, and the seek completes on its own afterwards.
func TestSeekRunsInBackgroundWhilePushesApply(t *testing.T) {
	_, gate, pod := consumedPod(t, "", control.Options{})

	req := seekRequest(1, protocol.Running, "s1", 5, true)
	code, st, took := timedPut(t, pod.addr, "f", req, 2*time.Second)
	if code != http.StatusOK || st.Seek == nil || st.Seek.State != protocol.SeekRunning {
		t.Fatalf("push with a seek: %d %+v, want 200 with the seek Running", code, st.Seek)
	}
	t.Logf("push starting a seek answered in %s", took)

	paused := seekRequest(2, protocol.Paused, "s1", 5, true)
	code, st, took = timedPut(t, pod.addr, "f", paused, 2*time.Second)
	if code != http.StatusOK || st.Consumers[0].State != protocol.Paused || st.Seek.State != protocol.SeekRunning {
		t.Fatalf("pause during the seek: %d %+v", code, st)
	}
	t.Logf("pause during a running seek applied in %s", took)

	running := seekRequest(3, protocol.Running, "s1", 5, true)
	gate.open()
	st = waitSeek(t, pod.addr, "f", running)
	if st.Seek.State != protocol.SeekSucceeded || len(st.Seek.Positions) != 1 || st.Seek.Positions[0].Index != 5 {
		t.Fatalf("seek: %+v", st.Seek)
	}
	eventually(t, "messages from index 5 redelivered", func() bool { return len(pod.received()) == 35 })
	if got := pod.received()[20]; got != "m-5" {
		t.Fatalf("first message after the seek is %s, want m-5", got)
	}
}

// Concurrent executor pushes of one seek id run one seek: the broker sees one cursor reset,
// the agent counts one seek, and the application gets the replay once.
func TestConcurrentExecutorPushesRunOneSeek(t *testing.T) {
	b, gate, pod := consumedPod(t, "", control.Options{})

	req := seekRequest(1, protocol.Running, "s1", 5, true)
	var wg sync.WaitGroup
	states := make([]protocol.SeekState, 8)
	for i := range states {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body, _ := json.Marshal(req)
			httpReq, _ := http.NewRequest(http.MethodPut, "http://"+pod.addr+protocol.PathPrefix+"/flows/ns/f", bytes.NewReader(body))
			httpReq.Header.Set("Authorization", "Bearer "+token)
			httpReq.Header.Set("Content-Type", "application/json")
			resp, err := testClient.Do(httpReq)
			if err != nil {
				return // states[i] stays empty: reported below
			}
			defer resp.Body.Close()
			var st protocol.FlowStatus
			if resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&st) == nil && st.Seek != nil {
				states[i] = st.Seek.State
			}
		}()
	}
	wg.Wait()
	for i, s := range states {
		if s != protocol.SeekRunning {
			t.Fatalf("push %d: seek %q, want Running (the seek is held at the admin API)", i, s)
		}
	}
	gate.open()
	if st := waitSeek(t, pod.addr, "f", req); st.Seek.State != protocol.SeekSucceeded {
		t.Fatalf("seek: %+v", st.Seek)
	}
	if n := gate.requests("/resetcursor"); n != 1 {
		t.Errorf("the broker saw %d cursor resets, want 1", n)
	}
	if n := testkit.MetricSum(t, pod.registry, "subflow_agent_seeks_total", "result", "Completed"); n != 1 {
		t.Errorf("the agent ran %v seeks, want 1", n)
	}
	eventually(t, "the replay from index 5", func() bool { return len(pod.received()) == 35 })
	produce(t, b, "events", 1)
	eventually(t, "one new message", func() bool { return len(pod.received()) == 36 })
	if got := pod.received()[35]; got != "m-0" {
		t.Fatalf("after the replay the next message is %s, want the new m-0 (a second seek replayed again)", got)
	}
}

// consumedPod starts a broker and a pod that reaches its admin API through a gate holding the
// requests whose path contains hold, and returns once the pod's application has received
// "m-0" to "m-19" on "events" and the broker has their acks, so that a seek can start.
func consumedPod(t *testing.T, hold string, opts control.Options) (*pulsartest.Broker, *adminGate, *testPod) {
	t.Helper()
	b := pulsartest.Start(t)
	gate := newAdminGate(t, b.AdminURL(), hold)
	pod := startTestPod(t, b, "pod-a", "events", gate.url, true, opts)
	produce(t, b, "events", 20)
	eventually(t, "all 20 consumed", func() bool { return len(pod.received()) == 20 })
	waitAcked(t, b, "events", 20)
	return b, gate, pod
}

// pausedPair starts an executor that consumes and a sibling whose application does not
// receive, produces n messages, pauses both and returns once the sibling holds messages.
func pausedPair(t *testing.T, b *pulsartest.Broker, n int) (executor, sibling *testPod, held int64) {
	t.Helper()
	executor = startTestPod(t, b, "pod-a", "events", b.AdminURL(), true, control.Options{})
	sibling = startTestPod(t, b, "pod-b", "events", b.AdminURL(), false, control.Options{})
	produce(t, b, "events", n)
	eventually(t, "every message dispatched, some to the sibling", func() bool {
		var total, toExecutor, toSibling int64
		for _, c := range b.Subscription("events", "sub").Consumers {
			total += c.Dispatched
			switch c.Name {
			case "pod-a":
				toExecutor += c.Dispatched
			case "pod-b":
				toSibling += c.Dispatched
			}
		}
		return total == int64(n) && toSibling > 0 && int64(len(executor.received())) == toExecutor
	})
	pause := protocol.FlowRequest{UID: "u", Revision: 1, Subscription: "sub", State: protocol.Paused}
	for _, p := range []*testPod{executor, sibling} {
		if code, st := putAt(t, p.addr, "f", pause); code != http.StatusOK || st.Consumers[0].State != protocol.Paused {
			t.Fatalf("pause: %d %+v", code, st)
		}
	}
	held = sibling.consumer.Status().HeldMessages
	if held == 0 {
		t.Fatalf("the paused sibling holds no message; the test needs some")
	}
	return executor, sibling, held
}

// A failed seek drops, reorders and strands nothing: the sibling that was told of the seek
// keeps what it holds and delivers it, in order, when resumed.
func TestFailedSeekDropsNothing(t *testing.T) {
	b := pulsartest.Start(t, pulsartest.Options{DisableIndexMetadata: true})
	executor, sibling, held := pausedPair(t, b, 40)

	announce := seekRequest(2, protocol.Paused, "s1", 0, false)
	if code, st := putAt(t, sibling.addr, "f", announce); code != http.StatusOK || st.Seek.State != protocol.SeekObserved {
		t.Fatalf("announcement: %d %+v", code, st.Seek)
	}
	if got := sibling.consumer.Status().HeldMessages; got != held {
		t.Fatalf("announcing a seek changed the sibling's held messages from %d to %d", held, got)
	}
	execute := seekRequest(2, protocol.Paused, "s1", 0, true)
	putAt(t, executor.addr, "f", execute)
	st := waitSeek(t, executor.addr, "f", execute)
	if st.Seek.State != protocol.SeekFailed || st.Seek.Reason != "IndexMetadataDisabled" {
		t.Fatalf("seek on a broker without index metadata: %+v", st.Seek)
	}
	if got := sibling.consumer.Status().HeldMessages; got != held {
		t.Fatalf("a failed seek changed the sibling's held messages from %d to %d", held, got)
	}

	resume := protocol.FlowRequest{UID: "u", Revision: 3, Subscription: "sub", State: protocol.Running}
	for _, p := range []*testPod{executor, sibling} {
		putAt(t, p.addr, "f", resume)
	}
	sibling.startReceiving()
	eventually(t, "all 40 messages delivered", func() bool { return len(executor.received())+len(sibling.received()) >= 40 })
	all := append(executor.received(), sibling.received()...)
	for i := 0; i < 40; i++ {
		if !slices.Contains(all, fmt.Sprintf("m-%d", i)) {
			t.Fatalf("m-%d never reached the application (dropped or stranded): %v", i, all)
		}
	}
	if got := sibling.received(); !ascending(got) {
		t.Fatalf("the sibling delivered out of order: %v", got)
	}
}

// A sibling drops what it held from before the announcement only when told the seek
// succeeded; what the broker then redelivers from the new cursor reaches the application.
func TestSiblingDropsHeldMessagesOnlyAfterSuccess(t *testing.T) {
	b := pulsartest.Start(t)
	executor, sibling, held := pausedPair(t, b, 40)
	waitAcked(t, b, "events", int64(len(executor.received())))

	announce := seekRequest(2, protocol.Paused, "s1", 0, false)
	putAt(t, sibling.addr, "f", announce)
	if got := sibling.consumer.Status().HeldMessages; got != held {
		t.Fatalf("announcing a seek changed the sibling's held messages from %d to %d", held, got)
	}
	execute := seekRequest(2, protocol.Paused, "s1", 0, true)
	putAt(t, executor.addr, "f", execute)
	if st := waitSeek(t, executor.addr, "f", execute); st.Seek.State != protocol.SeekSucceeded {
		t.Fatalf("seek: %+v", st.Seek)
	}
	// Told again without success: still nothing dropped.
	putAt(t, sibling.addr, "f", announce)
	if got := sibling.consumer.Status().HeldMessages; got != held {
		t.Fatalf("a repeated announcement changed the sibling's held messages from %d to %d", held, got)
	}
	succeeded := announce
	succeeded.Revision = 3
	succeeded.Seek = &protocol.SeekRequest{ID: "s1", Index: announce.Seek.Index, Succeeded: true}
	code, st := putAt(t, sibling.addr, "f", succeeded)
	if code != http.StatusOK || st.Seek.State != protocol.SeekObserved {
		t.Fatalf("success notice: %d %+v", code, st.Seek)
	}
	if got := sibling.consumer.Status().HeldMessages; got != 0 {
		t.Fatalf("after the success notice the sibling still holds %d messages from before the seek", got)
	}
	// The executor told Succeeded runs nothing again.
	doneExec := execute
	doneExec.Revision = 3
	doneExec.Seek = &protocol.SeekRequest{ID: "s1", Index: announce.Seek.Index, Execute: true, Succeeded: true}
	if _, st := putAt(t, executor.addr, "f", doneExec); st.Seek.State != protocol.SeekSucceeded {
		t.Fatalf("executor told of its success: %+v", st.Seek)
	}
	if n := testkit.MetricSum(t, executor.registry, "subflow_agent_seeks_total", "result", "Completed"); n != 1 {
		t.Fatalf("the executor ran %v seeks, want 1", n)
	}

	resume := protocol.FlowRequest{UID: "u", Revision: 4, Subscription: "sub", State: protocol.Running}
	for _, p := range []*testPod{executor, sibling} {
		putAt(t, p.addr, "f", resume)
	}
	sibling.startReceiving()
	eventually(t, "the replay from index 0 to reach the application", func() bool {
		all := append(executor.received(), sibling.received()...)
		for i := 0; i < 40; i++ {
			if !slices.Contains(all, fmt.Sprintf("m-%d", i)) {
				return false
			}
		}
		return true
	})
}

// A pause pushed while the seek resets the cursor (the consumer is busy with it) answers within
// ApplyTimeout and takes effect as soon as the seek has finished, with no further push.
func TestPauseDuringCursorResetAppliesAfterwards(t *testing.T) {
	_, gate, pod := consumedPod(t, "/resetcursor", control.Options{ApplyTimeout: 200 * time.Millisecond})

	if code, st := putAt(t, pod.addr, "f", seekRequest(1, protocol.Running, "s1", 5, true)); code != http.StatusOK || st.Seek.State != protocol.SeekRunning {
		t.Fatalf("seek: %d %+v", code, st.Seek)
	}
	eventually(t, "the seek to reach the cursor reset", func() bool { return gate.requests("/resetcursor") == 1 })
	code, st, took := timedPut(t, pod.addr, "f", seekRequest(2, protocol.Paused, "s1", 5, true), 2*time.Second)
	if code != http.StatusOK || st.Seek.State != protocol.SeekRunning {
		t.Fatalf("pause during the reset: %d %+v", code, st)
	}
	t.Logf("pause during a cursor reset answered in %s", took)
	gate.open()
	eventually(t, "the pause to apply after the seek", func() bool { return pod.consumer.State() == protocol.Paused })
	if st := waitSeek(t, pod.addr, "f", seekRequest(2, protocol.Paused, "s1", 5, true)); st.Seek.State != protocol.SeekSucceeded {
		t.Fatalf("seek: %+v", st.Seek)
	}
}

// A rule released while its seek runs, and pushed again with the same uid and seek id (a pod
// relabelled away and back), does not start the seek a second time.
func TestSeekOfReleasedRuleRunsOnce(t *testing.T) {
	_, gate, pod := consumedPod(t, "", control.Options{})

	req := seekRequest(1, protocol.Running, "s1", 5, true)
	putAt(t, pod.addr, "f", req)
	if code, _ := call(t, http.MethodDelete, "http://"+pod.addr+protocol.PathPrefix+"/flows/ns/f?uid=u", token, ""); code != http.StatusNoContent {
		t.Fatalf("release: %d", code)
	}
	if code, st := putAt(t, pod.addr, "f", req); code != http.StatusOK || st.Seek.State != protocol.SeekRunning {
		t.Fatalf("the same seek pushed again: %d %+v, want the running one reported", code, st.Seek)
	}
	gate.open()
	if st := waitSeek(t, pod.addr, "f", req); st.Seek.State != protocol.SeekSucceeded {
		t.Fatalf("seek: %+v", st.Seek)
	}
	if n := gate.requests("/resetcursor"); n != 1 {
		t.Fatalf("the broker saw %d cursor resets, want 1", n)
	}
}

func ascending(payloads []string) bool {
	last := -1
	for _, p := range payloads {
		n, err := strconv.Atoi(strings.TrimPrefix(p, "m-"))
		if err != nil || n <= last {
			return false
		}
		last = n
	}
	return true
}

// A seek into the middle of a batch entry, on a Shared subscription whose other pod receives
// the entry: told where the cursor moved, that pod filters out the messages before the target
// as the executor does, and drops what it held from before the seek.
func TestSiblingFiltersTheTargetEntryOfASeekIntoABatch(t *testing.T) {
	b := pulsartest.Start(t)
	executor := startTestPod(t, b, "pod-a", "events", b.AdminURL(), true, control.Options{})
	sibling := startTestPod(t, b, "pod-b", "events", b.AdminURL(), false, control.Options{})
	pause := protocol.FlowRequest{UID: "u", Revision: 1, Subscription: "sub", State: protocol.Paused}
	for _, p := range []*testPod{executor, sibling} {
		putAt(t, p.addr, "f", pause)
	}
	produceBatched(t, b, "events", 50, 10) // entries of m-0..9, m-10..19, ...
	eventually(t, "entries dispatched to the sibling", func() bool {
		var total, toSibling int64
		for _, c := range b.Subscription("events", "sub").Consumers {
			total += c.Dispatched
			if c.Name == "pod-b" {
				toSibling += c.Dispatched
			}
		}
		return total > 0 && toSibling > 0
	})

	putAt(t, sibling.addr, "f", seekRequest(2, protocol.Paused, "s1", 23, false))
	st := waitSeek(t, executor.addr, "f", seekRequest(2, protocol.Paused, "s1", 23, true))
	if st.Seek.State != protocol.SeekSucceeded || len(st.Seek.Positions) != 1 || !strings.HasSuffix(st.Seek.Positions[0].MessageID, ":3") {
		t.Fatalf("seek into the third message of an entry: %+v", st.Seek)
	}
	// The executor stops, so the broker sends the target's entry to the sibling.
	putAt(t, executor.addr, "f", protocol.FlowRequest{UID: "u", Revision: 3, Subscription: "sub", State: protocol.Stopped})
	notice := seekRequest(3, protocol.Running, "s1", 23, false)
	notice.Seek.Succeeded, notice.Seek.Positions = true, st.Seek.Positions
	if code, _ := putAt(t, sibling.addr, "f", notice); code != http.StatusOK {
		t.Fatalf("success notice with positions: %d", code)
	}
	sibling.startReceiving()
	eventually(t, "the sibling to receive m-23..m-49", func() bool {
		got := sibling.received()
		for i := 23; i < 50; i++ {
			if !slices.Contains(got, fmt.Sprintf("m-%d", i)) {
				return false
			}
		}
		return true
	})
	for _, payload := range sibling.received() {
		var i int
		if _, err := fmt.Sscanf(payload, "m-%d", &i); err != nil || i < 23 {
			t.Fatalf("the sibling delivered %s after the seek to index 23 (got %v)", payload, sibling.received())
		}
	}
}

// produceBatched sends n messages "m-<i>" in batch entries of batch messages each.
func produceBatched(t *testing.T, b *pulsartest.Broker, topic string, n, batch int) {
	t.Helper()
	client, err := pulsar.NewClient(pulsar.ClientOptions{URL: b.ServiceURL(), Logger: log.DefaultNopLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	producer, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic, BatchingMaxMessages: uint(batch),
		BatchingMaxPublishDelay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	for i := range n {
		producer.SendAsync(context.Background(), &pulsar.ProducerMessage{Payload: fmt.Appendf(nil, "m-%d", i)}, nil)
	}
	if err := producer.Flush(); err != nil {
		t.Fatal(err)
	}
}
