package agent

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// The gate decides whether a message taken from the client may reach the application.
//
// pulsar-client-go returns a flow permit to the broker each time its dispatcher pushes a
// message into the consumer's MessageChannel (src, owned by the gate, channelCapacity slots,
// as the client's own default). So whether permits flow depends on whether src has room.
// The gate's phases, and who may take from src:
//
//	gateOpen     takers (Receive, the Chan pump) take from held first, then from src, and hand
//	             over; the client's dispatcher fills src as the raw client's would.
//	gateClosing  closeGateLocked runs: takers are told to put back what they have in hand
//	             (front of held), and it waits for them; then it plugs src: it fills every free
//	             slot with a placeholder, so that the dispatcher cannot push any more.
//	gateClosed   nobody takes from src; it is full (the messages the client pushed before the
//	             plug, then placeholders), so no permit is returned. openGateLocked unplugs it:
//	             it takes exactly channelCapacity items, holding the messages in order and
//	             dropping the placeholders, before takers may take again.
//
// Invariant: once closeGateLocked returns, no message is handed to the application, and the
// client can push nothing into src (hence return no permit) until openGateLocked.
//
// A zero-queue consumer differs: src is unbuffered and never plugged, because the client's own
// Receive reads it (see zeroqueue.go); its fetch in flight is the only taker, and its message
// is held when the gate is closed.
//
// The gate is built from three parts that own their fields and change them only through
// their methods (plug.go, held.go, fasttake.go): the plug (src and its placeholders), the held queue,
// and the switch of the lock-free fast take. openGateLocked and closeGateLocked are the only
// code that changes the phase. The plug is filled by plugLocked (closeGateLocked) and drained
// by unplugLocked (openGateLocked, and a client-side seek, which empties src itself);
// setInnerLocked gives it a new src, or none. All run with Consumer.mu held, which is
// released through unlockGate.
type gatePhase int

const (
	gateClosed gatePhase = iota
	gateOpen
	gateClosing
)

func (p gatePhase) String() string {
	switch p {
	case gateClosed:
		return "closed"
	case gateOpen:
		return "open"
	case gateClosing:
		return "closing"
	}
	return fmt.Sprintf("gatePhase(%d)", int(p))
}

// channelCapacity is the size of the client's MessageChannel, the client's own default: a
// closed gate holds at most this many messages from before the pause.
const channelCapacity = 10

// gate is the state the message path reads; guarded by Consumer.mu.
type gate struct {
	phase   gatePhase
	changed chan struct{} // closed and replaced whenever the phase changes
	plug    plug          // the client's MessageChannel
	// takers counts goroutines that may take from src or hold a message in hand; closing
	// waits for it to drop to zero.
	takers int
	held   heldQueue
	fetch  *zeroQueueFetch // the zero-queue Receive in flight, at most one
	// skips is the filter of the last seek into a batch entry (skip.go); read lock-free by
	// every take, replaced whole.
	skips  atomic.Pointer[skipSet]
	handed redeliveryFilter // messages held while closed, to drop their redelivered copies

	// fast is the take without c.mu (takeFast); see syncFastLocked. slowOnly turns it off,
	// for the benchmarks that measure what it saves.
	fast     fastTake
	slowOnly bool

	receivedWhilePaused int64
}

// openGateLocked unplugs src and lets messages reach the application.
func (c *Consumer) openGateLocked() {
	if c.phase == gateOpen || c.closed || c.inner == nil {
		return
	}
	c.unplugLocked()
	c.disarmRenewalLocked()
	c.phase = gateOpen
	c.thawNacksLocked()
	c.syncFastLocked()
	c.signalLocked()
}

// closeGateLocked closes the gate and returns only when nothing can be handed over or pushed
// by the client any more: every taker delivered before this call or put its message back, and
// src is plugged.
func (c *Consumer) closeGateLocked() {
	if c.phase == gateOpen {
		c.phase = gateClosing
		c.freezeNacksLocked()
		c.syncFastLocked()
		c.signalLocked()
		for c.takers > 0 || c.fast.busy() {
			checkGateLocked(c) // Wait releases c.mu
			c.takersGo.Wait()
		}
		c.phase = gateClosed
	}
	c.plugLocked()
}

// plugLocked plugs src, so that the client can push no more into it.
func (c *Consumer) plugLocked() {
	c.plug.fill()
	c.metrics.held.Set(float64(c.heldCountLocked()))
}

// unplugLocked takes back what the plugged src holds: the messages the client pushed before the
// plug are held in order (new pushes land behind them), the placeholders are dropped, and so
// are the broker's copies of messages the gate holds (a reconnect while paused sent them).
func (c *Consumer) unplugLocked() {
	c.plug.drain(func(cm pulsar.ConsumerMessage) {
		if !c.skipBeforeTarget(cm) && !c.heldCopyLocked(cm) {
			c.holdLocked(cm, false)
		}
	})
	c.metrics.held.Set(float64(c.heldCountLocked()))
}

// heldCountLocked counts the messages taken from the client that wait for the gate to open.
func (c *Consumer) heldCountLocked() int { return c.held.len() + c.plug.held() }

// dropOnArrival reports whether a message just taken from the client never reaches the
// application: it lies before a seek target inside the target's batch entry (acked), or it
// is the broker's second copy of a message the gate held and already handed over.
func (c *Consumer) dropOnArrivalLocked(cm pulsar.ConsumerMessage) bool {
	if c.skipBeforeTarget(cm) {
		return true
	}
	if c.handed.empty() {
		return false
	}
	id := cm.Message.ID()
	dup := c.handed.seenAgain(id)
	if dup {
		c.metrics.duplicatesDropped.Inc()
	}
	c.syncFastLocked()
	return dup
}

// heldCopyLocked reports whether cm is a copy the broker sent again of a message the gate held.
// Unlike a take, it ends no entry: a message still in src may have been pushed before the
// reconnect, so it says nothing about the order in which the broker sends.
func (c *Consumer) heldCopyLocked(cm pulsar.ConsumerMessage) bool {
	if !c.handed.copyOf(cm.Message.ID()) {
		return false
	}
	c.metrics.duplicatesDropped.Inc()
	return true
}

// lockOpen waits until the gate is open and returns with c.mu held, along with the channel
// that signals the next gate change. On error (consumer closed, ctx ended) c.mu is not held.
func (c *Consumer) lockOpen(ctx context.Context) (<-chan struct{}, error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.unlockGate()
			return nil, ErrConsumerClosed
		}
		changed := c.changed
		if c.phase == gateOpen {
			return changed, nil
		}
		c.unlockGate()
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// A hand gives a message to the application for a taker that still counts as one. It returns
// false when changed fires first: the gate may be closing, and the message goes back to held.
type hand func(cm pulsar.ConsumerMessage, changed <-chan struct{}) bool

// next blocks until a message may reach the application and returns it. With a hand (the Chan
// pump), next hands the message over itself and returns once it is taken; the taker counts as
// one until then, so that closeGateLocked never returns with a message in anyone's hand.
func (c *Consumer) next(ctx context.Context, give hand) (pulsar.ConsumerMessage, error) {
	for {
		if cm, ok, err := c.takeFast(ctx, give); ok || err != nil {
			return cm, err
		}
		changed, err := c.lockOpen(ctx)
		if err != nil {
			return pulsar.ConsumerMessage{}, err
		}
		if cm, ok := c.popHeldLocked(); ok {
			if give == nil {
				c.unlockGate()
				return cm, nil
			}
			c.takers++
			c.unlockGate()
			if c.handOverInHand(cm, changed, give) {
				return cm, nil
			}
			continue
		}
		if c.fast.isOn() {
			c.unlockGate()
			continue
		}
		src := c.plug.source()
		c.takers++
		c.unlockGate()
		select {
		case cm := <-src:
			if c.handOver(cm, give != nil) {
				cm.Consumer = c
				if give == nil || c.handOverInHand(cm, changed, give) {
					return cm, nil
				}
			}
		case <-changed:
			c.leave()
		case <-ctx.Done():
			c.leave()
			return pulsar.ConsumerMessage{}, ctx.Err()
		}
	}
}

// handOverInHand gives cm through give while the caller counts as a taker, and then leaves. When
// the gate closes first, cm goes back to the front of held before the taker leaves.
func (c *Consumer) handOverInHand(cm pulsar.ConsumerMessage, changed <-chan struct{}, give hand) bool {
	for !give(cm, changed) {
		c.mu.Lock()
		if c.phase != gateOpen {
			c.holdLocked(cm, true) // given again, first, once the gate is open
			c.leaveLocked()
			c.unlockGate()
			return false
		}
		changed = c.changed
		c.unlockGate()
	}
	c.leave()
	return true
}

// takeFast is the take without c.mu, for the common case: the gate open, nothing held, no
// redelivery filter to apply (it applies the seek filter itself); see fastTake. With a hand, it
// gives the message before it leaves. ok is false when the slow path must decide.
func (c *Consumer) takeFast(ctx context.Context, give hand) (cm pulsar.ConsumerMessage, ok bool, err error) {
	if !c.fast.enter() {
		return cm, false, nil
	}
	defer c.leaveFast()
	src, closing, on := c.fast.channels()
	if !on {
		return cm, false, nil
	}
	for taken := false; !taken; {
		select {
		case cm = <-src:
		case <-closing:
			return cm, false, nil
		case <-ctx.Done():
			return cm, false, ctx.Err()
		}
		c.noteChunked(cm)
		taken = !c.skipBeforeTarget(cm) // a skipped message is acked and gone: take again
	}
	given := cm
	given.Consumer = c
	if c.fast.isOn() && (give == nil || give(given, closing)) {
		return given, true, nil
	}
	c.mu.Lock()
	c.holdLocked(cm, true) // the gate is closing: back to the front of held
	c.unlockGate()
	return pulsar.ConsumerMessage{}, false, nil
}

func (c *Consumer) leaveFast() {
	if c.fast.leave() {
		c.mu.Lock()
		c.takersGo.Broadcast()
		c.unlockGate()
	}
}

// syncFastLocked allows the fast take exactly when it is safe: the gate open, nothing held,
// no redelivery filter (the seek filter is the fast take's own). While the gate is open this can
// only become true (held and the filter only shrink); it becomes false in closeGateLocked, which
// then waits for fast takers.
func (c *Consumer) syncFastLocked() {
	src := c.plug.source()
	c.fast.set(!c.slowOnly && c.phase == gateOpen && !c.zeroQueue && src != nil && c.held.len() == 0 &&
		c.handed.empty(), src)
}

// handOver ends a take from src: true when the message may go to the application, false when
// a seek skips it or it is a redelivered copy, or when the gate closed meanwhile (then it goes
// back to the front of held: it is older than anything src still has). The taker leaves, unless
// it keeps the message in hand to give it (true).
func (c *Consumer) handOver(cm pulsar.ConsumerMessage, keep bool) bool {
	c.mu.Lock()
	defer c.unlockGate()
	ok := c.mayHandOverLocked(cm)
	if !ok || !keep {
		c.leaveLocked()
	}
	return ok
}

func (c *Consumer) mayHandOverLocked(cm pulsar.ConsumerMessage) bool {
	c.noteChunked(cm)
	if c.dropOnArrivalLocked(cm) {
		return false
	}
	if c.phase == gateOpen {
		return true
	}
	c.countReceivedWhilePausedLocked()
	c.holdLocked(cm, true)
	return false
}

// countReceivedWhilePausedLocked counts a message the gate took from the client while closing
// or closed.
func (c *Consumer) countReceivedWhilePausedLocked() {
	c.receivedWhilePaused++
	c.metrics.receivedWhilePaused.Inc()
}

func (c *Consumer) leave() {
	c.mu.Lock()
	c.leaveLocked()
	c.unlockGate()
}

func (c *Consumer) leaveLocked() {
	c.takers--
	if c.takers == 0 {
		c.takersGo.Broadcast()
	}
}

// pump feeds Chan(): it takes a message when the gate is open and offers it to the
// application until taken or the gate closes, in which case it holds the message again.
func (c *Consumer) pump() {
	offer := func(cm pulsar.ConsumerMessage, changed <-chan struct{}) bool {
		select {
		case c.out <- cm:
			return true
		case <-changed:
			return false
		}
	}
	for {
		if _, err := c.next(context.Background(), offer); err != nil {
			return
		}
	}
}

// holdLocked keeps a message for delivery after the gate opens; front puts it first (a
// message a taker had in hand is older than any the gate's queue still has).
func (c *Consumer) holdLocked(cm pulsar.ConsumerMessage, front bool) {
	if c.phase != gateOpen {
		// Held across a pause: if the consumer reconnects meanwhile, the broker sends it again.
		c.handed.remember(cm.Message.ID())
	}
	c.noteChunked(cm)
	c.held.push(cm, front)
	c.metrics.held.Set(float64(c.heldCountLocked()))
}

// popHeldLocked takes the oldest held message.
func (c *Consumer) popHeldLocked() (pulsar.ConsumerMessage, bool) {
	cm, ok := c.held.pop()
	if !ok {
		return cm, false
	}
	c.metrics.held.Set(float64(c.heldCountLocked()))
	c.syncFastLocked()
	cm.Consumer = c
	return cm, true
}

// dropHeldLocked drops held messages taken at or before `before` (all when zero), without
// acknowledging them: a seek made them stale. It returns how many it knows it dropped (the
// plugged src's messages of some partitions only are counted when drained).
func (c *Consumer) dropHeldLocked(before time.Time, partitions partitionSet) int {
	dropped := c.held.dropIf(func(h heldMessage) bool {
		return (before.IsZero() || !h.at.After(before)) && partitions.has(h.cm.Message.ID().PartitionIdx())
	})
	dropped += c.plug.discardBefore(before, partitions)
	c.metrics.held.Set(float64(c.heldCountLocked()))
	return dropped
}

// DropHeld drops the messages the gate holds that it took at or before `before` (all when
// before is zero) and returns how many. An agent that did not execute a seek calls it so that
// messages from before the seek never reach the application; they are not acknowledged.
func (c *Consumer) DropHeld(before time.Time) int { return c.DropHeldOf(before, nil) }

// DropHeldOf is DropHeld for the messages of some partitions only (-1 names a non-partitioned
// topic; nil names every partition): a seek that moved only some cursors leaves the others'
// messages wanted.
func (c *Consumer) DropHeldOf(before time.Time, partitions []int32) int {
	set := newPartitionSet(partitions)
	c.mu.Lock()
	defer c.unlockGate()
	n := c.dropHeldLocked(before, set)
	c.handed.forget() // the cursor moved: copies from the broker are no longer duplicates
	// and the messages of an earlier seek target's entry on a moved partition are wanted again
	c.setSkips(c.withoutSkipsOf(set))
	c.syncFastLocked()
	if n > 0 {
		c.log.Info("Held messages dropped", "dropped", n, "partitions", partitions)
	}
	return n
}

// partitionSet names partitions as the client numbers them (a non-partitioned topic is 0);
// nil names every partition.
type partitionSet map[int32]bool

func newPartitionSet(partitions []int32) partitionSet {
	if partitions == nil {
		return nil
	}
	set := partitionSet{}
	for _, p := range partitions {
		set[max(p, 0)] = true
	}
	return set
}

func (s partitionSet) has(p int32) bool { return s == nil || s[p] }

// checkGate, set only by the package's tests (invariants_test.go), verifies the gate's
// invariants each time c.mu is released, that is after every transition.
var checkGate func(*Consumer)

func checkGateLocked(c *Consumer) {
	if checkGate != nil {
		checkGate(c)
	}
}

// unlockGate releases c.mu, the gate's lock.
func (c *Consumer) unlockGate() {
	checkGateLocked(c)
	c.mu.Unlock()
}

// signalLocked wakes every goroutine waiting on the gate so that it re-checks.
func (c *Consumer) signalLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}
