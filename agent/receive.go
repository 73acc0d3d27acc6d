package agent

import (
	"context"

	"github.com/apache/pulsar-client-go/pulsar"
)

// Receive returns the next message. While the consumer is Paused or Stopped it blocks until
// the gate opens, ctx ends or the consumer is closed. Messages held by the gate come first.
func (c *Consumer) Receive(ctx context.Context) (pulsar.Message, error) {
	if c.zeroQueue {
		return c.gate.takeZeroQueue(ctx)
	}
	if c.pumping.Load() {
		return c.receiveFromPump(ctx)
	}
	cm, err := c.gate.take(ctx, nil)
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
		c.pumping.Store(true)
		go c.pump()
	})
	return c.out
}

// receiveFromPump serves Receive once Chan() is in use: the pump owns the take, so Receive
// reads what it hands over.
func (c *Consumer) receiveFromPump(ctx context.Context) (pulsar.Message, error) {
	for {
		ended, changed := c.gate.waitChanged()
		if ended {
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

// pump feeds Chan(): it takes a message when the gate is open and offers it to the
// application until taken or the gate closes, in which case the gate holds it again.
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
		if _, err := c.gate.take(context.Background(), offer); err != nil {
			return
		}
	}
}
