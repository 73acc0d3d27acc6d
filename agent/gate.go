package agent

import (
	"context"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// Receive returns the next message. While the consumer is Paused or Stopped it blocks until
// the gate opens, ctx ends or the consumer is closed. Messages held by the gate come first.
func (c *Consumer) Receive(ctx context.Context) (pulsar.Message, error) {
	if c.zeroQueue {
		return c.receiveZeroQueue(ctx)
	}
	c.mu.Lock()
	pumping := c.pumping
	c.mu.Unlock()
	if pumping {
		return c.receiveFromPump(ctx)
	}
	cm, err := c.next(ctx)
	if err != nil {
		return nil, err
	}
	return cm.Message, nil
}

// Chan returns a channel that yields messages only while the gate is open. Like the client's
// zero-queue consumer, a zero-queue Consumer panics here: it can only fetch on Receive.
func (c *Consumer) Chan() <-chan pulsar.ConsumerMessage {
	if c.zeroQueue {
		panic("agent: a zero-queue consumer cannot support Chan; use Receive")
	}
	c.pumpOnce.Do(func() {
		c.mu.Lock()
		c.pumping = true
		c.mu.Unlock()
		go c.pump()
	})
	return c.out
}

// receiveFromPump serves Receive once Chan() is in use: the pump owns the take, so Receive
// reads what it hands over.
func (c *Consumer) receiveFromPump(ctx context.Context) (pulsar.Message, error) {
	for {
		c.mu.Lock()
		closed, changed := c.closed, c.changed
		c.mu.Unlock()
		if closed {
			return nil, ErrConsumerClosed
		}
		select {
		case cm := <-c.out:
			return cm.Message, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-changed:
		}
	}
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
		if c.open {
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
		src := c.src
		c.takers++
		c.mu.Unlock()
		select {
		case cm := <-src:
			if c.admit(cm) {
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

// admit decides the fate of a message just taken from the client: handed over when the gate
// is still open, held when it closed meanwhile, acked and dropped when a seek skips it.
func (c *Consumer) admit(cm pulsar.ConsumerMessage) bool {
	c.mu.Lock()
	c.takers--
	if c.takers == 0 {
		c.takersGo.Broadcast()
	}
	if c.skipLocked(cm.Message.ID()) {
		inner := c.inner
		c.mu.Unlock()
		if inner != nil {
			_ = inner.AckID(cm.Message.ID())
		}
		return false
	}
	if !c.open {
		c.receivedWhilePaused++
		c.metrics.receivedWhilePaused.Inc()
		c.holdLocked(cm, false)
		c.mu.Unlock()
		return false
	}
	c.mu.Unlock()
	return true
}

func (c *Consumer) leave() {
	c.mu.Lock()
	c.takers--
	if c.takers == 0 {
		c.takersGo.Broadcast()
	}
	c.mu.Unlock()
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
		if !c.open {
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
			c.holdLocked(cm, true)
			c.takers--
			if c.takers == 0 {
				c.takersGo.Broadcast()
			}
			c.mu.Unlock()
		}
	}
}

// receiveZeroQueue calls the underlying Receive only on application demand while the gate is
// open: each call grants the broker one permit, so a paused zero-queue consumer grants none.
func (c *Consumer) receiveZeroQueue(ctx context.Context) (pulsar.Message, error) {
	select {
	case c.zeroQueueTurn <- struct{}{}:
		defer func() { <-c.zeroQueueTurn }()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	for {
		if _, err := c.lockOpen(ctx); err != nil {
			return nil, err
		}
		if cm, ok := c.popHeldLocked(); ok {
			c.mu.Unlock()
			return cm.Message, nil
		}
		inner := c.inner
		callCtx, cancel := context.WithCancel(ctx)
		c.zqCancel = cancel
		c.takers++
		c.mu.Unlock()

		msg, err := inner.Receive(callCtx)
		cancel()
		c.mu.Lock()
		c.zqCancel = nil
		c.mu.Unlock()
		if err == nil {
			if c.admit(pulsar.ConsumerMessage{Consumer: c, Message: msg}) {
				return msg, nil
			}
			continue
		}
		c.leave()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// Otherwise the gate closed under the call (pause, stop, seek): wait again.
	}
}

// holdLocked keeps a message for delivery after the gate opens; front puts it first (a
// message the pump had in hand is older than any the gate took after it).
func (c *Consumer) holdLocked(cm pulsar.ConsumerMessage, front bool) {
	h := heldMessage{cm: cm, at: time.Now()}
	if front {
		c.held = append([]heldMessage{h}, c.held...)
	} else {
		c.held = append(c.held, h)
	}
	c.metrics.held.Set(float64(len(c.held)))
}

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

// openGateLocked lets messages reach the application.
func (c *Consumer) openGateLocked() {
	if c.open || c.closed {
		return
	}
	c.open = true
	c.signalLocked()
}

// closeGateLocked closes the gate and returns only when no goroutine can hand a message over:
// every taker has either delivered before this call or put its message on hold.
func (c *Consumer) closeGateLocked() {
	c.open = false
	c.signalLocked()
	if c.zqCancel != nil {
		c.zqCancel()
	}
	for c.takers > 0 {
		c.takersGo.Wait()
	}
}
