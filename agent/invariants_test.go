package agent

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"
)

// Every test of the package checks the gate's invariants each time a goroutine releases c.mu
// (unlockGate, and closeGateLocked before it waits): a violation panics with the gate's fields,
// naming the transition in its stack.
func init() { checkGate = mustHoldGateInvariants }

func mustHoldGateInvariants(c *Consumer) {
	if broken := gateInvariants(c); len(broken) > 0 {
		panic(fmt.Sprintf("gate invariants broken: %s\ngate: %s", strings.Join(broken, "; "), gateDump(c)))
	}
}

// gateInvariants returns the invariants c breaks; c.mu is held.
func gateInvariants(c *Consumer) []string {
	var broken []string
	check := func(holds bool, invariant string) {
		if !holds {
			broken = append(broken, invariant)
		}
	}
	open, plugged, live, src := c.phase == gateOpen, c.plug.isPlugged(), c.live.Load(), c.plug.source()
	check(c.phase == gateClosed || open || c.phase == gateClosing, "the phase is closed, open or closing")
	// A consumer closed for good hands nothing over; finish closes the gate before it ends.
	check(!c.closed || !open, "closed for good => gate not open")
	// ended is the lock-free copy of closed (endLocked writes both).
	check(c.ended.Load() == c.closed, "ended == closed")
	// The gate opens only on a subscribed consumer, and Stop closes it before unsubscribing.
	check(!open || c.inner != nil, "gate open => subscribed")
	// src is the MessageChannel the current client consumer was subscribed with.
	check((c.inner == nil) == (src == nil), "subscribed <=> src")
	// live is the lock-free copy of inner (setInnerLocked writes both).
	check((live == nil) == (c.inner == nil) && (live == nil || live.Consumer == c.inner), "live == inner")
	// closeGateLocked returns only once every taker delivered or put back; new ones join an open gate only.
	check(c.phase != gateClosed || c.takers == 0, "gate closed => no taker has a message in hand")
	check(c.takers >= 0, "takers >= 0")
	// A plugged src is what keeps the client from pushing (returning permits) while gated.
	check(!plugged || !open, "plugged => gate not open")
	// Nobody takes from a plugged src but unplugLocked, and the client cannot push into a full one.
	check(!plugged || (src != nil && len(src) == cap(src)), "plugged => src full")
	// A zero-queue src is unbuffered: the client's own Receive reads it, so it is never plugged.
	check(!plugged || !c.zeroQueue, "plugged => not zero-queue")
	// The plug's bookkeeping describes the plugged src only.
	check(plugged || (c.plug.real == 0 && !c.plug.discard && c.plug.discardOf == nil), "unplugged => no plug bookkeeping")
	check(c.plug.real >= 0 && (src == nil || c.plug.real <= cap(src)), "0 <= plugged messages <= cap(src)")
	// The fast take skips every check of the slow path, so it is on exactly when none applies.
	check(c.fast.isOn() == (!c.slowOnly && open && !c.zeroQueue && src != nil && c.held.len() == 0 && c.handed.empty()),
		"fast <=> open, not zero-queue, subscribed, nothing held, no redelivery filter")
	// Fast takers read the fast take's src without c.mu: it must be the current src.
	check(!c.fast.isOn() || c.fast.src == src, "fast => its src is src")
	// The nacks' clock runs only while the gate is open (freezeNacksLocked stops the timer).
	check(c.nackTimer == nil || open, "nack timer => gate open")
	// Kept nacks belong to the session: closing the client consumer returns them to the broker.
	check(c.inner != nil || len(c.nacks) == 0, "unsubscribed => no kept nacks")
	// A renewal refreshes a paused session; opening or ending the session disarms it.
	check(c.renewal == nil || (!open && c.inner != nil), "renewal armed => gate not open, subscribed")
	// A zero-queue fetch runs on the client consumer; closing it waits for the fetch to end.
	check(c.fetch == nil || (c.zeroQueue && c.inner != nil), "fetch in flight => zero-queue, subscribed")
	return broken
}

func gateDump(c *Consumer) string {
	src := c.plug.source()
	return fmt.Sprintf("phase=%s closed=%v subscribed=%v src=%d/%d plugged=%v pluggedReal=%d discard=%v "+
		"takers=%d fast=%v fastTakers=%d held=%d handed=%d nacks=%d nackTimer=%v renewal=%v fetch=%v seeking=%v zeroQueue=%v",
		c.phase, c.closed, c.inner != nil, len(src), cap(src), c.plug.isPlugged(), c.plug.real, c.plug.discard,
		c.takers, c.fast.isOn(), c.fast.takers.Load(), c.held.len(), len(c.handed.ids), len(c.nacks),
		c.nackTimer != nil, c.renewal != nil, c.fetch != nil, c.seeking, c.zeroQueue)
}

// The check runs in every test, and it sees a gate that lets the client push while gated.
func TestGateInvariantsSeeABrokenPlug(t *testing.T) {
	if checkGate == nil {
		t.Fatal("the invariant check is not installed")
	}
	fc := &fakeClient{}
	c := subscribeFake(t, newTestAgent(t, Options{}), fc, pulsar.ConsumerOptions{})
	c.Pause()
	c.mu.Lock()
	defer c.mu.Unlock()
	if broken := gateInvariants(c); len(broken) != 0 {
		t.Fatalf("a paused gate breaks %v", broken)
	}
	<-c.plug.source() // a taker that stole from the plugged src: the client could push again
	broken := gateInvariants(c)
	c.plug.source() <- pulsar.ConsumerMessage{}
	if !slices.Contains(broken, "plugged => src full") {
		t.Fatalf("broken = %v, want the plug reported", broken)
	}
}
