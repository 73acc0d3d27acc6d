package pulsartest

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"google.golang.org/protobuf/proto"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

func TestReconnectAfterEachFaultLosesNothing(t *testing.T) {
	faults := map[string]func(b *Broker) error{
		"drop connections": func(b *Broker) error { b.DropConnections(); return nil },
		"unload topic":     func(b *Broker) error { return b.UnloadTopic("faulty") },
		"close consumer":   func(b *Broker) error { return b.CloseConsumer("faulty", "sub", "c1") },
		"latency":          func(b *Broker) error { b.SetLatency(30 * time.Millisecond); return nil },
	}
	for name, inject := range faults {
		t.Run(name, func(t *testing.T) {
			b := Start(t)
			c := newClient(t, b)
			cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{
				Topic: "faulty", SubscriptionName: "sub", Name: "c1", Type: pulsar.Shared, ReceiverQueueSize: 10,
			})
			// A batching producer: v0.19's non-batching send path races with
			// its own reconnect (p.encryptor), which -race reports.
			p := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "faulty"})
			testkit.ProduceAsync(t, p, "before", 20, nil)
			seen := map[string]bool{}
			for _, m := range testkit.ReceiveAndAck(t, cons, 10, waitFor) {
				seen[string(m.Payload())] = true
			}
			faultAt := time.Now()
			if err := inject(b); err != nil {
				t.Fatal(err)
			}
			testkit.ProduceAsync(t, p, "after", 20, nil)
			for len(seen) < 40 {
				for _, m := range testkit.ReceiveAndAck(t, cons, 1, waitFor) {
					seen[string(m.Payload())] = true
				}
			}
			b.SetLatency(0)
			if name != "latency" {
				regranted := slices.ContainsFunc(b.Flows("faulty", "sub"), func(f Flow) bool {
					return f.Time.After(faultAt) && f.Permits == 10
				})
				if !regranted {
					t.Fatalf("no initial grant after reconnect: %+v", b.Flows("faulty", "sub"))
				}
			}
			testkit.Eventually(t, waitFor, "backlog drained", func() bool { return b.Subscription("faulty", "sub").Backlog == 0 })
			checkInvariant(t, b)
		})
	}
}

// TestPermitInvariantUnderChurn subscribes and closes Shared consumers while
// the broker drops connections and closes consumers, and checks the permit
// invariant throughout; every message is still consumed.
func TestPermitInvariantUnderChurn(t *testing.T) {
	b := Start(t)
	c := newClient(t, b)
	const total = 300
	p := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "churn", BatchingMaxMessages: 10})
	opts := pulsar.ConsumerOptions{Topic: "churn", SubscriptionName: "sub", Type: pulsar.Shared, ReceiverQueueSize: 8}
	stable := testkit.Subscribe(t, c, opts)

	var seenMu sync.Mutex
	seen := map[string]bool{}
	record := func(m pulsar.Message) {
		seenMu.Lock()
		seen[string(m.Payload())] = true
		seenMu.Unlock()
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 3; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				o := opts
				o.Name = fmt.Sprintf("churn-%d", w)
				cons, err := c.Subscribe(o)
				if err != nil {
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
				if m, err := cons.Receive(ctx); err == nil {
					_ = cons.Ack(m)
					record(m)
				}
				cancel()
				cons.Close()
			}
		}()
	}
	var violations atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := b.CheckPermitInvariant(); err != nil {
				violations.Add(1)
				t.Error(err)
			}
			switch i % 50 {
			case 10:
				_ = b.CloseConsumer("churn", "sub", "churn-1")
			case 30:
				b.DropConnections()
			}
			time.Sleep(2 * time.Millisecond) // pacing of the fault loop, not synchronisation
		}
	}()

	testkit.ProduceAsync(t, p, "m", total, nil)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	for {
		seenMu.Lock()
		done := len(seen) == total
		seenMu.Unlock()
		if done {
			break
		}
		m, err := stable.Receive(ctx)
		if err != nil {
			t.Fatalf("stable consumer: %v (seen %d of %d)", err, len(seen), total)
		}
		_ = stable.Ack(m)
		record(m)
	}
	close(stop)
	wg.Wait()
	if violations.Load() > 0 {
		t.Fatalf("%d invariant violations", violations.Load())
	}
	checkInvariant(t, b)
}

// TestStaleFlowIsNotCounted replays the race of the Java fix
// deterministically: a FLOW whose dispatcher update is still pending when
// its consumer is removed, or that belongs to a replaced consumer instance
// with the same id, must not reach the total.
func TestStaleFlowIsNotCounted(t *testing.T) {
	b := Start(t)
	tp, cn, req := staleSetup(t, b)
	tp.mu.Lock()
	old, _, _ := tp.subscribe(cn, req)
	old.sub.flow(old, 10)
	tp.mu.Unlock()
	waitLane(t, tp)

	tp.lane.hold() // the next FLOW update stays queued
	tp.mu.Lock()
	old.sub.flow(old, 1000)
	tp.mu.Unlock()
	checkInvariant(t, b) // total 10 = 1010 permits - 1000 pending
	tp.removeConsumer(old)
	tp.mu.Lock()
	replacement, _, _ := tp.subscribe(cn, req)
	replacement.sub.flow(replacement, 7)
	tp.mu.Unlock()
	tp.lane.release()
	waitLane(t, tp)

	tp.mu.Lock()
	total := replacement.sub.totalPermits
	tp.mu.Unlock()
	if total != 7 {
		t.Fatalf("dispatcher total %d, want the replacement's 7", total)
	}
	checkInvariant(t, b)
}

// TestPermitInvariantCatchesDrift shows the check failing on the accounting
// of the broker before the fix, which subtracted a removed consumer's
// pending FLOW permits from a total they had never reached.
func TestPermitInvariantCatchesDrift(t *testing.T) {
	b := Start(t)
	b.legacyPermitRemoval = true
	tp, cn, req := staleSetup(t, b)
	req2 := proto.Clone(req).(*pb.CommandSubscribe)
	req2.ConsumerId, req2.ConsumerName = ptr(uint64(2)), ptr("b")
	tp.mu.Lock()
	first, _, _ := tp.subscribe(cn, req)
	second, _, _ := tp.subscribe(cn, req2)
	first.sub.flow(first, 10)
	second.sub.flow(second, 10)
	tp.mu.Unlock()
	waitLane(t, tp)
	checkInvariant(t, b)

	tp.lane.hold()
	tp.mu.Lock()
	first.sub.flow(first, 1000)
	tp.mu.Unlock()
	tp.removeConsumer(first) // old code: total = 20 - 1010 = -990
	tp.lane.release()
	waitLane(t, tp)
	err := b.CheckPermitInvariant()
	if err == nil || !strings.Contains(err.Error(), "dispatcher total -990") {
		t.Fatalf("drift not caught: %v", err)
	}
}

func staleSetup(t *testing.T, b *Broker) (*topic, *conn, *pb.CommandSubscribe) {
	server, client := net.Pipe()
	t.Cleanup(func() { _ = server.Close(); _ = client.Close() })
	go func() { _, _ = io.Copy(io.Discard, client) }()
	cn := b.newConn(server)
	go cn.writeLoop()
	t.Cleanup(cn.close)
	req := &pb.CommandSubscribe{
		Topic: ptr("stale"), Subscription: ptr("sub"), SubType: pb.CommandSubscribe_Shared.Enum(),
		ConsumerId: ptr(uint64(1)), RequestId: ptr(uint64(1)), ConsumerName: ptr("a"),
	}
	return b.getTopic(mustFull("stale"), true), cn, req
}

// waitLane waits until the topic's dispatch lane has applied every update.
func waitLane(t testing.TB, tp *topic) {
	t.Helper()
	testkit.Eventually(t, waitFor, "dispatch lane idle", func() bool {
		tp.lane.mu.Lock()
		defer tp.lane.mu.Unlock()
		return len(tp.lane.tasks) == 0 && !tp.lane.running
	})
}
