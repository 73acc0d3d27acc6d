package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// The gate decides whether a message taken from the client may reach the application (design
// 3.2). It is one Consumer's message path, with a lock of its own; the Consumer drives it
// through the methods of this file (open, close, take, use, end, cursorMoved, ...) and never
// reads its fields. Everything else of the gate's - the held queue (held.go), the plug
// (plug.go), the lock-free fast take (fasttake.go), the redelivery filter (redelivery.go), the
// seek filter (skip.go) and the zero-queue fetch - is reached only from here.
//
// pulsar-client-go returns a flow permit to the broker each time its dispatcher pushes a
// message into the consumer's MessageChannel (src, owned by the gate, channelCapacity slots,
// as the client's own default). So whether permits flow depends on whether src has room.
// The gate's phases, and who may take from src:
//
//	gateOpen     takers (Receive, the Chan pump) take from held first, then from src, and hand
//	             over; the client's dispatcher fills src as the raw client's would.
//	gateClosing  close runs: takers are told to put back what they have in hand (front of
//	             held), and it waits for them; then it plugs src: it fills every free slot with
//	             a placeholder, so that the dispatcher cannot push any more.
//	gateClosed   nobody takes from src; it is full (the messages the client pushed before the
//	             plug, then placeholders), so no permit is returned. open unplugs it: it takes
//	             exactly channelCapacity items, holding the messages in order and dropping the
//	             placeholders, before takers may take again.
//
// Invariant: once close returns, no message is handed to the application, and the client can
// push nothing into src (hence return no permit) until open. invariants, at the end of this
// file, lists every invariant the gate keeps; the package's tests check them each time the
// gate's lock is released.
//
// A zero-queue consumer differs: src is unbuffered and never plugged, because the client's own
// Receive reads it; its fetch in flight (takeZeroQueue) is the only taker, and its message is
// held when the gate is closed.
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

// gate is one consumer's message path. Its fields are guarded by mu, except those said to be
// lock-free.
type gate struct {
	mu       sync.Mutex
	takersGo *sync.Cond    // signalled when takers drops to zero, and when the last fast taker leaves
	changed  chan struct{} // closed and replaced whenever the phase changes or the gate ends
	phase    gatePhase
	ended    bool // the consumer closed for good: takers return ErrConsumerClosed

	owner     pulsar.Consumer // handed messages carry it as their Consumer
	zeroQueue bool
	inner     pulsar.Consumer // the client consumer of the session in use, nil while unsubscribed
	plug      plug            // its MessageChannel
	// takers counts goroutines that may take from src or hold a message in hand; closing
	// waits for it to drop to zero.
	takers int
	held   heldQueue
	fetch  *zeroQueueFetch  // the zero-queue Receive in flight, at most one
	handed redeliveryFilter // messages held while closed, to drop their redelivered copies
	// skips is the filter of the last seek into a batch entry (skip.go); read lock-free by
	// every take, replaced whole under mu.
	skips atomic.Pointer[skipSet]
	// chunked: the consumer receives chunked messages (chunks.go); lock-free.
	chunked atomic.Bool

	// fast is the take without mu (takeFast); see syncFast. slowOnly turns it off, for the
	// benchmarks that measure what it saves.
	fast     fastTake
	slowOnly bool

	receivedWhilePaused int64
	metrics             consumerMetrics
}

func newGate(owner pulsar.Consumer, zeroQueue, chunked bool, metrics consumerMetrics) *gate {
	g := &gate{owner: owner, zeroQueue: zeroQueue, changed: make(chan struct{}), metrics: metrics}
	g.takersGo = sync.NewCond(&g.mu)
	g.chunked.Store(chunked)
	return g
}

// open unplugs src and lets messages reach the application. It does nothing on a gate that is
// open, ended or has no session in use, and reports whether the gate is open.
func (g *gate) open() bool {
	g.mu.Lock()
	defer g.unlock()
	if g.phase != gateOpen && !g.ended && g.inner != nil {
		g.unplugLocked()
		g.phase = gateOpen
		g.syncFast()
		g.signal()
	}
	return g.phase == gateOpen
}

// close closes the gate and returns only when nothing can be handed over or pushed by the
// client any more: every taker delivered before this call or put its message back, and src is
// plugged.
func (g *gate) close() {
	g.mu.Lock()
	defer g.unlock()
	g.closeLocked()
}

func (g *gate) closeLocked() {
	if g.phase == gateOpen {
		g.phase = gateClosing
		g.syncFast()
		g.signal()
		for g.takers > 0 || g.fast.busy() {
			g.check() // Wait releases mu
			g.takersGo.Wait()
		}
		g.phase = gateClosed
	}
	g.plugLocked()
}

// end closes the gate for good: takers return ErrConsumerClosed from now on.
func (g *gate) end() {
	g.mu.Lock()
	defer g.unlock()
	g.closeLocked()
	g.ended = true
	g.signal()
}

// isOpen reports whether the gate is open.
func (g *gate) isOpen() bool {
	g.mu.Lock()
	defer g.unlock()
	return g.phase == gateOpen
}

// newSource makes the MessageChannel for a new subscribe: plugged when the gate is not open,
// so that a consumer subscribing while gated cannot return a single permit (plug.go).
func (g *gate) newSource() (src chan pulsar.ConsumerMessage, plugged bool) {
	g.mu.Lock()
	defer g.unlock()
	plugged = g.phase != gateOpen
	return newSource(g.zeroQueue, plugged), plugged
}

// use makes inner, subscribed with src (from newSource), the client consumer the gate takes
// from. use(nil, nil, false) ends the session in use: what the gate holds is dropped,
// unacknowledged (closing the client consumer returns it to the broker), and so is the
// redelivery filter. It returns how many held messages it dropped.
func (g *gate) use(inner pulsar.Consumer, src chan pulsar.ConsumerMessage, plugged bool) int {
	g.mu.Lock()
	defer g.unlock()
	dropped := 0
	if inner == nil {
		dropped = g.dropHeld(time.Time{}, nil)
		g.handed.forget()
	}
	g.inner = inner
	g.plug.use(src, plugged)
	g.syncFast()
	g.metrics.held.Set(float64(g.heldCount()))
	return dropped
}

// unplug takes back what the plugged src holds (a client-side seek empties src itself).
func (g *gate) unplug() {
	g.mu.Lock()
	defer g.unlock()
	g.unplugLocked()
}

// cursorMoved drops the held messages the gate took at or before `before` (all when zero) of
// these partitions (nil: all), unacknowledged - the cursor moved past them - forgets the
// redelivery filter (copies from the broker are no longer duplicates) and publishes the seek
// filter next gives from the current one. It returns how many messages it knows it dropped.
func (g *gate) cursorMoved(before time.Time, partitions partitionSet, next func(skipSet) skipSet) int {
	g.mu.Lock()
	defer g.unlock()
	dropped := g.dropHeld(before, partitions)
	g.handed.forget()
	g.setSkips(next(g.currentSkips()))
	g.syncFast()
	return dropped
}

// filterSeekTargets adds the filters of a seek another consumer ran to the current ones (a
// partition's current filter stays unless replaced) and drops the held messages they skip.
func (g *gate) filterSeekTargets(filters skipSet) {
	g.mu.Lock()
	defer g.unlock()
	for p, f := range g.currentSkips() {
		if _, ok := filters[p]; !ok {
			filters[p] = f
		}
	}
	g.setSkips(filters)
	g.held.dropIf(func(h heldMessage) bool { return g.skipBeforeTarget(h.cm) })
	g.metrics.held.Set(float64(g.heldCount()))
	g.syncFast()
}

// forgetCopy ends the redelivery filter's entry of id unless the gate holds a copy of it: the
// application nacked it and wants the broker's copy.
func (g *gate) forgetCopy(id pulsar.MessageID) {
	g.mu.Lock()
	defer g.unlock()
	if !g.held.has(id) {
		g.handed.forgetID(id)
	}
	g.syncFast()
}

// counts returns how many messages the gate holds and how many it took while closed.
func (g *gate) counts() (held int, receivedWhilePaused int64) {
	g.mu.Lock()
	defer g.unlock()
	return g.heldCount(), g.receivedWhilePaused
}

// receivesChunks reports whether a chunked message reached the gate, or the options said so.
func (g *gate) receivesChunks() bool { return g.chunked.Load() }

// disableFastTake turns the lock-free take off, for the benchmarks that measure what it saves.
func (g *gate) disableFastTake() {
	g.mu.Lock()
	defer g.unlock()
	g.slowOnly = true
	g.syncFast()
}

// waitChanged returns whether the gate ended, and otherwise the channel that signals its next
// change (Receive while Chan's pump owns the take).
func (g *gate) waitChanged() (ended bool, changed <-chan struct{}) {
	g.mu.Lock()
	defer g.unlock()
	return g.ended, g.changed
}

// stopFetch cancels the zero-queue fetch in flight before the client consumer closes, seeks or
// unsubscribes (the client's zero-queue Receive holds a lock those calls need), and waits for
// it to end.
func (g *gate) stopFetch() {
	g.mu.Lock()
	f := g.fetch
	g.unlock()
	if f != nil {
		f.cancel()
		<-f.done
	}
}

// take blocks until a message may reach the application and returns it. With a hand (the Chan
// pump), take hands the message over itself and returns once it is taken; the taker counts as
// one until then, so that close never returns with a message in anyone's hand.
func (g *gate) take(ctx context.Context, give hand) (pulsar.ConsumerMessage, error) {
	for {
		if cm, ok, err := g.takeFast(ctx, give); ok || err != nil {
			return cm, err
		}
		changed, err := g.lockOpen(ctx)
		if err != nil {
			return pulsar.ConsumerMessage{}, err
		}
		if cm, ok := g.popHeld(); ok {
			if give == nil {
				g.unlock()
				return cm, nil
			}
			g.takers++
			g.unlock()
			if g.handOverInHand(cm, changed, give) {
				return cm, nil
			}
			continue
		}
		if g.fast.isOn() {
			g.unlock()
			continue
		}
		src := g.plug.source()
		g.takers++
		g.unlock()
		select {
		case cm := <-src:
			if g.handOver(cm, give != nil) {
				cm.Consumer = g.owner
				if give == nil || g.handOverInHand(cm, changed, give) {
					return cm, nil
				}
			}
		case <-changed:
			g.leave()
		case <-ctx.Done():
			g.leave()
			return pulsar.ConsumerMessage{}, ctx.Err()
		}
	}
}

// A hand gives a message to the application for a taker that still counts as one. It returns
// false when changed fires first: the gate may be closing, and the message goes back to held.
type hand func(cm pulsar.ConsumerMessage, changed <-chan struct{}) bool

// zeroQueueFetch is the one client Receive of a zero-queue consumer in flight. Each such
// Receive grants the broker one permit (FLOW 1), and the client's channel is unbuffered: a
// granted permit must always have a taker, or the message blocks the client's connection. So a
// fetch is never cancelled by the gate: its message, if it comes while the gate is closed, is
// held. Only closing the client consumer cancels it (stopFetch). At most one permit is ever
// outstanding, however often the consumer pauses and resumes.
type zeroQueueFetch struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error // written before done closes
}

// takeZeroQueue serves Receive for a zero-queue consumer: a fetch starts only on application
// demand while the gate is open, so a paused consumer grants no new permit.
func (g *gate) takeZeroQueue(ctx context.Context) (pulsar.Message, error) {
	for {
		changed, err := g.lockOpen(ctx)
		if err != nil {
			return nil, err
		}
		if cm, ok := g.popHeld(); ok {
			g.unlock()
			return cm.Message, nil
		}
		f := g.fetch
		if f == nil {
			f = g.startFetch()
		}
		g.unlock()
		select {
		case <-f.done:
			if f.err != nil && !errors.Is(f.err, context.Canceled) {
				return nil, f.err
			}
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err() // the fetch goes on; its message will be held
		}
	}
}

// The gate's own helpers below run with mu held.

func (g *gate) startFetch() *zeroQueueFetch {
	ctx, cancel := context.WithCancel(context.Background())
	f := &zeroQueueFetch{cancel: cancel, done: make(chan struct{})}
	g.fetch = f
	inner := g.inner
	go func() {
		msg, err := inner.Receive(ctx)
		cancel()
		g.mu.Lock()
		defer g.unlock()
		if err == nil && !g.ended && g.inner == inner {
			cm := pulsar.ConsumerMessage{Consumer: g.owner, Message: msg}
			if !g.dropOnArrival(cm) {
				if g.phase != gateOpen {
					g.countReceivedWhilePaused()
				}
				g.hold(cm, false)
			}
		}
		if g.fetch == f {
			g.fetch = nil
		}
		f.err = err
		close(f.done)
	}()
	return f
}

// lockOpen waits until the gate is open and returns with mu held, along with the channel that
// signals the next gate change. On error (consumer closed, ctx ended) mu is not held.
func (g *gate) lockOpen(ctx context.Context) (<-chan struct{}, error) {
	for {
		g.mu.Lock()
		if g.ended {
			g.unlock()
			return nil, ErrConsumerClosed
		}
		changed := g.changed
		if g.phase == gateOpen {
			return changed, nil
		}
		g.unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// handOverInHand gives cm through give while the caller counts as a taker, and then leaves. When
// the gate closes first, cm goes back to the front of held before the taker leaves.
func (g *gate) handOverInHand(cm pulsar.ConsumerMessage, changed <-chan struct{}, give hand) bool {
	for !give(cm, changed) {
		g.mu.Lock()
		if g.phase != gateOpen {
			g.hold(cm, true) // given again, first, once the gate is open
			g.leaveLocked()
			g.unlock()
			return false
		}
		changed = g.changed
		g.unlock()
	}
	g.leave()
	return true
}

// takeFast is the take without mu, for the common case: the gate open, nothing held, no
// redelivery filter to apply (it applies the seek filter itself); see fastTake. With a hand, it
// gives the message before it leaves. ok is false when the slow path must decide.
func (g *gate) takeFast(ctx context.Context, give hand) (cm pulsar.ConsumerMessage, ok bool, err error) {
	if !g.fast.enter() {
		return cm, false, nil
	}
	defer g.leaveFast()
	src, closing, on := g.fast.channels()
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
		g.noteChunked(cm)
		taken = !g.skipBeforeTarget(cm) // a skipped message is acked and gone: take again
	}
	given := cm
	given.Consumer = g.owner
	if g.fast.isOn() && (give == nil || give(given, closing)) {
		return given, true, nil
	}
	g.mu.Lock()
	g.hold(cm, true) // the gate is closing: back to the front of held
	g.unlock()
	return pulsar.ConsumerMessage{}, false, nil
}

func (g *gate) leaveFast() {
	if g.fast.leave() {
		g.mu.Lock()
		g.takersGo.Broadcast()
		g.unlock()
	}
}

// syncFast allows the fast take exactly when it is safe: the gate open, nothing held, no
// redelivery filter (the seek filter is the fast take's own). While the gate is open this can
// only become true (held and the filter only shrink); it becomes false in close, which then
// waits for fast takers.
func (g *gate) syncFast() {
	src := g.plug.source()
	g.fast.set(!g.slowOnly && g.phase == gateOpen && !g.zeroQueue && src != nil && g.held.len() == 0 &&
		g.handed.empty(), src)
}

// handOver ends a take from src: true when the message may go to the application, false when
// a seek skips it or it is a redelivered copy, or when the gate closed meanwhile (then it goes
// back to the front of held: it is older than anything src still has). The taker leaves, unless
// it keeps the message in hand to give it (true).
func (g *gate) handOver(cm pulsar.ConsumerMessage, keep bool) bool {
	g.mu.Lock()
	defer g.unlock()
	ok := g.mayHandOver(cm)
	if !ok || !keep {
		g.leaveLocked()
	}
	return ok
}

func (g *gate) mayHandOver(cm pulsar.ConsumerMessage) bool {
	g.noteChunked(cm)
	if g.dropOnArrival(cm) {
		return false
	}
	if g.phase == gateOpen {
		return true
	}
	g.countReceivedWhilePaused()
	g.hold(cm, true)
	return false
}

// dropOnArrival reports whether a message just taken from the client never reaches the
// application: it lies before a seek target inside the target's batch entry (acked), or it
// is the broker's second copy of a message the gate held and already handed over.
func (g *gate) dropOnArrival(cm pulsar.ConsumerMessage) bool {
	if g.skipBeforeTarget(cm) {
		return true
	}
	if g.handed.empty() {
		return false
	}
	dup := g.handed.seenAgain(cm.Message.ID())
	if dup {
		g.metrics.duplicatesDropped.Inc()
	}
	g.syncFast()
	return dup
}

// heldCopy reports whether cm is a copy the broker sent again of a message the gate held.
// Unlike a take, it ends no entry: a message still in src may have been pushed before the
// reconnect, so it says nothing about the order in which the broker sends.
func (g *gate) heldCopy(cm pulsar.ConsumerMessage) bool {
	if !g.handed.copyOf(cm.Message.ID()) {
		return false
	}
	g.metrics.duplicatesDropped.Inc()
	return true
}

// countReceivedWhilePaused counts a message the gate took from the client while closing or
// closed.
func (g *gate) countReceivedWhilePaused() {
	g.receivedWhilePaused++
	g.metrics.receivedWhilePaused.Inc()
}

func (g *gate) leave() {
	g.mu.Lock()
	g.leaveLocked()
	g.unlock()
}

func (g *gate) leaveLocked() {
	g.takers--
	if g.takers == 0 {
		g.takersGo.Broadcast()
	}
}

// plugLocked plugs src, so that the client can push no more into it.
func (g *gate) plugLocked() {
	g.plug.fill()
	g.metrics.held.Set(float64(g.heldCount()))
}

// unplugLocked takes back what the plugged src holds: the messages the client pushed before
// the plug are held in order (new pushes land behind them), the placeholders are dropped, and
// so are the broker's copies of messages the gate holds (a reconnect while paused sent them).
func (g *gate) unplugLocked() {
	g.plug.drain(func(cm pulsar.ConsumerMessage) {
		if !g.skipBeforeTarget(cm) && !g.heldCopy(cm) {
			g.hold(cm, false)
		}
	})
	g.metrics.held.Set(float64(g.heldCount()))
}

// heldCount counts the messages taken from the client that wait for the gate to open.
func (g *gate) heldCount() int { return g.held.len() + g.plug.held() }

// hold keeps a message for delivery after the gate opens; front puts it first (a message a
// taker had in hand is older than any the gate's queue still has).
func (g *gate) hold(cm pulsar.ConsumerMessage, front bool) {
	if g.phase != gateOpen {
		// Held across a pause: if the consumer reconnects meanwhile, the broker sends it again.
		g.handed.remember(cm.Message.ID())
	}
	g.noteChunked(cm)
	g.held.push(cm, front)
	g.metrics.held.Set(float64(g.heldCount()))
}

// popHeld takes the oldest held message.
func (g *gate) popHeld() (pulsar.ConsumerMessage, bool) {
	cm, ok := g.held.pop()
	if !ok {
		return cm, false
	}
	g.metrics.held.Set(float64(g.heldCount()))
	g.syncFast()
	cm.Consumer = g.owner
	return cm, true
}

// dropHeld drops held messages taken at or before `before` (all when zero), without
// acknowledging them: a seek made them stale. It returns how many it knows it dropped (the
// plugged src's messages of some partitions only are counted when drained).
func (g *gate) dropHeld(before time.Time, partitions partitionSet) int {
	dropped := g.held.dropIf(func(h heldMessage) bool {
		return (before.IsZero() || !h.at.After(before)) && partitions.has(h.cm.Message.ID().PartitionIdx())
	})
	dropped += g.plug.discardBefore(before, partitions)
	g.metrics.held.Set(float64(g.heldCount()))
	return dropped
}

// signal wakes every goroutine waiting on the gate so that it re-checks.
func (g *gate) signal() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// unlock releases mu, after checking the invariants when a test asked for it.
func (g *gate) unlock() {
	g.check()
	g.mu.Unlock()
}

// checkGate, set only by the package's tests (invariants_test.go), verifies the gate's
// invariants each time mu is released, that is after every change.
var checkGate func(g *gate)

func (g *gate) check() {
	if checkGate != nil {
		checkGate(g)
	}
}

// invariants returns the invariants the gate breaks; mu is held. They hold whenever mu is
// released.
func (g *gate) invariants() []string {
	var broken []string
	check := func(holds bool, invariant string) {
		if !holds {
			broken = append(broken, invariant)
		}
	}
	open, plugged, src := g.phase == gateOpen, g.plug.isPlugged(), g.plug.source()
	check(g.phase == gateClosed || open || g.phase == gateClosing, "the phase is closed, open or closing")
	// A consumer closed for good hands nothing over; end closes the gate first.
	check(!g.ended || !open, "ended => gate not open")
	// The gate opens only on a session in use, and Stop closes it before the session ends.
	check(!open || g.inner != nil, "gate open => subscribed")
	// src is the MessageChannel the session in use was subscribed with.
	check((g.inner == nil) == (src == nil), "subscribed <=> src")
	// close returns only once every taker delivered or put back; new ones join an open gate only.
	check(g.phase != gateClosed || g.takers == 0, "gate closed => no taker has a message in hand")
	check(g.takers >= 0, "takers >= 0")
	// A plugged src is what keeps the client from pushing (returning permits) while gated.
	check(!plugged || !open, "plugged => gate not open")
	// Nobody takes from a plugged src but unplugLocked, and the client cannot push into a full one.
	check(!plugged || (src != nil && len(src) == cap(src)), "plugged => src full")
	// A zero-queue src is unbuffered: the client's own Receive reads it, so it is never plugged.
	check(!plugged || !g.zeroQueue, "plugged => not zero-queue")
	// The plug's bookkeeping describes the plugged src only.
	check(plugged || (g.plug.real == 0 && !g.plug.discard && g.plug.discardOf == nil), "unplugged => no plug bookkeeping")
	check(g.plug.real >= 0 && (src == nil || g.plug.real <= cap(src)), "0 <= plugged messages <= cap(src)")
	// The fast take skips every check of the slow path, so it is on exactly when none applies.
	check(g.fast.isOn() == (!g.slowOnly && open && !g.zeroQueue && src != nil && g.held.len() == 0 && g.handed.empty()),
		"fast <=> open, not zero-queue, subscribed, nothing held, no redelivery filter")
	// Fast takers read the fast take's src without mu: it must be the current src.
	check(!g.fast.isOn() || g.fast.src == src, "fast => its src is src")
	// A zero-queue fetch runs on the client consumer; ending the session waits for it to end.
	check(g.fetch == nil || (g.zeroQueue && g.inner != nil), "fetch in flight => zero-queue, subscribed")
	return broken
}

// String describes the gate for a broken invariant's report; mu is held.
func (g *gate) String() string {
	src := g.plug.source()
	return fmt.Sprintf("phase=%s ended=%v subscribed=%v src=%d/%d plugged=%v pluggedReal=%d discard=%v "+
		"takers=%d fast=%v fastTakers=%d held=%d handed=%d fetch=%v zeroQueue=%v",
		g.phase, g.ended, g.inner != nil, len(src), cap(src), g.plug.isPlugged(), g.plug.real, g.plug.discard,
		g.takers, g.fast.isOn(), g.fast.takers.Load(), g.held.len(), len(g.handed.ids), g.fetch != nil, g.zeroQueue)
}
