package sidecar

import (
	"testing"
	"time"

	"github.com/subflow-dev/subflow/agent/protocol"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
)

// With StartGated, for each client: a consumer that subscribes before the controller's first
// push sends the broker no permit and its application gets nothing; a first push that pauses
// it keeps it so (the gate lifts after the push's rules hold); a rule for another
// subscription lifts the gate for it, and everything arrives.
func TestStartGatedUntilTheFirstPush(t *testing.T) {
	forEachPeer(t, func(t *testing.T, lang string) {
		w := newWorld(t, Options{Name: "pod-" + lang, StartGated: true, SyncTimeout: time.Hour})
		api := startControl(t, w)
		topic, name := uniqueTopic(t), "app-"+lang
		producer := newClient(t, w.url)
		sent := produceUnbatched(t, producer, topic, "m", 0, 20)
		app := startPeer(t, lang, w.url, peerOptions{topic: topic, subscription: "s", name: name, subType: "Shared", queue: 10})
		c := consumerNamed(t, w.sidecar, "s", name)
		eventually(t, "the client's first FLOW to be withheld", func() bool { return c.Counts().Owed > 0 })
		onWire := wirerec.Filter{Subscription: "s", ConsumerName: name}
		if permits, n := w.rec.Permits(onWire), app.count(); permits != 0 || n != 0 || c.Status().State != protocol.Paused {
			t.Fatalf("before the first push: %d permits reached the broker, the application got %d, the consumer is %s; want 0, 0, Paused",
				permits, n, c.Status().State)
		}

		pause := protocol.FlowRequest{UID: "uid-1", Revision: 1, Subscription: "s", State: protocol.Paused}
		if st := api.push(t, "orders", pause); len(st.Consumers) != 1 || st.Consumers[0].State != protocol.Paused {
			t.Fatalf("the first push answered %+v, want the consumer Paused", st.Consumers)
		}
		if !w.sidecar.Synced() {
			t.Fatal("the first push did not lift the start-up gate")
		}
		if permits, n := w.rec.Permits(onWire), app.count(); permits != 0 || n != 0 {
			t.Fatalf("after a first push that pauses: %d permits reached the broker and the application got %d, want 0 and 0", permits, n)
		}

		pause.Revision, pause.State = 2, protocol.Running
		api.push(t, "orders", pause)
		eventually(t, "the application to receive all 20 once Running", func() bool { return len(missing(sent, app.messages())) == 0 })
	})
}

// A consumer no rule governs runs once the gate lifts: at the first push for another
// subscription, or at SyncTimeout with FallbackState (Running by default).
func TestStartGateLiftsForConsumersNoRuleGoverns(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
		lift func(t *testing.T, w *world, api *controlAPI)
	}{
		{"first push for another subscription", Options{StartGated: true, SyncTimeout: time.Hour}, func(t *testing.T, _ *world, api *controlAPI) {
			api.push(t, "other", protocol.FlowRequest{UID: "uid-9", Revision: 1, Subscription: "someone-else", State: protocol.Paused})
		}},
		{"sync timeout", Options{StartGated: true, SyncTimeout: 500 * time.Millisecond}, func(*testing.T, *world, *controlAPI) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, tc.opts)
			api := startControl(t, w)
			topic := uniqueTopic(t)
			producer := newClient(t, w.url)
			sent := produceUnbatched(t, producer, topic, "m", 0, 10)
			app := startPeer(t, "go", w.url, peerOptions{topic: topic, subscription: "s", name: "app", subType: "Shared", queue: 10})
			c := consumerNamed(t, w.sidecar, "s", "app")
			eventually(t, "the client's first FLOW to be withheld", func() bool { return c.Counts().Owed > 0 })
			tc.lift(t, w, api)
			eventually(t, "the application to receive all 10 once the gate lifted", func() bool { return len(missing(sent, app.messages())) == 0 })
			if st := c.Status().State; st != protocol.Running {
				t.Fatalf("the consumer is %s after the gate lifted, want Running", st)
			}
		})
	}
}

// A bad fallback state is refused.
func TestStartGateRefusesAnUnknownFallback(t *testing.T) {
	if _, err := New(Options{BrokerURL: "pulsar://127.0.0.1:6650", StartGated: true, FallbackState: "Pausd"}); err == nil {
		t.Fatal("New accepted fallback state Pausd")
	}
}
