package agent

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/apache/pulsar-client-go/pulsar"
)

// Receive returns the next message. While the consumer is Paused or Stopped it blocks until
// the gate opens, ctx ends or the consumer is closed. Messages held by the gate come first.
func (c *Consumer) Receive(ctx context.Context) (pulsar.Message, error) {
	if c.zeroQueue {
		return c.gate.takeZeroQueue(ctx)
	}
	if c.pump.started() {
		return c.pump.receive(ctx)
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
	return c.pump.channel()
}

// pump feeds Chan(): it takes a message when the gate is open and offers it to the
// application until taken or the gate closes, in which case the gate holds it again.
type pump struct {
	gate *gate
	once sync.Once
	out  chan pulsar.ConsumerMessage
	on   atomic.Bool // Chan() was called
}

func newPump(g *gate) *pump { return &pump{gate: g, out: make(chan pulsar.ConsumerMessage)} }

// channel starts the pump, once, and returns its channel.
func (p *pump) channel() <-chan pulsar.ConsumerMessage {
	p.once.Do(func() {
		p.on.Store(true)
		go p.run()
	})
	return p.out
}

func (p *pump) started() bool { return p.on.Load() }

func (p *pump) run() {
	offer := func(cm pulsar.ConsumerMessage, changed <-chan struct{}) bool {
		select {
		case p.out <- cm:
			return true
		case <-changed:
			return false
		}
	}
	for {
		if _, err := p.gate.take(context.Background(), offer); err != nil {
			return
		}
	}
}

// receive serves Receive once Chan() is in use: the pump owns the take, so Receive reads what
// it hands over.
func (p *pump) receive(ctx context.Context) (pulsar.Message, error) {
	for {
		ended, changed := p.gate.waitChanged()
		if ended {
			return nil, ErrConsumerClosed
		}
		select {
		case cm := <-p.out:
			return cm.Message, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-changed:
		}
	}
}
