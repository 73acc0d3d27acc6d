package control_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"

	"github.com/subflow-dev/subflow/agent"
	"github.com/subflow-dev/subflow/agent/control"
	"github.com/subflow-dev/subflow/agent/protocol"
	"github.com/subflow-dev/subflow/internal/testing/podsim"
	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

const token = "s3cret-token"

// testClient bounds every call, so that an agent that never answers fails the test.
var testClient = &http.Client{Timeout: 15 * time.Second}

// newServer serves an agent without consumers.
func newServer(t *testing.T, opts control.Options) *httptest.Server {
	t.Helper()
	ts := httptest.NewServer(newBareServer(t, opts).Handler())
	t.Cleanup(ts.Close)
	return ts
}

func call(t *testing.T, method, url, bearer, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

func flowBody(revision int64, state protocol.State, extra string) string {
	return fmt.Sprintf(`{"uid":"uid-1","revision":%d,"subscription":"sub","topic":"orders","state":%q%s}`, revision, state, extra)
}

func TestServerRequiresToken(t *testing.T) {
	a, _ := agent.New(agent.Options{})
	if _, err := control.New(a, control.Options{}); err == nil {
		t.Fatal("a control server without a token was created")
	}
}

func TestAuthentication(t *testing.T) {
	ts := newServer(t, control.Options{Token: token})
	url := ts.URL + protocol.PathPrefix + "/flows/ns/f"
	for _, bearer := range []string{"", "wrong", token + "x"} {
		code, body := call(t, http.MethodPut, url, bearer, flowBody(1, protocol.Paused, ""))
		if code != http.StatusUnauthorized || !strings.Contains(body, `"reason":"Unauthorized"`) {
			t.Errorf("token %q: %d %s, want 401 with a JSON error", bearer, code, body)
		}
	}
	if code, _ := call(t, http.MethodGet, ts.URL+protocol.PathPrefix+"/state", "wrong", ""); code != http.StatusUnauthorized {
		t.Errorf("GET state with a wrong token: %d, want 401", code)
	}
	if code, body := call(t, http.MethodPut, url, token, flowBody(1, protocol.Paused, "")); code != http.StatusOK {
		t.Errorf("right token: %d %s", code, body)
	}
	if code, _ := call(t, http.MethodGet, ts.URL+"/healthz", "", ""); code != http.StatusOK {
		t.Errorf("healthz needs no token, got %d", code)
	}
}

// After a rotation the new token applies at once and the previous one still works for the
// grace, so that pushes already on their way are not refused; then only the new one works. Only
// one previous token is kept: a second rotation ends the first one's grace.
func TestRotatedTokenFileAcceptsThePreviousTokenForTheGrace(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token")
	rotate := func(token string) {
		if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	rotate("first")
	const grace = 500 * time.Millisecond
	ts := newServer(t, control.Options{TokenFile: file, PreviousTokenGrace: grace})
	url := ts.URL + protocol.PathPrefix + "/state"
	code := func(token string) int { c, _ := call(t, http.MethodGet, url, token, ""); return c }
	if got := code("first"); got != http.StatusOK {
		t.Fatalf("first token refused: %d", got)
	}
	// The grace counts from the file's modification time, which the kernel takes from a coarse
	// clock, up to a tick behind time.Now.
	rotated := time.Now().Add(-50 * time.Millisecond)
	rotate("second-token")
	if got := code("second-token"); got != http.StatusOK {
		t.Errorf("rotated token refused: %d", got)
	}
	if got := code("first"); got != http.StatusOK && time.Since(rotated) < grace {
		t.Errorf("previous token refused %v after the rotation, within the grace: %d", time.Since(rotated), got)
	}
	deadline := time.Now().Add(10 * time.Second)
	for code("first") != http.StatusUnauthorized {
		if time.Now().After(deadline) {
			t.Fatal("the previous token is still accepted 10 s after the rotation")
		}
		time.Sleep(20 * time.Millisecond) // polling pace, not synchronisation
	}
	if since := time.Since(rotated); since < grace {
		t.Errorf("the previous token was refused after %v, before the grace of %v ended", since, grace)
	}
	if got := code("second-token"); got != http.StatusOK {
		t.Errorf("current token refused after the grace: %d", got)
	}

	rotate("third")
	if got := code("second-token"); got != http.StatusOK {
		t.Errorf("the token before the second rotation refused at once: %d", got)
	}
	rotate("fourth")
	for _, old := range []string{"first", "second-token"} {
		if got := code(old); got != http.StatusUnauthorized {
			t.Errorf("token %q, older than the previous one, got %d, want 401", old, got)
		}
	}
	if got := code("wrong"); got != http.StatusUnauthorized {
		t.Errorf("a wrong token got %d during a grace", got)
	}
}

// The grace counts from the rotation, not from the first request after it: the previous token
// of a file rotated longer ago than the grace, with no request since (a quiet flow), is refused
// at once, though this request is the first to find the change - it may be from whoever the
// rotation was meant to lock out. With the grace turned off, at once after any rotation.
func TestPreviousTokenGraceCountsFromTheRotation(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token")
	rotate := func(token string, at time.Time) {
		t.Helper()
		if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(file, at, at); err != nil {
			t.Fatal(err)
		}
	}
	rotate("first", time.Now().Add(-time.Hour))
	ts := newServer(t, control.Options{TokenFile: file, PreviousTokenGrace: time.Minute})
	url := ts.URL + protocol.PathPrefix + "/state"
	code := func(token string) int { c, _ := call(t, http.MethodGet, url, token, ""); return c }
	if got := code("first"); got != http.StatusOK {
		t.Fatalf("first token refused: %d", got)
	}
	rotate("second", time.Now().Add(-2*time.Minute))
	if got := code("first"); got != http.StatusUnauthorized {
		t.Fatalf("the previous token two minutes after the rotation, with a grace of one: %d, want 401", got)
	}
	if got := code("second"); got != http.StatusOK {
		t.Fatalf("current token refused: %d", got)
	}
	rotate("third", time.Now().Add(-30*time.Second))
	if got := code("second"); got != http.StatusOK {
		t.Fatalf("the previous token 30 s after the rotation, within the grace: %d, want 200", got)
	}

	off := newServer(t, control.Options{TokenFile: file, PreviousTokenGrace: -1})
	offURL := off.URL + protocol.PathPrefix + "/state"
	if c, _ := call(t, http.MethodGet, offURL, "third", ""); c != http.StatusOK {
		t.Fatalf("current token refused: %d", c)
	}
	rotate("fourth", time.Now())
	if c, _ := call(t, http.MethodGet, offURL, "third", ""); c != http.StatusUnauthorized {
		t.Fatalf("the previous token with the grace turned off: %d, want 401", c)
	}
}

func TestBadRequestsAreRefusedWithJSONErrors(t *testing.T) {
	ts := newServer(t, control.Options{Token: token, MaxBodyBytes: 1024})
	url := ts.URL + protocol.PathPrefix + "/flows/ns/f"
	tests := []struct{ name, body, want string }{
		{"malformed JSON", `{"uid":`, "invalid JSON"},
		{"repeated field", flowBody(1, protocol.Paused, `,"state":"Running"`), `duplicate field \"state\"`},
		{"two objects", flowBody(1, protocol.Paused, "") + "{}", "more than one object"},
		{"missing uid", `{"revision":1,"subscription":"s","state":"Paused"}`, "uid is required"},
		{"zero revision", flowBody(0, protocol.Paused, ""), "revision must be at least 1"},
		{"unknown state", flowBody(1, "Sleeping", ""), `state \"Sleeping\"`},
		{"seek without id", flowBody(1, protocol.Paused, `,"seek":{"index":3}`), "seek.id is required"},
		{"seek with index and partitions", flowBody(1, protocol.Paused, `,"seek":{"id":"x","index":3,"partitions":[{"partition":0,"index":1}]}`), "exactly one of index or partitions"},
		{"negative index", flowBody(1, protocol.Paused, `,"seek":{"id":"x","index":-3}`), "must not be negative"},
		{"duplicate partition", flowBody(1, protocol.Paused, `,"seek":{"id":"x","partitions":[{"partition":0,"index":1},{"partition":0,"index":2}]}`), "appears twice"},
		{"moved partition not a target", flowBody(1, protocol.Paused, `,"seek":{"id":"x","partitions":[{"partition":0,"index":1}],"movedPartitions":[3]}`), "not a target of the seek"},
		{"moved partition twice", flowBody(1, protocol.Paused, `,"seek":{"id":"x","partitions":[{"partition":0,"index":1},{"partition":1,"index":1}],"movedPartitions":[0,0]}`), "appears twice"},
		{"positions of an unfinished seek", flowBody(1, protocol.Paused, `,"seek":{"id":"x","index":1,"positions":[{"partition":-1,"index":1,"messageID":"1:2:-1:3"}]}`), "only with seek.succeeded"},
		{"bad position message id", flowBody(1, protocol.Paused, `,"seek":{"id":"x","index":1,"succeeded":true,"positions":[{"partition":-1,"index":1,"messageID":"1:2:x"}]}`), "want ledger:entry:partition:batch"},
		{"position of another partition", flowBody(1, protocol.Paused, `,"seek":{"id":"x","partitions":[{"partition":0,"index":1}],"succeeded":true,"positions":[{"partition":4,"index":1,"messageID":"1:2:4:3"}]}`), "partition 4 is not a target"},
		{"bad position cursor", flowBody(1, protocol.Paused, `,"seek":{"id":"x","index":1,"succeeded":true,"positions":[{"partition":-1,"index":1,"messageID":"1:2:-1:3","cursor":"1"}]}`), "want ledger:entry"},
		{"moved and succeeded", flowBody(1, protocol.Paused, `,"seek":{"id":"x","partitions":[{"partition":0,"index":1}],"succeeded":true,"movedPartitions":[0]}`), "not with seek.succeeded"},
		{"oversized body", flowBody(1, protocol.Paused, `,"topic2":"`+strings.Repeat("x", 2000)+`"`), "larger than 1024 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := call(t, http.MethodPut, url, token, tt.body)
			var e protocol.Error
			if code != http.StatusBadRequest || json.Unmarshal([]byte(body), &e) != nil || e.Reason != "BadRequest" {
				t.Fatalf("%d %s, want 400 with a JSON error", code, body)
			}
			if !strings.Contains(body, tt.want) {
				t.Fatalf("error %s does not mention %q", body, tt.want)
			}
		})
	}
	// Nothing was applied: the agent holds no rule.
	_, state := call(t, http.MethodGet, ts.URL+protocol.PathPrefix+"/state", token, "")
	if !strings.Contains(state, `"flows":[]`) {
		t.Errorf("refused requests left rules behind: %s", state)
	}
}

// broker and pods for the tests that need consumers.
func startPods(t *testing.T, b *pulsartest.Broker, topic string, names ...string) []*podsim.Pod {
	t.Helper()
	var pods []*podsim.Pod
	for _, name := range names {
		p, err := podsim.Start(podsim.Options{Name: name, ServiceURL: b.ServiceURL(), AdminURL: b.AdminURL(), Token: token,
			Topic: topic, Subscription: "sub", Type: pulsar.Shared, ReceiverQueueSize: 10})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		pods = append(pods, p)
	}
	return pods
}

func put(t *testing.T, p *podsim.Pod, flow string, req protocol.FlowRequest) (int, protocol.FlowStatus) {
	t.Helper()
	return putAt(t, p.Addr, flow, req)
}

func TestStaleRevisionIsIgnored(t *testing.T) {
	b := pulsartest.Start(t)
	pod := startPods(t, b, "orders", "pod-a")[0]
	if code, st := put(t, pod, "f", protocol.FlowRequest{UID: "u", Revision: 5, Subscription: "sub", State: protocol.Paused}); code != 200 || st.Consumers[0].State != protocol.Paused {
		t.Fatalf("pause: %d %+v", code, st)
	}
	code, _ := put(t, pod, "f", protocol.FlowRequest{UID: "u", Revision: 4, Subscription: "sub", State: protocol.Running})
	if code != http.StatusConflict {
		t.Fatalf("stale revision answered %d, want 409", code)
	}
	if got := pod.Consumer.State(); got != protocol.Paused {
		t.Fatalf("stale request changed the consumer to %s", got)
	}
	// A recreated flow (new UID) starts its own revisions.
	if code, st := put(t, pod, "f", protocol.FlowRequest{UID: "u2", Revision: 1, Subscription: "sub", State: protocol.Running}); code != 200 || st.Consumers[0].State != protocol.Running {
		t.Fatalf("recreated flow: %d %+v", code, st)
	}
}

// A rule that matches no consumer (a typo) changes nothing and answers with what the agent
// does consume, so that the controller can name it; a rule that matches says nothing more.
func TestRuleMatchingNoConsumerNamesTheOthers(t *testing.T) {
	b := pulsartest.Start(t)
	pod := startPods(t, b, "persistent://public/default/orders", "pod-a")[0]
	code, st := put(t, pod, "typo", protocol.FlowRequest{UID: "u1", Revision: 1, Subscription: "sbu", State: protocol.Paused})
	want := []protocol.ConsumerRef{{Subscription: "sub", Topic: "persistent://public/default/orders"}}
	if code != 200 || len(st.Consumers) != 0 || !slices.Equal(st.OtherConsumers, want) {
		t.Fatalf("%d %+v, want no consumer and the others %+v", code, st, want)
	}
	if got := pod.Consumer.State(); got != protocol.Running {
		t.Fatalf("a rule for another subscription paused the consumer: %s", got)
	}
	if _, st := put(t, pod, "right", protocol.FlowRequest{UID: "u2", Revision: 1, Subscription: "sub", State: protocol.Paused}); len(st.Consumers) != 1 || st.OtherConsumers != nil {
		t.Fatalf("matching rule: %+v", st)
	}
}

func TestMostRestrictiveFlowWinsAndConflictIsReported(t *testing.T) {
	b := pulsartest.Start(t)
	pod := startPods(t, b, "persistent://public/default/orders", "pod-a")[0]
	put(t, pod, "run", protocol.FlowRequest{UID: "u1", Revision: 1, Subscription: "sub", State: protocol.Running})
	code, st := put(t, pod, "halt", protocol.FlowRequest{UID: "u2", Revision: 1, Subscription: "sub", Topic: "orders", State: protocol.Paused})
	if code != 200 || st.Consumers[0].State != protocol.Paused {
		t.Fatalf("%d %+v", code, st)
	}
	_, st = put(t, pod, "run", protocol.FlowRequest{UID: "u1", Revision: 2, Subscription: "sub", State: protocol.Running})
	if st.Consumers[0].State != protocol.Paused || !strings.Contains(st.Conflict, "ns/halt (Paused)") {
		t.Fatalf("Running flow undid the Paused one or hid the conflict: %+v", st)
	}
	// A rule for another subscription or topic does not touch the consumer.
	put(t, pod, "other", protocol.FlowRequest{UID: "u3", Revision: 1, Subscription: "sub", Topic: "payments", State: protocol.Stopped})
	if got := pod.Consumer.State(); got != protocol.Paused {
		t.Fatalf("rule for another topic applied: %s", got)
	}
	if code, _ := call(t, http.MethodDelete, "http://"+pod.Addr+protocol.PathPrefix+"/flows/ns/halt?uid=wrong", token, ""); code != http.StatusConflict {
		t.Fatalf("delete with a foreign uid answered %d, want 409", code)
	}
	if code, _ := call(t, http.MethodDelete, "http://"+pod.Addr+protocol.PathPrefix+"/flows/ns/halt?uid=u2", token, ""); code != http.StatusNoContent {
		t.Fatalf("delete answered %d", code)
	}
	if got := pod.Consumer.State(); got != protocol.Running {
		t.Fatalf("after releasing the Paused flow the consumer is %s", got)
	}
}

func TestRuleAppliesToConsumerSubscribedLater(t *testing.T) {
	b := pulsartest.Start(t)
	a, err := agent.New(agent.Options{Name: "pod-a"})
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := control.New(a, control.Options{Token: token})
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	body, _ := json.Marshal(protocol.FlowRequest{UID: "u", Revision: 1, Subscription: "sub", State: protocol.Paused})
	if code, out := call(t, http.MethodPut, ts.URL+protocol.PathPrefix+"/flows/ns/f", token, string(body)); code != 200 {
		t.Fatalf("%d %s", code, out)
	}
	client, err := pulsar.NewClient(pulsar.ClientOptions{URL: b.ServiceURL(), Logger: log.DefaultNopLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c, err := a.Subscribe(client, pulsar.ConsumerOptions{Topic: "late", SubscriptionName: "sub", Name: "late-consumer"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.State() != protocol.Paused {
		t.Fatalf("late consumer is %s, want Paused", c.State())
	}
	producer, _ := client.CreateProducer(pulsar.ProducerOptions{Topic: "late"})
	defer producer.Close()
	if _, err := producer.Send(context.Background(), &pulsar.ProducerMessage{Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if msg, err := c.Receive(ctx); err == nil {
		t.Fatalf("paused late consumer delivered %q", msg.Payload())
	}
	// pulsar-client-go v0.19 grants the receiver queue on every subscribe; that grant is the
	// only one while paused (docs/design.md section 3.5, a stated bound).
	if flows := b.Flows("late", "sub"); len(flows) > 1 || (len(flows) == 1 && flows[0].Permits > 1000) {
		t.Errorf("paused late consumer sent more than the initial grant: %+v", flows)
	}
}

func TestSeekRunsOncePerID(t *testing.T) {
	b := pulsartest.Start(t)
	pod := startPods(t, b, "events", "pod-a")[0]
	produce(t, b, "events", 20)
	eventually(t, "all 20 consumed", func() bool { return pod.Received() == 20 })

	index := int64(5)
	req := protocol.FlowRequest{UID: "u", Revision: 1, Subscription: "sub", State: protocol.Running,
		Seek: &protocol.SeekRequest{ID: "s1", Index: &index, Execute: true}}
	code, st := put(t, pod, "f", req)
	if code != 200 || st.Seek == nil || st.Seek.State != protocol.SeekRunning {
		t.Fatalf("seek: %d %+v, want it answered at once as Running", code, st.Seek)
	}
	st = waitSeek(t, pod.Addr, "f", req)
	if st.Seek.State != protocol.SeekSucceeded || len(st.Seek.Positions) != 1 || st.Seek.Positions[0].Index != 5 {
		t.Fatalf("seek: %+v", st.Seek)
	}
	eventually(t, "messages from index 5 redelivered", func() bool { return pod.Received() == 35 })
	if got := pod.Payloads()[20]; got != "m-5" {
		t.Fatalf("first message after the seek is %s, want m-5", got)
	}
	// The same id again (a retry) must not move the cursor back.
	req.Revision = 3
	if _, st := put(t, pod, "f", req); st.Seek.State != protocol.SeekSucceeded {
		t.Fatalf("retried seek: %+v", st.Seek)
	}
	produce(t, b, "events", 1)
	eventually(t, "one new message", func() bool { return pod.Received() == 36 })
	if got := pod.Payloads()[35]; got != "m-0" {
		t.Fatalf("after a retried seek id the next message is %s, want the new m-0", got)
	}
}

// produce sends "m-0" to "m-<n-1>" to topic, one entry each.
func produce(t *testing.T, b *pulsartest.Broker, topic string, n int) {
	t.Helper()
	testkit.ProduceUnbatched(t, b.ServiceURL(), topic, "m", n)
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testkit.Poll{Within: 10 * time.Second, Every: 5 * time.Millisecond}.Eventually(t, what, cond)
}

// A start-gated pod whose first push pauses its consumer hands the application nothing: the
// start-up gate lifts only once the push's rules hold. (Lifted first, the consumer ran until
// the rules were applied, and what its client had buffered could reach the application.)
func TestFirstPushKeepsAGatedConsumerPaused(t *testing.T) {
	b := pulsartest.Start(t)
	for i := range 10 {
		name, topic := fmt.Sprintf("pod-%d", i), fmt.Sprintf("orders-%d", i)
		pod := startTestPodWith(t, b, agent.Options{Name: name, StartGated: true, SyncTimeout: time.Hour}, topic, true, control.Options{})
		produce(t, b, topic, 20)
		eventually(t, name+"'s client to be sent messages while gated", func() bool {
			for _, c := range b.Subscription(topic, "sub").Consumers {
				if c.Name == name && c.Unacked > 0 {
					return true
				}
			}
			return false
		})
		req := protocol.FlowRequest{UID: "u", Revision: 1, Subscription: "sub", State: protocol.Paused}
		if code, st := putAt(t, pod.addr, "f", req); code != http.StatusOK || len(st.Consumers) != 1 || st.Consumers[0].State != protocol.Paused {
			t.Fatalf("%s: first push answered %d %+v", name, code, st)
		}
		if got := pod.received(); len(got) > 0 {
			t.Fatalf("%s: a gated consumer paused by the first push handed over %d messages: %v", name, len(got), got)
		}
	}
}
