package sidecar

import (
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/protocol"
	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
)

// peerLangs are the consumer applications the gate is tested with. The Java and Python ones
// run on a real broker only: pulsartest is written for pulsar-client-go.
var peerLangs = []string{"go", "java", "python"}

// awaitBrokerCredit waits until the broker may still send the consumer something: the
// permits on the wire exceed the messages delivered, so that a pause from now on meets
// messages sent under earlier permits.
func awaitBrokerCredit(t *testing.T, w *world, subscription, name string) {
	t.Helper()
	f := wirerec.Filter{Subscription: subscription, ConsumerName: name}
	eventually(t, "the broker to hold permits of "+name, func() bool { return w.rec.Permits(f)-int64(w.rec.Delivered(f)) > 0 })
}

func forEachPeer(t *testing.T, test func(t *testing.T, lang string)) {
	for _, lang := range peerLangs {
		t.Run(lang, func(t *testing.T) {
			if lang != "go" {
				needRealBroker(t)
			}
			test(t, lang)
		})
	}
}

// Paused, for each client: a consumer that subscribes during a pause gets no permit to the
// broker and its application nothing; resumed, it gets everything. Paused again with permits
// outstanding at the broker, what the broker sends is held in the sidecar, the application
// gets nothing it had not been handed before the pause, and on resume everything arrives.
func TestPauseWithholdsFlowAndHoldsMessages(t *testing.T) {
	forEachPeer(t, func(t *testing.T, lang string) {
		w := newWorld(t)
		topic, name := uniqueTopic(t), "app-"+lang
		producer := newClient(t, w.url)
		sent := produceUnbatched(t, producer, topic, "m", 0, 40)

		pauseOnSubscribe(w.sidecar, name)
		app := startPeer(t, lang, w.url, peerOptions{topic: topic, subscription: "s", name: name, subType: "Exclusive", queue: 10})
		c := consumerNamed(t, w.sidecar, "s", name)
		eventually(t, "the client's first FLOW to be withheld", func() bool { return c.Counts().Owed > 0 })
		onWire := wirerec.Filter{Subscription: "s", ConsumerName: name}
		if permits := w.rec.Permits(onWire); permits != 0 {
			t.Fatalf("%d permits reached the broker for a consumer paused from its subscribe", permits)
		}
		if n := app.count(); n != 0 {
			t.Fatalf("the application received %d messages while paused from the start", n)
		}

		setState(t, c, protocol.Running)
		eventually(t, "the application to receive the first 40", func() bool { return len(missing(sent, app.messages())) == 0 })

		awaitBrokerCredit(t, w, "s", name)
		setState(t, c, protocol.Paused)
		mark := w.rec.Mark()
		deliveredAtPause := c.Counts().Delivered
		during := produceUnbatched(t, producer, topic, "m", 40, 80)
		eventually(t, "messages sent under earlier permits to be held", func() bool { return c.Counts().Held > 0 })
		onWire.Since = mark
		if permits := w.rec.Permits(onWire); permits != 0 {
			t.Errorf("%d permits reached the broker after SetState(Paused) returned", permits)
		}
		if closes := w.rec.Events(onWire, pb.BaseCommand_CLOSE_CONSUMER); len(closes) > 0 {
			t.Errorf("the pause closed the broker-side consumer (Key_Shared ranges and Failover ownership would move): %+v", closes)
		}
		if n := app.count(); int64(n) > deliveredAtPause {
			t.Errorf("the application received %d messages, more than the %d handed to its client before the pause", n, deliveredAtPause)
		}
		held := c.Counts().Held
		if leaked := common(during, app.messages()); len(leaked) > 0 {
			t.Errorf("messages produced during the pause reached the application: %v", leaked)
		}

		setState(t, c, protocol.Running)
		all := append(sent, during...)
		eventually(t, "the application to receive all 80 after resume", func() bool { return len(missing(all, app.messages())) == 0 })
		t.Logf("%s: %d messages held during the pause, delivered on resume", lang, held)
		eventually(t, "a FLOW to reach the broker after resume", func() bool {
			return w.rec.Permits(wirerec.Filter{Subscription: "s", ConsumerName: name, Since: mark}) > 0
		})
	})
}

// Stopped, for each client: the broker-side consumer is closed, so what it had been sent and
// the sidecar held goes to a sibling, and so does everything produced while it is stopped;
// Running again subscribes it with the client's own SUBSCRIBE and permits flow again.
func TestStoppedReleasesToSibling(t *testing.T) {
	forEachPeer(t, func(t *testing.T, lang string) {
		w := newWorld(t)
		topic, name := uniqueTopic(t), "app-"+lang
		producer := newClient(t, w.url)
		sent := produce(t, producer, topic, "m", 0, 40)
		app := startPeer(t, lang, w.url, peerOptions{topic: topic, subscription: "s", name: name, queue: 10})
		c := consumerNamed(t, w.sidecar, "s", name)
		eventually(t, "the application to receive the first 40", func() bool { return len(missing(sent, app.messages())) == 0 })

		awaitBrokerCredit(t, w, "s", name)
		setState(t, c, protocol.Paused)
		during := produce(t, producer, topic, "m", 40, 60)
		eventually(t, "messages to be held", func() bool { return c.Counts().Held > 0 })
		held := c.Counts().Held

		sibling := subscribe(t, newClient(t, w.brokerTU), pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s", Name: "sibling", Type: pulsar.Shared})
		var siblingGot []string
		receiveBySibling := func(want []string) func() bool {
			return func() bool {
				siblingGot = append(siblingGot, drain(sibling)...)
				return len(missing(want, siblingGot)) == 0
			}
		}

		mark := w.rec.Mark()
		setState(t, c, protocol.Stopped)
		closes := w.rec.Events(wirerec.Filter{Subscription: "s", ConsumerName: name, Since: mark}, pb.BaseCommand_CLOSE_CONSUMER)
		if len(closes) == 0 || closes[0].Dir != wirerec.FromClient {
			t.Fatalf("no CLOSE_CONSUMER from the sidecar to the broker after Stopped: %+v", closes)
		}
		if n := c.Counts().Held; n != 0 {
			t.Errorf("%d messages still held after Stopped", n)
		}
		eventually(t, "the sibling to get what the stopped consumer had been sent", receiveBySibling(during))
		whileStopped := produce(t, producer, topic, "m", 60, 80)
		eventually(t, "the sibling to get what was produced while stopped", receiveBySibling(whileStopped))
		if leaked := common(append(during, whileStopped...), app.messages()); len(leaked) > 0 {
			t.Errorf("the application received messages produced after its pause: %v", leaked)
		}
		t.Logf("%s: %d messages held at the stop went to the sibling", lang, held)

		mark = w.rec.Mark()
		setState(t, c, protocol.Running)
		if n := len(w.rec.Consumers(wirerec.Filter{Subscription: "s", ConsumerName: name, Since: mark})); n != 1 {
			t.Fatalf("%d SUBSCRIBEs for %s after Running, want 1", n, name)
		}
		eventually(t, "permits to flow again", func() bool {
			return w.rec.Permits(wirerec.Filter{Subscription: "s", ConsumerName: name, Since: mark}) > 0
		})
		after := produce(t, producer, topic, "m", 80, 100)
		all := append(append(append(sent, during...), whileStopped...), after...)
		eventually(t, "every message to reach one of the two applications", func() bool {
			siblingGot = append(siblingGot, drain(sibling)...)
			return len(missing(all, append(app.messages(), siblingGot...))) == 0
		})
	})
}

// A lost connection while paused, for each client: the client reconnects through the
// sidecar, the new consumer takes the paused state before its SUBSCRIBE goes on (the rules in
// force, here a hook), so the broker gets no permit and the application nothing; resumed,
// everything arrives.
func TestReconnectWhilePausedGrantsNothing(t *testing.T) {
	forEachPeer(t, func(t *testing.T, lang string) {
		w := newWorld(t)
		topic, name := uniqueTopic(t), "app-"+lang
		producer := newClient(t, w.url)
		sent := produceUnbatched(t, producer, topic, "m", 0, 20)
		app := startPeer(t, lang, w.url, peerOptions{topic: topic, subscription: "s", name: name, subType: "Failover", queue: 10})
		first := consumerNamed(t, w.sidecar, "s", name)
		eventually(t, "the application to receive the first 20", func() bool { return len(missing(sent, app.messages())) == 0 })

		pauseOnSubscribe(w.sidecar, name)
		setState(t, first, protocol.Paused)
		received := app.count()
		mark := w.rec.Mark()
		w.rec.DropConnections()
		var again *Consumer
		eventually(t, "the client to subscribe again through the sidecar", func() bool {
			for _, c := range w.sidecar.Consumers() {
				if c != first && c.Name() == name && c.Status().Connected && c.Counts().Owed > 0 {
					again = c
					return true
				}
			}
			return false
		})
		during := produceUnbatched(t, producer, topic, "m", 20, 40)
		onWire := wirerec.Filter{Subscription: "s", ConsumerName: name, Since: mark}
		if n := len(w.rec.Consumers(onWire)); n == 0 {
			t.Fatal("no SUBSCRIBE on the broker side after the connection loss")
		}
		if permits := w.rec.Permits(onWire); permits != 0 {
			t.Errorf("%d permits reached the broker after the reconnect while paused", permits)
		}
		if leaked := common(during, app.messages()); len(leaked) > 0 {
			t.Errorf("messages produced after the pause reached the application: %v", leaked)
		}
		t.Logf("%s: %d received before the pause, %d after; %d permits withheld after the reconnect", lang, received, app.count()-received, again.Counts().Owed)

		setState(t, again, protocol.Running)
		all := append(sent, during...)
		eventually(t, "every message to reach the application after resume", func() bool { return len(missing(all, app.messages())) == 0 })
	})
}
