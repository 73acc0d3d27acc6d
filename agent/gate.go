package agent

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// The gate decides whether a message taken from the client may reach the application.
//
// pulsar-client-go returns a flow permit to the broker each time its dispatcher pushes a
// message into the consumer's MessageChannel (src, unbuffered, owned by the gate). So whoever
// takes from src decides whether permits flow. The gate's phases, and who may take:
//
//	gateOpen     the feeder takes from src into ready (the gate's own queue, readyCapacity
//	             messages, so the client is never kept waiting on a slow handoff); takers
//	             (Receive, the Chan pump) take from held first, then from ready, and hand over.
//	gateClosing  closeGateLocked runs: the feeder is told to stop and takers to put back what
//	             they have in hand; closeGateLocked waits for both.
//	gateClosed   nobody takes from src or ready. What ready held, the feeder's last message and
//	             whatever takers had in hand are in held, in order, and are delivered first once
//	             the gate opens again. One exception: a zero-queue fetch already granted its
//	             single permit before the gate closed; its message is held when it comes.
//
// Invariant: once closeGateLocked returns, no message is handed to the application, and
// nothing more is taken from src (hence no new permit) until openGateLocked.
//
// openGateLocked and closeGateLocked are the only code that changes the phase; both run with
// Consumer.mu held.
type gatePhase int

const (
	gateClosed gatePhase = iota
	gateOpen
	gateClosing
)

// readyCapacity bounds the gate's own queue. With the feeder's message in hand it equals the
// client's default MessageChannel capacity (10), so the agent buffers no more than the raw
// client does.
const readyCapacity = 9

// gate is the state the message path reads; guarded by Consumer.mu unless noted.
type gate struct {
	inner   pulsar.Consumer
	src     chan pulsar.ConsumerMessage // the client's MessageChannel, unbuffered
	phase   gatePhase
	changed chan struct{} // closed and replaced whenever the phase changes
	// ready is filled by the feeder while open; takers read it without the lock.
	ready  chan pulsar.ConsumerMessage
	feeder *feeder // running while open (not for zero-queue consumers)
	// takers counts goroutines that may take from held or ready, or hold a message in hand;
	// closing waits for it to drop to zero.
	takers int
	held   []heldMessage
	fetch  *zeroQueueFetch // the zero-queue Receive in flight, at most one
	skips  map[int32]skipFilter

	closed bool // Close or Unsubscribe ended the consumer for good

	state               protocol.State
	since               time.Time
	receivedWhilePaused int64

	nacks  []deferredNack   // nacks made while closed, issued when the gate opens
	handed redeliveryFilter // messages held while closed, to drop their redelivered copies
	// arrivalChecks is len(skips) > 0 || !handed.empty(): when false the feeder skips the lock.
	arrivalChecks atomic.Bool
}

// heldMessage is a message taken from the client while the gate closed.
type heldMessage struct {
	cm pulsar.ConsumerMessage
	at time.Time
}

// skipFilter drops the messages before a seek target inside its batch entry.
type skipFilter struct {
	ledger, entry int64
	batch         int32 // messages with a lower batch index are acked and skipped
}

// feeder moves messages from the client's channel to the gate's queue while the gate is open.
type feeder struct {
	stop chan struct{} // closed by closeGateLocked
	done chan struct{} // closed when the feeder takes nothing more
	// last is the message the feeder had taken when told to stop; written before done closes.
	last *pulsar.ConsumerMessage
}

// openGateLocked lets messages reach the application and starts the feeder.
func (c *Consumer) openGateLocked() {
	if c.phase == gateOpen || c.closed || c.inner == nil {
		return
	}
	c.phase = gateOpen
	if !c.zeroQueue {
		f := &feeder{stop: make(chan struct{}), done: make(chan struct{})}
		c.feeder = f
		go c.feed(f, c.src, c.inner)
	}
	c.signalLocked()
}

// closeGateLocked closes the gate and returns only when nothing can be handed over or taken
// from the client any more: the feeder stopped, every taker delivered before this call or put
// its message back, and the gate's queue moved to held.
func (c *Consumer) closeGateLocked() {
	if c.phase != gateOpen {
		return
	}
	c.phase = gateClosing
	c.signalLocked()
	f := c.feeder
	if f != nil {
		close(f.stop)
		c.mu.Unlock() // the feeder may need c.mu to finish its message
		<-f.done
		c.mu.Lock()
		c.feeder = nil
	}
	for c.takers > 0 {
		c.takersGo.Wait()
	}
	for {
		select {
		case cm := <-c.ready:
			c.holdLocked(cm, false)
			continue
		default:
		}
		break
	}
	if f != nil && f.last != nil {
		c.holdLocked(*f.last, false) // the newest message: after what the queue held
	}
	c.phase = gateClosed
}

// feed runs while the gate is open: it takes from the client's channel into the gate's queue
// and stops taking as soon as it is told to.
func (c *Consumer) feed(f *feeder, src <-chan pulsar.ConsumerMessage, inner pulsar.Consumer) {
	defer close(f.done)
	for {
		select {
		case <-f.stop:
			return
		default:
		}
		var cm pulsar.ConsumerMessage
		select {
		case <-f.stop:
			return
		case m, ok := <-src:
			if !ok {
				return
			}
			cm = m
		}
		if c.dropOnArrival(cm, inner) {
			continue
		}
		select {
		case c.ready <- cm:
		case <-f.stop:
			f.last = &cm
			return
		}
	}
}

// dropOnArrival reports whether a message just taken from the client never reaches the
// application: it lies before a seek target inside the target's batch entry (acked), or it
// is the broker's second copy of a message the gate held and already handed over.
func (c *Consumer) dropOnArrival(cm pulsar.ConsumerMessage, inner pulsar.Consumer) bool {
	if !c.arrivalChecks.Load() {
		return false
	}
	id := cm.Message.ID()
	c.mu.Lock()
	skip := c.skipLocked(id)
	dup := !skip && c.handed.seenAgain(id)
	c.syncArrivalChecksLocked()
	c.mu.Unlock()
	if skip {
		_ = inner.AckID(id)
	}
	if dup {
		c.metrics.duplicatesDropped.Inc()
	}
	return skip || dup
}

// lockOpen waits until the gate is open and returns with c.mu held, along with the channel
// that signals the next gate change. On error (consumer closed, ctx ended) c.mu is not held.
func (c *Consumer) lockOpen(ctx context.Context) (<-chan struct{}, error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, ErrConsumerClosed
		}
		changed := c.changed
		if c.phase == gateOpen {
			return changed, nil
		}
		c.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// next blocks until a message may reach the application and returns it.
func (c *Consumer) next(ctx context.Context) (pulsar.ConsumerMessage, error) {
	for {
		changed, err := c.lockOpen(ctx)
		if err != nil {
			return pulsar.ConsumerMessage{}, err
		}
		if cm, ok := c.popHeldLocked(); ok {
			c.mu.Unlock()
			return cm, nil
		}
		c.takers++
		c.mu.Unlock()
		select {
		case cm := <-c.ready:
			if c.handOver(cm) {
				cm.Consumer = c
				return cm, nil
			}
		case <-changed:
			c.leave()
		case <-ctx.Done():
			c.leave()
			return pulsar.ConsumerMessage{}, ctx.Err()
		}
	}
}

// handOver ends a take: true when the gate is still open, otherwise the message goes back to
// the front of held (it is older than anything the gate's queue still has).
func (c *Consumer) handOver(cm pulsar.ConsumerMessage) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leaveLocked()
	if c.phase == gateOpen {
		return true
	}
	c.holdLocked(cm, true)
	return false
}

func (c *Consumer) leave() {
	c.mu.Lock()
	c.leaveLocked()
	c.mu.Unlock()
}

func (c *Consumer) leaveLocked() {
	c.takers--
	if c.takers == 0 {
		c.takersGo.Broadcast()
	}
}

// pump feeds Chan(): it takes a message when the gate is open and offers it to the
// application until the gate changes, in which case it holds the message again.
func (c *Consumer) pump() {
	for {
		cm, err := c.next(context.Background())
		if err != nil {
			return
		}
		c.mu.Lock()
		if c.phase != gateOpen {
			c.holdLocked(cm, true)
			c.mu.Unlock()
			continue
		}
		changed := c.changed
		c.takers++
		c.mu.Unlock()
		select {
		case c.out <- cm:
			c.leave()
		case <-changed:
			c.mu.Lock()
			c.leaveLocked()
			c.holdLocked(cm, true) // offered again, first, once the gate is open
			c.mu.Unlock()
		}
	}
}

// holdLocked keeps a message for delivery after the gate opens; front puts it first (a
// message a taker had in hand is older than any the gate's queue still has).
func (c *Consumer) holdLocked(cm pulsar.ConsumerMessage, front bool) {
	if c.phase != gateOpen {
		c.receivedWhilePaused++
		c.metrics.receivedWhilePaused.Inc()
		c.handed.remember(cm.Message.ID())
		c.syncArrivalChecksLocked()
	}
	h := heldMessage{cm: cm, at: time.Now()}
	if front {
		c.held = append([]heldMessage{h}, c.held...)
	} else {
		c.held = append(c.held, h)
	}
	c.metrics.held.Set(float64(len(c.held)))
}

// popHeldLocked takes the oldest held message.
func (c *Consumer) popHeldLocked() (pulsar.ConsumerMessage, bool) {
	if len(c.held) == 0 {
		return pulsar.ConsumerMessage{}, false
	}
	cm := c.held[0].cm
	c.held[0] = heldMessage{}
	c.held = c.held[1:]
	c.metrics.held.Set(float64(len(c.held)))
	cm.Consumer = c
	return cm, true
}

// dropHeldLocked drops held messages taken at or before `before` (all when zero), without
// acknowledging them: a seek made them stale. It returns how many were dropped.
func (c *Consumer) dropHeldLocked(before time.Time) int {
	kept := c.held[:0]
	dropped := 0
	for _, h := range c.held {
		if before.IsZero() || !h.at.After(before) {
			dropped++
			continue
		}
		kept = append(kept, h)
	}
	clear(c.held[len(kept):])
	c.held = kept
	c.metrics.held.Set(float64(len(c.held)))
	return dropped
}

// DropHeld drops the messages the gate holds that it took at or before `before` (all when
// before is zero) and returns how many. An agent that did not execute a seek calls it so that
// messages from before the seek never reach the application; they are not acknowledged.
func (c *Consumer) DropHeld(before time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.dropHeldLocked(before)
	c.handed.forget() // the cursor moved: copies from the broker are no longer duplicates
	c.syncArrivalChecksLocked()
	if n > 0 {
		c.log.Info("Held messages dropped", "dropped", n)
	}
	return n
}

// skipLocked reports whether id lies before a seek target inside the target's batch entry.
func (c *Consumer) skipLocked(id pulsar.MessageID) bool {
	if len(c.skips) == 0 {
		return false
	}
	f, ok := c.skips[id.PartitionIdx()]
	if !ok {
		return false
	}
	if id.LedgerID() == f.ledger && id.EntryID() == f.entry && id.BatchIdx() < f.batch {
		return true
	}
	// The target was reached: later messages of the partition pass.
	delete(c.skips, id.PartitionIdx())
	return false
}

// signalLocked wakes every goroutine waiting on the gate so that it re-checks.
func (c *Consumer) signalLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// syncArrivalChecksLocked tells the feeder whether arriving messages need a look.
func (c *Consumer) syncArrivalChecksLocked() {
	c.arrivalChecks.Store(len(c.skips) > 0 || !c.handed.empty())
}
