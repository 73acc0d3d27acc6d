package agent

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/internal/seam"
	"github.com/subflow-dev/subflow/agent/protocol"
)

// The control server sees the agent through seam.AgentHost: its name and kind, its consumers
// with the topic and options the application gave, the hook for later ones, the start-up sync
// and the controller's state.
func TestAgentHostDrivesTheAgent(t *testing.T) {
	ctx := context.Background()
	fc := &fakeClient{}
	a := newTestAgent(t, Options{Name: "pod-a", StartGated: true, SyncTimeout: time.Hour})
	host := seam.AgentHost(a)
	if host.Name() != "pod-a" || host.Kind() != protocol.KindAgent {
		t.Fatalf("host %q of kind %q, want pod-a, %q", host.Name(), host.Kind(), protocol.KindAgent)
	}
	var hooked []seam.Consumer
	host.OnSubscribe(func(c seam.Consumer) { hooked = append(hooked, c) })
	c := subscribeFake(t, a, fc, pulsar.ConsumerOptions{Name: "c1"})
	got := host.Consumers()
	if len(got) != 1 || len(hooked) != 1 || got[0] != hooked[0] {
		t.Fatalf("consumers %v, hooked %v: want the one consumer in both", got, hooked)
	}
	if ctl := got[0]; ctl.Name() != "c1" || ctl.Topic() != "persistent://public/default/t" || ctl.Options().SubscriptionName != "sub" {
		t.Fatalf("consumer %q on %q, options %+v", ctl.Name(), ctl.Topic(), ctl.Options())
	}
	if c.State() != protocol.Paused {
		t.Fatalf("state %s before the first sync, want Paused", c.State())
	}
	host.MarkSynced()
	poll.Eventually(t, "Running once synced", func() bool { return c.State() == protocol.Running })
	if err := got[0].SetState(ctx, protocol.Stopped, 1); err != nil || c.State() != protocol.Stopped {
		t.Fatalf("SetState(Stopped, 1) = %v, state %s", err, c.State())
	}
}

// A request older than the one applied waits for a transition in progress, is refused and
// changes nothing: the chaos harness's strict-pause check waits for transitions that way.
func TestStaleStateWaitsForTheTransitionAndChangesNothing(t *testing.T) {
	ctx := context.Background()
	a := newTestAgent(t, Options{})
	c := subscribeFake(t, a, &fakeClient{}, pulsar.ConsumerOptions{})
	ctl := seam.AgentHost(a).Consumers()[0]
	if err := ctl.SetState(ctx, protocol.Paused, 3); err != nil {
		t.Fatal(err)
	}
	if err := c.transitions.lock(ctx); err != nil { // a transition in progress
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- ctl.SetState(ctx, protocol.Running, -1) }()
	select {
	case err := <-done:
		c.transitions.unlock()
		t.Fatalf("returned %v while a transition held the lock", err)
	case <-time.After(50 * time.Millisecond): // the window in which it must not return
	}
	c.transitions.unlock()
	var err error
	select {
	case err = <-done:
	case <-time.After(waitLimit):
		t.Fatal("still waiting after the transition ended")
	}
	var stale *StaleGenerationError
	if !errors.As(err, &stale) || stale.Applied != 3 || c.State() != protocol.Paused {
		t.Fatalf("err %v, state %s: want a StaleGenerationError naming generation 3, still Paused", err, c.State())
	}
}

// controlled is c as the control server drives it.
func controlled(c *Consumer) controlledConsumer { return controlledConsumer{c} }
