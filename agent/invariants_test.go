package agent

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"
)

// Every test of the package checks the gate's invariants (gate.invariants) each time a
// goroutine releases the gate's lock, and the session's (session.invariants) each time it
// releases the consumer's transition lock: a violation panics with what broke, naming the
// transition in its stack.
func init() {
	checkGate = func(g *gate) {
		if broken := g.invariants(); len(broken) > 0 {
			panic(fmt.Sprintf("gate invariants broken: %s\ngate: %s", strings.Join(broken, "; "), g))
		}
	}
	checkSession = func(s *session) {
		if broken := s.invariants(); len(broken) > 0 {
			panic(fmt.Sprintf("session invariants broken: %s\nsession: %s", strings.Join(broken, "; "), s.state))
		}
	}
}

// The check runs in every test, and it sees a gate that lets the client push while gated.
func TestGateInvariantsSeeABrokenPlug(t *testing.T) {
	if checkGate == nil || checkSession == nil {
		t.Fatal("the invariant checks are not installed")
	}
	fc := &fakeClient{}
	c := subscribeFake(t, newTestAgent(t, Options{}), fc, pulsar.ConsumerOptions{})
	c.Pause()
	g := c.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	if broken := g.invariants(); len(broken) != 0 {
		t.Fatalf("a paused gate breaks %v", broken)
	}
	<-g.plug.source() // a taker that stole from the plugged src: the client could push again
	broken := g.invariants()
	g.plug.source() <- pulsar.ConsumerMessage{}
	if !slices.Contains(broken, "plugged => src full") {
		t.Fatalf("broken = %v, want the plug reported", broken)
	}
}

// The session's check runs in every test, and it sees a mirror that lies.
func TestSessionInvariantsSeeAStaleMirror(t *testing.T) {
	fc := &fakeClient{}
	c := subscribeFake(t, newTestAgent(t, Options{}), fc, pulsar.ConsumerOptions{})
	_ = c.transitions.lock(t.Context())
	defer func() { <-c.transitions.ch }() // released without the check: the mirror is broken
	if broken := c.session.invariants(); len(broken) != 0 {
		t.Fatalf("a running session breaks %v", broken)
	}
	live := c.session.live.Swap(nil) // acks would say Stopped while subscribed
	broken := c.session.invariants()
	c.session.live.Store(live)
	if !slices.Contains(broken, "live == inner") {
		t.Fatalf("broken = %v, want the live mirror reported", broken)
	}
}
