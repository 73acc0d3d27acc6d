package chaos

import (
	"errors"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/protocol"
	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
)

func TestBitsetPrefix(t *testing.T) {
	var b bitset
	if b.prefix() != 0 {
		t.Fatal("empty set has prefix 0")
	}
	for i := range int64(130) {
		b.add(i)
	}
	b.add(131)
	if got := b.prefix(); got != 130 {
		t.Fatalf("prefix = %d, want 130", got)
	}
	if !b.add(130) || b.add(130) {
		t.Fatal("add reports whether the number was new")
	}
	if got := b.prefix(); got != 132 {
		t.Fatalf("prefix = %d, want 132", got)
	}
}

func TestPayloadRoundTrip(t *testing.T) {
	topic, n, ok := parsePayload(payload("chaos-a", 12345))
	if !ok || topic != "chaos-a" || n != 12345 {
		t.Fatalf("got %q %d %v", topic, n, ok)
	}
	if _, _, ok := parsePayload([]byte("no separator")); ok {
		t.Fatal("a foreign payload must not parse")
	}
	padded := paddedPayload("chaos-c", 42, 2560)
	if topic, n, ok := parsePayload(padded); len(padded) != 2560 || !ok || topic != "chaos-c" || n != 42 {
		t.Fatalf("padded: %d bytes, got %q %d %v", len(padded), topic, n, ok)
	}
}

// The chunked bound grows with the pause: one session, plus one per half expiry, each with
// (Q+P)(K-1) chunk permits and a renewal's initial grant.
func TestChunkedPauseBound(t *testing.T) {
	from := time.Now()
	short := chunkedPauseBound(interval{from: from, to: from.Add(chunkExpiry / 4)}, time.Minute)
	long := chunkedPauseBound(interval{from: from, to: from.Add(5 * chunkExpiry)}, time.Minute)
	if short != (4+2)*2 || long != 11*(4+2)*2+10*4 {
		t.Fatalf("bound %d for a short pause, %d for five expiries", short, long)
	}
	if open := chunkedPauseBound(interval{from: from}, 5*chunkExpiry); open != long {
		t.Fatalf("an open interval counts until the convergence bound: %d, want %d", open, long)
	}
}

func TestSubscriptionOfResetPath(t *testing.T) {
	got := subscriptionOfPath("/admin/v2/persistent/public/default/chaos-p-partition-1/subscription/failover/resetcursor")
	if got != "failover" {
		t.Fatalf("got %q", got)
	}
}

// The same seed draws the same operations with the same parameters, whatever the world does.
func TestSeedReproducesOperations(t *testing.T) {
	draw := func(seed uint64) []int {
		e := newEngine(nil, seed)
		var seq []int
		for range 300 {
			k := drawKind(e.rng, (&testCluster{}).draws)
			seq = append(seq, len(k), e.rng.IntN(5), e.rng.IntN(1<<20), e.rng.IntN(1<<20), int(e.rng.Float64()*1e6))
		}
		return seq
	}
	a, b, c := draw(42), draw(42), draw(43)
	same := func(x, y []int) bool {
		for i := range x {
			if x[i] != y[i] {
				return false
			}
		}
		return true
	}
	if !same(a, b) {
		t.Fatal("seed 42 drew two different sequences")
	}
	if same(a, c) {
		t.Fatal("seeds 42 and 43 drew the same sequence")
	}
	kinds := map[string]bool{}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 5000 {
		kinds[drawKind(rng, (&testCluster{}).draws)] = true
	}
	if len(kinds) != len(weights) {
		t.Fatalf("drew %d kinds of %d", len(kinds), len(weights))
	}
}

// On a real broker topics do not move and there is no broker latency; every other kind is
// drawn with its weight.
func TestRealBrokerDrawsTheOtherKinds(t *testing.T) {
	real := &realBroker{}
	counts := map[string]int{}
	rng := rand.New(rand.NewPCG(3, 4))
	const n = 20000
	for range n {
		counts[drawKind(rng, real.draws)]++
	}
	total := 0
	for _, w := range weights {
		if w.kind != opTopicMove && w.kind != opBrokerLatency {
			total += w.weight
		}
	}
	for _, w := range weights {
		got := counts[w.kind]
		if w.kind == opTopicMove || w.kind == opBrokerLatency {
			if got != 0 {
				t.Errorf("%s drawn %d times on a real broker", w.kind, got)
			}
			continue
		}
		want := float64(n) * float64(w.weight) / float64(total)
		if float64(got) < 0.8*want || float64(got) > 1.2*want {
			t.Errorf("%s drawn %d times, want about %.0f", w.kind, got, want)
		}
	}
}

// fakeGate is a consumer whose state changes, if at all, when its transition lock is taken.
type fakeGate struct {
	status protocol.ConsumerStatus
	onLock func(*fakeGate)
}

func (f *fakeGate) settle() {
	if f.onLock != nil {
		f.onLock(f)
	}
}
func (f *fakeGate) Status() protocol.ConsumerStatus { return f.status }

func TestHandedWhileGated(t *testing.T) {
	since := time.Now()
	paused := protocol.ConsumerStatus{State: protocol.Paused, Since: since}
	cases := []struct {
		name   string
		onLock func(*fakeGate)
		want   bool
	}{
		{"still paused: a leak", nil, true},
		{"resumed meanwhile", func(f *fakeGate) {
			f.status = protocol.ConsumerStatus{State: protocol.Running, Since: since.Add(time.Millisecond)}
		}, false},
		{"resume recorded when the transition ends", func(f *fakeGate) { f.status.State, f.status.Since = protocol.Running, since.Add(time.Second) }, false},
		{"resumed and paused again", func(f *fakeGate) { f.status.Since = since.Add(time.Second) }, false},
	}
	for _, tc := range cases {
		f := &fakeGate{status: paused, onLock: tc.onLock}
		if got := handedWhileGated(f, paused); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestFlowAllowed(t *testing.T) {
	w := &world{count: map[string]int{}}
	g := &group{subscription: "s", consumer: consumerWithQueue(50)}
	agentLife, sidecarLife := &consumerLife{group: g}, &consumerLife{group: g, sidecar: true}
	t0 := time.Now()
	open := interval{state: protocol.Paused, from: t0}
	ended := interval{state: protocol.Paused, from: t0, to: t0.Add(10 * time.Second)}
	stopped := interval{state: protocol.Stopped, from: t0, to: t0.Add(30 * time.Second)}
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	cases := []struct {
		name    string
		iv      interval
		t       time.Time
		permits uint32
		event   time.Duration // a broker fault at t0+event; negative means none
		want    bool
		sidecar bool
	}{
		{"permit return while paused", open, at(5 * time.Second), 25, -1, false, false},
		{"initial grant without a reconnect", open, at(5 * time.Second), 50, -1, false, false},
		{"initial grant after a reconnect", open, at(5 * time.Second), 50, 4 * time.Second, true, false},
		{"return after a reconnect", open, at(5 * time.Second), 25, 4 * time.Second, false, false},
		{"return as the resume happens", ended, at(9 * time.Second), 25, -1, true, false},
		{"grant while stopped", stopped, at(5 * time.Second), 50, -1, false, false},
		{"grant of the subscribe leaving stopped", stopped, at(25 * time.Second), 50, -1, true, false},
		{"return while stopped", stopped, at(29 * time.Second), 25, -1, false, false},
		// A sidecar withholds every FLOW while not Running, re-subscribes included.
		{"sidecar: grant after a reconnect", open, at(5 * time.Second), 50, 4 * time.Second, false, true},
		{"sidecar: owed permits as the resume happens", ended, at(9 * time.Second), 25, -1, true, true},
		{"sidecar: owed permits leaving stopped", stopped, at(25 * time.Second), 25, -1, true, true},
		{"sidecar: grant while stopped", stopped, at(5 * time.Second), 50, -1, false, true},
	}
	for _, c := range cases {
		w.events = nil
		if c.event >= 0 {
			w.events = []time.Time{t0.Add(c.event)}
		}
		life := agentLife
		if c.sidecar {
			life = sidecarLife
		}
		if got := w.flowAllowed(g, c.iv, life, c.t, c.permits); got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}

// The first pods' kinds come from the seed: the same seed draws the same kinds, a run of four
// pods or more has a sidecar pod, and no pod of a group the sidecar cannot gate is one.
func TestInitialKindsBySeed(t *testing.T) {
	groups := newGroups("persistent://t/n/")
	for seed := range uint64(50) {
		kinds := initialKinds(seed, groups, 10)
		if !slices.Equal(kinds, initialKinds(seed, groups, 10)) {
			t.Fatalf("seed %d drew different kinds twice", seed)
		}
		if !slices.Contains(kinds, true) {
			t.Errorf("seed %d: no sidecar pod among 10", seed)
		}
		for i, sc := range kinds {
			if sc && !sidecarEligible(groups[i%len(groups)]) {
				t.Errorf("seed %d: pod %d of group %s is a sidecar pod", seed, i, groups[i%len(groups)].name)
			}
		}
	}
}

func consumerWithQueue(n int) pulsar.ConsumerOptions {
	return pulsar.ConsumerOptions{ReceiverQueueSize: n}
}

// A reset-cursor call that the first broker redirects to the owner is followed by the client
// through the proxy and recorded once, when the owner carries it out; a refused one is not.
func TestAdminProxyRecordsAResetOnceAcrossARedirect(t *testing.T) {
	var ownerCalls atomic.Int64
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ownerCalls.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer owner.Close()
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, owner.URL+r.URL.RequestURI(), http.StatusTemporaryRedirect)
	}))
	defer leader.Close()
	var resets []resetRecord
	var mu sync.Mutex
	var redirects atomic.Int64
	faults := &adminFaults{}
	p, err := newAdminProxy([]string{leader.URL, owner.URL}, 7, faults, func(r resetRecord) {
		mu.Lock()
		defer mu.Unlock()
		resets = append(resets, r)
	}, &redirects)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	reset := func() int {
		resp, err := http.Post(p.url()+"/admin/v2/persistent/public/default/t/subscription/s/resetcursor/5", "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := reset(); code != http.StatusNoContent {
		t.Fatalf("status %d, want the owner's 204", code)
	}
	mu.Lock()
	got := slices.Clone(resets)
	mu.Unlock()
	if len(got) != 1 || got[0].Subscription != "s" || got[0].Instance != 7 || ownerCalls.Load() != 1 || redirects.Load() != 1 {
		t.Fatalf("resets %+v, owner calls %d, redirects %d: want one of each", got, ownerCalls.Load(), redirects.Load())
	}
	faults.failing.Store(true)
	if code := reset(); code != http.StatusServiceUnavailable {
		t.Fatalf("status %d under an injected fault, want 503", code)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(resets) != 1 {
		t.Fatalf("a refused reset was recorded: %+v", resets)
	}
}

// A "lost" violation's wire trail lists the frames about the missing message's entry only.
func TestTouchesEntry(t *testing.T) {
	id := pulsar.NewMessageID(7, 20, -1, -1)
	at := func(ledger, entry uint64) wirerec.MessageID {
		return wirerec.MessageID{Ledger: ledger, Entry: entry, Partition: -1, BatchIndex: 2}
	}
	for _, c := range []struct {
		name string
		e    wirerec.Event
		want bool
	}{
		{"the entry sent", wirerec.Event{Type: pb.BaseCommand_MESSAGE, MessageID: at(7, 20)}, true},
		{"another entry sent", wirerec.Event{Type: pb.BaseCommand_MESSAGE, MessageID: at(7, 21)}, false},
		{"an ACK listing it second", wirerec.Event{Type: pb.BaseCommand_ACK, MessageID: at(7, 3), IDs: []wirerec.MessageID{at(7, 3), at(7, 20)}}, true},
		{"an ACK of others", wirerec.Event{Type: pb.BaseCommand_ACK, MessageID: at(7, 3), IDs: []wirerec.MessageID{at(7, 3), at(8, 20)}}, false},
		{"a cumulative ACK past it", wirerec.Event{Type: pb.BaseCommand_ACK, Cumulative: true, MessageID: at(8, 0), IDs: []wirerec.MessageID{at(8, 0)}}, true},
		{"a cumulative ACK before it", wirerec.Event{Type: pb.BaseCommand_ACK, Cumulative: true, MessageID: at(7, 19), IDs: []wirerec.MessageID{at(7, 19)}}, false},
		{"a redelivery request for it", wirerec.Event{Type: pb.BaseCommand_REDELIVER_UNACKNOWLEDGED_MESSAGES, IDs: []wirerec.MessageID{at(7, 20)}}, true},
	} {
		if got := touchesEntry(c.e, id); got != c.want {
			t.Errorf("%s: touchesEntry = %v, want %v", c.name, got, c.want)
		}
	}
}

// The drain unloads a topic only when the broker, not a consumer of ours, holds the missing
// messages: counted in the backlog, read past by the cursor, unacknowledged by no consumer.
func TestHoldsBack(t *testing.T) {
	ids := []pulsar.MessageID{pulsar.NewMessageID(9, 1316, 0, -1), pulsar.NewMessageID(9, 1319, 0, -1)}
	stalled := func() subscriptionView { // as a run on Pulsar 4.0.7 ended
		return subscriptionView{backlog: 2, markDelete: "9:1315", read: "9:1429", waitingRead: true,
			consumers: []consumerView{{name: "shared-8-i20", permits: 50}, {name: "shared-1-i23", permits: 44}}}
	}
	for _, c := range []struct {
		name   string
		change func(*subscriptionView)
		ids    []pulsar.MessageID
		want   bool
	}{
		{"read past, counted, held by no consumer", func(*subscriptionView) {}, ids, true},
		{"a consumer holds messages unacknowledged", func(v *subscriptionView) { v.consumers[1].unacked = 3 }, ids, false},
		{"the cursor has not read that far", func(v *subscriptionView) { v.read = "9:1319" }, ids, false},
		{"the cursor is on an earlier ledger", func(v *subscriptionView) { v.read = "8:5000" }, ids, false},
		{"the backlog does not count them all", func(v *subscriptionView) { v.backlog = 1 }, ids, false},
		{"no consumer at all", func(v *subscriptionView) { v.consumers = nil }, ids, false},
		{"the stats could not be read", func(v *subscriptionView) { v.err = errors.New("503") }, ids, false},
		{"no id recorded", func(*subscriptionView) {}, nil, false},
	} {
		v := stalled()
		c.change(&v)
		if got := v.holdsBack(int64(len(ids)), c.ids); got != c.want {
			t.Errorf("%s: holdsBack = %v, want %v", c.name, got, c.want)
		}
	}
}
