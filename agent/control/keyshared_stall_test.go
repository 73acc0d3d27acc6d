package control_test

import (
	"context"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/subflow-dev/subflow/agent"
	"github.com/subflow-dev/subflow/agent/control"
	"github.com/subflow-dev/subflow/agent/protocol"
	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// Issue 20 item 6: with one of three Key_Shared consumers paused, the broker stops dispatching
// to the running ones once its replay queue reaches the look-ahead limit (2000 x 3 entries by
// default). The reporter's backlog names the stall; it does not when every consumer is paused,
// none is, the subscription is Shared, or the siblings merely drained their own keys.

// ksBroker is the real broker named by PULSAR_URL and PULSAR_ADMIN_URL, else an in-process one
// with a lower look-ahead limit (150 entries for three consumers) so that the test stays quick
// under -race. It says how many messages overflow the limit with the paused consumer's third
// of the keys, and how many stay below it.
func ksBroker(t *testing.T) (serviceURL, adminURL string, stall, below int) {
	t.Helper()
	if u, a := os.Getenv("PULSAR_URL"), os.Getenv("PULSAR_ADMIN_URL"); u != "" && a != "" {
		return u, strings.TrimRight(a, "/"), 30000, 3000 // the default limit: 2000 x 3 entries
	}
	b := pulsartest.Start(t, pulsartest.Options{KeySharedLookAheadPerConsumer: 50})
	return b.ServiceURL(), b.AdminURL(), 2000, 150
}

// ksPod is an agent with one consumer named after the pod and its control server; its
// application receives and acknowledges all the time (the agent's gate decides).
type ksPod struct {
	addr     string
	received atomic.Int64
}

func startKSPod(t *testing.T, serviceURL, adminURL, name, topic string, kind pulsar.SubscriptionType) *ksPod {
	t.Helper()
	p := &ksPod{}
	a, err := agent.New(agent.Options{Name: name, AdminURL: adminURL, Registerer: prometheus.NewRegistry(),
		BacklogRefresh: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := control.New(a, control.Options{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = l.Addr().String()
	client, err := pulsar.NewClient(pulsar.ClientOptions{URL: serviceURL, Logger: log.DefaultNopLogger()})
	if err != nil {
		t.Fatal(err)
	}
	c, err := a.Subscribe(client, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Type: kind,
		Name: name, ReceiverQueueSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = srv.Serve(ctx, l) }()
	go func() { defer wg.Done(); p.consume(ctx, c) }()
	t.Cleanup(func() { cancel(); c.Close(); wg.Wait(); client.Close(); a.Close() })
	return p
}

func (p *ksPod) consume(ctx context.Context, c *agent.Consumer) {
	for {
		msg, err := c.Receive(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			p.received.Add(1)
			_ = c.Ack(msg)
		}
	}
}

// ksFlow is the flow pushed to the pods: the reporter asks for the backlog.
func ksFlow(state protocol.State, report bool) protocol.FlowRequest {
	return protocol.FlowRequest{UID: "uid-ks", Revision: 1, Subscription: "sub", State: state, ReportBacklog: report}
}

// applyFlow pushes the flow until the pod's consumer is in its state.
func applyFlow(t *testing.T, p *ksPod, req protocol.FlowRequest) {
	t.Helper()
	waitFor(t, 30*time.Second, "the consumer to be "+string(req.State), func() bool {
		code, st := putAt(t, p.addr, "ks", req)
		return code == 200 && len(st.Consumers) == 1 && st.Consumers[0].State == req.State
	})
}

// waitReport pushes the reporter's flow until a backlog read made after since satisfies done,
// and returns it.
func waitReport(t *testing.T, p *ksPod, req protocol.FlowRequest, since time.Time, what string, done func(protocol.BacklogStatus) bool) protocol.BacklogStatus {
	t.Helper()
	var last protocol.BacklogStatus
	waitFor(t, 90*time.Second, what, func() bool {
		_, st := putAt(t, p.addr, "ks", req)
		if len(st.Backlog) != 1 || st.Backlog[0].ReadAt.Before(since) {
			return false
		}
		last = st.Backlog[0]
		return last.Unknown == "" && done(last)
	})
	return last
}

func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	testkit.Poll{Within: limit, Every: 20 * time.Millisecond}.Eventually(t, what, cond)
}

func produceKeyed(t *testing.T, serviceURL, topic string, n int) {
	t.Helper()
	client, err := pulsar.NewClient(pulsar.ClientOptions{URL: serviceURL, Logger: log.DefaultNopLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	p, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var failed atomic.Int64
	for i := range n {
		msg := &pulsar.ProducerMessage{Key: "k" + strconv.Itoa(i%300), Payload: []byte(strconv.Itoa(i))}
		p.SendAsync(context.Background(), msg, func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
			if err != nil {
				failed.Add(1)
			}
		})
	}
	if err := p.Flush(); err != nil || failed.Load() > 0 {
		t.Fatalf("producing: %v, %d sends failed", err, failed.Load())
	}
}

// ksScenario starts three pods a, b, c on a new topic, pauses those named, and produces enough
// messages to overflow the look-ahead limit (or to stay below it); it returns how many.
func ksScenario(t *testing.T, kind pulsar.SubscriptionType, paused []string, overflow bool) (pods map[string]*ksPod, n int, produced time.Time) {
	t.Helper()
	serviceURL, adminURL, stall, below := ksBroker(t)
	n = stall
	if !overflow {
		n = below
	}
	topic := "persistent://public/default/ks-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	pods = map[string]*ksPod{}
	for _, name := range []string{"a", "b", "c"} {
		pods[name] = startKSPod(t, serviceURL, adminURL, name, topic, kind)
	}
	for _, name := range paused {
		applyFlow(t, pods[name], ksFlow(protocol.Paused, name == "a"))
	}
	if !slices.Contains(paused, "a") {
		applyFlow(t, pods["a"], ksFlow(protocol.Running, true))
	}
	produceKeyed(t, serviceURL, topic, n)
	return pods, n, time.Now()
}

func reporterFlow(paused []string) protocol.FlowRequest {
	if slices.Contains(paused, "a") {
		return ksFlow(protocol.Paused, true)
	}
	return ksFlow(protocol.Running, true)
}

func TestKeySharedStallReportedWhenOneOfThreeIsPaused(t *testing.T) {
	paused := []string{"a"}
	pods, _, produced := ksScenario(t, pulsar.KeyShared, paused, true)
	b := waitReport(t, pods["a"], reporterFlow(paused), produced, "the stall report",
		func(b protocol.BacklogStatus) bool { return b.KeySharedStall != nil })
	s := b.KeySharedStall
	slices.Sort(s.Starved)
	if !slices.Equal(s.Halted, []string{"a"}) || s.HaltedCount != 1 || !slices.Equal(s.Starved, []string{"b", "c"}) ||
		s.StarvedCount != 2 || s.InReplay <= 0 || s.Waiting <= 0 {
		t.Fatalf("stall = %+v, want a halted, b and c starved, entries in replay and waiting", *s)
	}
	t.Logf("backlog %d, stall %+v, siblings received %d and %d", b.Messages, *s, pods["b"].received.Load(), pods["c"].received.Load())
}

func TestKeySharedStallNotReportedWhenAllArePaused(t *testing.T) {
	paused := []string{"a", "b", "c"}
	pods, n, produced := ksScenario(t, pulsar.KeyShared, paused, true)
	b := waitReport(t, pods["a"], reporterFlow(paused), produced, "the whole backlog",
		func(b protocol.BacklogStatus) bool { return b.Messages == int64(n) })
	if b.KeySharedStall != nil {
		t.Fatalf("every consumer is paused, yet a stall is reported: %+v", *b.KeySharedStall)
	}
}

func TestKeySharedStallNotReportedWhenNoneIsPaused(t *testing.T) {
	pods, _, produced := ksScenario(t, pulsar.KeyShared, nil, true)
	b := waitReport(t, pods["a"], reporterFlow(nil), produced, "the backlog to drain",
		func(b protocol.BacklogStatus) bool { return b.Messages == 0 })
	if b.KeySharedStall != nil {
		t.Fatalf("no consumer is paused, yet a stall is reported: %+v", *b.KeySharedStall)
	}
}

// steady waits until the running pods b and c received everything but what the backlog holds.
func steady(pods map[string]*ksPod, n int64) func(protocol.BacklogStatus) bool {
	return func(b protocol.BacklogStatus) bool {
		return pods["b"].received.Load()+pods["c"].received.Load()+b.Messages == n
	}
}

func TestKeySharedStallNotReportedForShared(t *testing.T) {
	paused := []string{"a"}
	pods, n, produced := ksScenario(t, pulsar.Shared, paused, true)
	b := waitReport(t, pods["a"], reporterFlow(paused), produced, "the siblings to drain the rest", steady(pods, int64(n)))
	if b.KeySharedStall != nil {
		t.Fatalf("a Shared subscription is reported stalled: %+v", *b.KeySharedStall)
	}
}

// Below the look-ahead limit the siblings get all their keys: only the paused consumer's share
// waits, which is no stall.
func TestKeySharedStallNotReportedBelowTheLookAheadLimit(t *testing.T) {
	paused := []string{"a"}
	pods, n, produced := ksScenario(t, pulsar.KeyShared, paused, false)
	b := waitReport(t, pods["a"], reporterFlow(paused), produced, "the siblings to drain their keys", steady(pods, int64(n)))
	if b.KeySharedStall != nil {
		t.Fatalf("the siblings got all their keys, yet a stall is reported: %+v", *b.KeySharedStall)
	}
	if b.Messages == 0 {
		t.Fatal("the paused consumer's keys should wait in the backlog")
	}
}
