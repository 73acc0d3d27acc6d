package sidecar

import (
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/protocol"
	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
)

// In front of a broker that names itself in lookup answers, the sidecar changes them to
// route through it and dials the broker the client names. The broker's own record of FLOW
// commands shows none while paused, also after the connection was lost and the client
// subscribed again: the rules (here a hook) pause the new consumer before its SUBSCRIBE goes
// on.
func TestDirectBrokerReconnectWhilePausedGrantsNothing(t *testing.T) {
	b := pulsartest.Start(t)
	sc, url := startSidecar(t, Options{BrokerURL: b.ServiceURL()})
	topic := uniqueTopic(t)
	client := newClient(t, url)
	cons := subscribe(t, client, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s", Name: "c1", ReceiverQueueSize: 10})
	sent := produce(t, client, topic, "m", 0, 20)
	if m := missing(sent, receiveN(t, cons, len(sent))); len(m) > 0 {
		t.Fatalf("missing %v", m)
	}
	first := consumerNamed(t, sc, "s", "c1")
	if len(b.Flows(topic, "s")) == 0 {
		t.Fatal("the broker saw no FLOW: the client did not go through the sidecar")
	}

	pauseOnSubscribe(sc, "c1")
	setState(t, first, protocol.Paused)
	flowsAtPause := len(b.Flows(topic, "s"))
	b.DropConnections()
	var again *Consumer
	eventually(t, "the client to subscribe again through the sidecar", func() bool {
		for _, c := range sc.Consumers() {
			if c != first && c.Name() == "c1" && c.Counts().Owed > 0 {
				again = c
				return true
			}
		}
		return false
	})
	during := produce(t, client, topic, "m", 20, 40)
	if n := len(b.Flows(topic, "s")); n != flowsAtPause {
		t.Fatalf("the broker received %d FLOWs after the pause, across a reconnect", n-flowsAtPause)
	}

	setState(t, again, protocol.Running)
	if m := missing(during, receiveN(t, cons, len(during))); len(m) > 0 {
		t.Fatalf("missing after resume: %v", m)
	}
}
