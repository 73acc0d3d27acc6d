package agent

import (
	"context"
	"errors"

	"github.com/apache/pulsar-client-go/pulsar"
)

// zeroQueueFetch is the one underlying Receive of a zero-queue consumer in flight. Each such
// Receive grants the broker one permit (FLOW 1), and the client's channel is unbuffered: a
// granted permit must always have a taker, or the message blocks the client's connection. So a
// fetch is never cancelled by the gate: its message, if it comes while the gate is closed, is
// held. Only closing the underlying consumer cancels it. At most one permit is ever
// outstanding, however often the consumer pauses and resumes.
type zeroQueueFetch struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error // written before done closes
}

// receiveZeroQueue serves Receive for a zero-queue consumer: a fetch starts only on
// application demand while the gate is open, so a paused consumer grants no new permit.
func (c *Consumer) receiveZeroQueue(ctx context.Context) (pulsar.Message, error) {
	for {
		changed, err := c.lockOpen(ctx)
		if err != nil {
			return nil, err
		}
		if cm, ok := c.popHeldLocked(); ok {
			c.unlockGate()
			return cm.Message, nil
		}
		f := c.fetch
		if f == nil {
			f = c.startFetchLocked()
		}
		c.unlockGate()
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

func (c *Consumer) startFetchLocked() *zeroQueueFetch {
	ctx, cancel := context.WithCancel(context.Background())
	f := &zeroQueueFetch{cancel: cancel, done: make(chan struct{})}
	c.fetch = f
	inner := c.inner
	go func() {
		msg, err := inner.Receive(ctx)
		cancel()
		c.mu.Lock()
		defer c.unlockGate()
		if err == nil && !c.closed && c.inner == inner {
			cm := pulsar.ConsumerMessage{Consumer: c, Message: msg}
			if !c.dropOnArrivalLocked(cm) {
				if c.phase != gateOpen {
					c.countReceivedWhilePausedLocked()
				}
				c.holdLocked(cm, false)
			}
		}
		if c.fetch == f {
			c.fetch = nil
		}
		f.err = err
		close(f.done)
	}()
	return f
}

// stopFetchLocked cancels the fetch in flight before the underlying consumer closes, seeks
// or unsubscribes (the client's zero-queue Receive holds a lock those calls need). It returns
// a channel closed when the fetch has ended; wait on it without c.mu.
func (c *Consumer) stopFetchLocked() <-chan struct{} {
	f := c.fetch
	if f == nil {
		return nil
	}
	f.cancel()
	return f.done
}
