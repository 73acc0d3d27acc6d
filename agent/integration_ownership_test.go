package agent

import (
	"maps"
	"slices"
	"strconv"
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/protocol"
	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
)

// Paused consumers stay connected, so the broker keeps their share of the subscription:
// Key_Shared hash ranges (a ring keyed by consumer NAME) and Failover ownership do not move.
// Stopped closes the consumer, and its share moves to the siblings; running again under the
// same name takes it back.

const keys = 16

func messageKey(i int) string { return "k" + strconv.Itoa(i%keys) }

// keysOf returns the keys of the messages with these payloads.
func keysOf(seqs []int) map[string]bool {
	out := map[string]bool{}
	for _, s := range seqs {
		out[messageKey(s)] = true
	}
	return out
}

// countOwned counts the messages from..from+n-1 whose key is in owned.
func countOwned(from, n int, owned map[string]bool) int {
	c := 0
	for i := from; i < from+n; i++ {
		if owned[messageKey(i)] {
			c++
		}
	}
	return c
}

// since returns the payloads a collector got after its first `skip` ones.
func since(col *collector, skip int) []int { return col.seqsCopy()[skip:] }

func TestIntegrationPausedKeepsKeySharedRangesStoppedReleasesThem(t *testing.T) {
	e := newEnv(t)
	topic := uniqueTopic(t)
	opts := pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Type: pulsar.KeyShared, ReceiverQueueSize: queueSize}
	opts.Name = "alpha"
	a := e.subscribe(t, opts)
	opts.Name = "beta"
	b := e.subscribe(t, opts)
	colA, colB := collect(t, a), collect(t, b)
	poll.Eventually(t, "both consumers granted", func() bool { return len(e.flows(topic, "sub", 0)) >= 2 })

	// Learn the broker's split of the keys.
	const n = 64
	e.produceKeyed(t, topic, 0, n, 1, messageKey)
	poll.Eventually(t, "the first messages", func() bool { return colA.count()+colB.count() == n })
	ownedA, ownedB := keysOf(colA.seqsCopy()), keysOf(colB.seqsCopy())
	if len(ownedA) == 0 || len(ownedB) == 0 || len(ownedA)+len(ownedB) != keys {
		t.Fatalf("keys split %v / %v: want each key on one consumer and both consumers used", slices.Sorted(maps.Keys(ownedA)), slices.Sorted(maps.Keys(ownedB)))
	}

	// Paused: alpha's keys wait for alpha (in its client and the broker's replay queue, far
	// below the look-ahead limit of min(2000 x consumers, 20000) entries); beta gets its own.
	// The client returns the permits of messages it handed over from its dispatcher goroutine,
	// after the hand-over: wait for those refills first, so that a FLOW after the pause can only
	// be the gate's fault (a CI run on Pulsar 4.2.4 saw one FLOW(5) just after Pause otherwise).
	gotA, gotB := colA.count(), colB.count()
	poll.Eventually(t, "alpha's refills for what it received", func() bool {
		s, ok := sessionNamed(e.liveSessions(topic, "sub"), "alpha")
		return ok && s.granted == refilled(queueSize, gotA)
	})
	a.Pause()
	e.barrier(t, a)
	atPause := e.mark()
	const m = 200
	e.produceKeyed(t, topic, n, m, 1, messageKey)
	wantB := countOwned(n, m, ownedB)
	poll.Eventually(t, "beta's share while alpha is paused", func() bool { return colB.count()-gotB >= wantB })
	e.connectionBarrier(t)
	if got := keysOf(since(colB, gotB)); !isSubset(got, ownedB) {
		t.Fatalf("while alpha was paused beta got keys %v, beyond its own %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(ownedB)))
	}
	if d := e.wire.Delivered(wirerec.Filter{Topic: topic, Subscription: "sub", ConsumerName: "beta", Since: atPause}); d != wantB {
		t.Fatalf("the broker sent beta %d messages while alpha was paused, want its %d", d, wantB)
	}
	if flowsA := e.wire.Flows(wirerec.Filter{Topic: topic, Subscription: "sub", ConsumerName: "alpha", Since: atPause}); colA.count() != gotA || len(flowsA) != 0 {
		t.Fatalf("paused alpha: %d messages to the application, FLOWs %+v", colA.count()-gotA, flowsA)
	}

	// Resumed: alpha gets exactly its keys' messages.
	a.Resume()
	wantA := countOwned(n, m, ownedA)
	poll.Eventually(t, "alpha's share after resume", func() bool { return colA.count()-gotA == wantA })
	if got := keysOf(since(colA, gotA)); !isSubset(got, ownedA) {
		t.Fatalf("after resume alpha got keys %v, want only its own %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(ownedA)))
	}

	// Stopped: alpha's keys, and the messages it held while paused, go to beta.
	poll.Eventually(t, "every ack on the broker", func() bool { return e.backlog(t, topic, "sub") == 0 })
	a.Pause()
	gotB = colB.count()
	e.produceKeyed(t, topic, n+m, m, 1, messageKey)
	poll.Eventually(t, "beta's share before the stop", func() bool { return colB.count()-gotB >= countOwned(n+m, m, ownedB) })
	a.Stop()
	if st := a.Status(); st.State != protocol.Stopped || st.Connected {
		t.Fatalf("status after Stop: %+v", st)
	}
	poll.Eventually(t, "every message at beta once alpha stopped", func() bool { return len(distinctOf(since(colB, gotB))) >= m })
	for s := range distinctOf(since(colB, gotB)) {
		if s < n+m || s >= n+2*m {
			t.Fatalf("beta got %d again after alpha stopped", s)
		}
	}
	if got := keysOf(since(colB, gotB)); len(got) != keys {
		t.Fatalf("with alpha stopped beta got keys %v, want all %d", slices.Sorted(maps.Keys(got)), keys)
	}

	// Running again under the same name, alpha takes its keys back.
	if err := a.Run(); err != nil {
		t.Fatal(err)
	}
	a.Resume()
	gotA, gotB = colA.count(), colB.count()
	poll.Eventually(t, "alpha subscribed again", func() bool { return len(e.liveSessions(topic, "sub")) == 2 })
	e.produceKeyed(t, topic, n+2*m, n, 1, messageKey)
	poll.Eventually(t, "the last messages", func() bool { return colA.count()-gotA+colB.count()-gotB >= n })
	if ga, gb := keysOf(since(colA, gotA)), keysOf(since(colB, gotB)); !isSubset(ga, ownedA) || !isSubset(gb, ownedB) {
		t.Fatalf("after Run: alpha got %v (owned %v), beta got %v (owned %v)", slices.Sorted(maps.Keys(ga)), slices.Sorted(maps.Keys(ownedA)),
			slices.Sorted(maps.Keys(gb)), slices.Sorted(maps.Keys(ownedB)))
	}
}

// refilled is what pulsar-client-go (v0.19 to v0.21) has granted in all once it has handed
// `received` messages to its MessageChannel: the initial grant of q, then q/2 each time it has
// handed over another q/2.
func refilled(q, received int) int64 {
	half := q / 2
	return int64(q + received/half*half)
}

func isSubset(a, b map[string]bool) bool {
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

func distinctOf(seqs []int) map[int]bool {
	out := map[int]bool{}
	for _, s := range seqs {
		out[s] = true
	}
	return out
}

func TestIntegrationPausedKeepsFailoverOwnershipStoppedReleasesIt(t *testing.T) {
	e := newEnv(t)
	topic := uniqueTopic(t)
	opts := pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Type: pulsar.Failover, ReceiverQueueSize: queueSize}
	consumers := map[string]*Consumer{}
	cols := map[string]*collector{}
	for _, name := range []string{"one", "two"} {
		opts.Name = name
		consumers[name] = e.subscribe(t, opts)
		cols[name] = collect(t, consumers[name])
	}
	activeName := e.activeConsumer(t, topic, "sub", 2)
	standbyName := map[string]string{"one": "two", "two": "one"}[activeName]
	active := consumers[activeName]
	e.produce(t, topic, 0, 20, 1)
	poll.Eventually(t, "the first messages at the active consumer", func() bool { return cols[activeName].count() == 20 })

	// Paused: the active consumer keeps the subscription; the standby gets nothing.
	active.Pause()
	atPause := e.mark()
	e.produce(t, topic, 20, 100, 1)
	poll.Eventually(t, "the active consumer's grant spent, or the consumer gone", func() bool {
		s, ok := sessionNamed(e.liveSessions(topic, "sub"), activeName)
		return !ok || s.outstanding() <= 0
	})
	waitFailoverDelay(t, e)
	e.connectionBarrier(t)
	if _, ok := sessionNamed(e.liveSessions(topic, "sub"), activeName); !ok {
		t.Fatal("the paused active consumer is not connected")
	}
	standbyOnly := wirerec.Filter{Topic: topic, Subscription: "sub", ConsumerName: standbyName, Since: atPause}
	if d := e.wire.Delivered(standbyOnly); d != 0 || cols[standbyName].count() != 0 {
		t.Fatalf("while the active consumer was paused the standby was sent %d messages and received %d", d, cols[standbyName].count())
	}
	for _, ev := range e.wire.Events(standbyOnly, pb.BaseCommand_ACTIVE_CONSUMER_CHANGE) {
		if ev.Active {
			t.Fatalf("the standby became active while the active consumer was paused: %+v", ev)
		}
	}
	if now := e.activeConsumer(t, topic, "sub", 2); now != activeName {
		t.Fatalf("active consumer %s after the pause, want %s", now, activeName)
	}
	active.Resume()
	poll.Eventually(t, "every message at the resumed active consumer", func() bool { return len(cols[activeName].distinct()) == 120 })
	poll.Eventually(t, "every ack on the broker", func() bool { return e.backlog(t, topic, "sub") == 0 })

	// Stopped: the standby takes over, after the broker's failover delay.
	active.Pause()
	e.produce(t, topic, 120, 30, 1)
	active.Stop()
	if now := e.activeConsumer(t, topic, "sub", 1); now != standbyName {
		t.Fatalf("active consumer %s after the stop, want %s", now, standbyName)
	}
	poll.Eventually(t, "the messages at the standby", func() bool { return len(cols[standbyName].distinct()) == 30 })
	if got := slices.Sorted(maps.Keys(cols[standbyName].distinct())); got[0] != 120 {
		t.Fatalf("the standby got %v, want 120..149", got)
	}

	// Running again under the same name, the former active consumer is picked again.
	if err := active.Run(); err != nil {
		t.Fatal(err)
	}
	active.Resume()
	if now := e.activeConsumer(t, topic, "sub", 2); now != activeName {
		t.Fatalf("active consumer %s after Run, want %s (the choice depends on names only)", now, activeName)
	}
}

func sessionNamed(live []wireSession, name string) (wireSession, bool) {
	for _, s := range live {
		if s.Name == name {
			return s, true
		}
	}
	return wireSession{}, false
}

// waitFailoverDelay returns once a Failover switch started now on a canary subscription has
// completed: the broker's failover delay (activeConsumerFailoverDelayTimeMillis) has passed, so
// any switch it would have started before the call has completed as well.
func waitFailoverDelay(t testing.TB, e *env) {
	t.Helper()
	topic := uniqueTopic(t) + "-canary"
	opts := pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "canary", Type: pulsar.Failover}
	canaries := map[string]pulsar.Consumer{}
	for _, name := range []string{"one", "two"} {
		opts.Name = name
		canaries[name] = e.subscribeRaw(t, opts)
	}
	active := e.activeConsumer(t, topic, "canary", 2)
	canaries[active].Close()
	other := map[string]string{"one": "two", "two": "one"}[active]
	if now := e.activeConsumer(t, topic, "canary", 1); now != other {
		t.Fatalf("canary active consumer %s, want %s", now, other)
	}
	e.produce(t, topic, 0, 1, 1)
	testkit.ReceiveAndAck(t, canaries[other], 1, receiveLimit)
}
