package agent

import (
	"github.com/apache/pulsar-client-go/pulsar"
)

// maxDeferredNacks bounds the nacks kept while paused. It equals the broker's default
// maxUnackedMessagesPerConsumer, past which the broker stops dispatching to the consumer, so
// an application cannot normally hold more unacknowledged messages to nack.
const maxDeferredNacks = 50_000

// deferredNack is one Nack or NackID the application made while the gate was closed.
type deferredNack struct {
	msg pulsar.Message // set by Nack (the client's backoff policy reads it)
	id  pulsar.MessageID
}

func (n deferredNack) messageID() pulsar.MessageID {
	if n.msg != nil {
		return n.msg.ID()
	}
	return n.id
}

func (n deferredNack) issue(inner pulsar.Consumer) {
	if n.msg != nil {
		inner.Nack(n.msg)
		return
	}
	inner.NackID(n.id)
}

// nack asks for redelivery. pulsar-client-go redelivers nacked messages and dead-letters them
// past MaxDeliveries inside its dispatcher, past the gate, and returns permits for them. So
// while the gate is closed the nack is kept and issued when the gate opens again: while
// paused nothing is redelivered or dead-lettered and no permit goes out. Past
// maxDeferredNacks, nacks go to the client at once (counted in a metric).
func (c *Consumer) nack(n deferredNack) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inner == nil {
		return // stopped or closed: closing returned the message to the broker already
	}
	c.handed.forgetID(n.messageID())
	c.syncFastLocked()
	if c.phase == gateOpen {
		n.issue(c.inner)
		return
	}
	if len(c.nacks) >= maxDeferredNacks {
		c.metrics.m.nacksOverflow.Inc()
		n.issue(c.inner)
		return
	}
	c.nacks = append(c.nacks, n)
	c.metrics.deferredNacks.Set(float64(len(c.nacks)))
}

// issueNacksLocked sends the deferred nacks; the gate has just opened.
func (c *Consumer) issueNacksLocked() {
	for _, n := range c.nacks {
		n.issue(c.inner)
	}
	c.dropNacksLocked()
}

// dropNacksLocked forgets the deferred nacks: the consumer closes or seeks, and the broker
// returns or repositions those messages anyway.
func (c *Consumer) dropNacksLocked() {
	clear(c.nacks)
	c.nacks = c.nacks[:0]
	c.metrics.deferredNacks.Set(0)
}

// DeferredNacks returns how many nacks wait for the consumer to run again.
func (c *Consumer) DeferredNacks() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.nacks)
}
