package agent

import (
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// During a broker outage the consumer's status says it is not connected and since when it has
// been reconnecting; once the broker is back it says connected again, with the time it
// reconnected. Before, it said connected throughout: the client's consumer object still existed.
// The client ends a failed reconnect attempt at its operation timeout, shortened here.
func TestStatusTellsABrokerOutage(t *testing.T) {
	e := newEnv(t)
	client := testkit.Client(t, pulsar.ClientOptions{URL: e.wire.ServiceURL(), OperationTimeout: 2 * time.Second,
		ConnectionTimeout: time.Second, Logger: e.clientLog.Logger()})
	c, err := e.agent.Subscribe(client, pulsar.ConsumerOptions{Topic: uniqueTopic(t), SubscriptionName: "s", Name: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	p := testkit.Poll{Within: 30 * time.Second, Every: 20 * time.Millisecond}
	if st := c.Status(); !st.Connected || st.LastConnected == nil || st.ReconnectingSince != nil {
		t.Fatalf("subscribed, the status is %+v; want connected, with the time it connected", st)
	}

	outage := time.Now()
	if err := e.wire.Outage(true); err != nil {
		t.Fatal(err)
	}
	p.Eventually(t, "the status to tell the outage", func() bool {
		st := c.Status()
		return !st.Connected && st.ReconnectingSince != nil
	})
	if st := c.Status(); st.ReconnectingSince.Before(outage) {
		t.Errorf("reconnecting since %v, before the outage began at %v", st.ReconnectingSince, outage)
	}

	back := time.Now()
	if err := e.wire.Outage(false); err != nil {
		t.Fatal(err)
	}
	p.Eventually(t, "the status to tell the reconnect", func() bool {
		st := c.Status()
		return st.Connected && st.ReconnectingSince == nil && st.LastConnected != nil && !st.LastConnected.Before(back)
	})
}
