package agent

import (
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// The agent owns the nack delay.
//
// pulsar-client-go (v0.19.0 to v0.21.0, negative_acks_tracker.go) keeps a nacked message for
// NackRedeliveryDelay (or the NackBackoffPolicy's delay), then sends
// REDELIVER_UNACKNOWLEDGED_MESSAGES from its own goroutine; the broker redelivers, spending
// permits, and the client's dispatcher dead-letters a message past MaxDeliveries
// (consumer_partition.go, dispatcher) without passing the gate, returning its permit as a FLOW.
// So a nack handed to the client before a pause is redelivered, and can be dead-lettered,
// during it. Instead the agent keeps every nack for the application's delay and hands it to the
// client only while the gate is open, nackHandoff before it is due; the client is subscribed
// with NackRedeliveryDelay nackHandoff, no backoff policy and NackPrecisionBit 0, so that it
// redelivers at the due time. The delay's clock stops while the gate is closed: on resume a
// nack takes effect after what was left of its delay at the pause (all of it for a nack made
// while paused).

// maxDeferredNacks bounds the nacks the agent keeps. It equals the broker's default
// maxUnackedMessagesPerConsumer, past which the broker stops dispatching to the consumer, so
// an application cannot normally hold more unacknowledged messages to nack.
const maxDeferredNacks = 50_000

// nackHandoff is the NackRedeliveryDelay the client is subscribed with, and how long before a
// nack is due the agent hands it over. The client's tracker ticks at a third of it.
const nackHandoff = 100 * time.Millisecond

// defaultNackDelay is pulsar-client-go's NackRedeliveryDelay when the option is zero
// (consumer_impl.go).
const defaultNackDelay = time.Minute

// deferredNack is one Nack or NackID the agent keeps.
type deferredNack struct {
	msg pulsar.Message // set by Nack (a backoff policy reads its redelivery count)
	id  pulsar.MessageID
	// due is when the redelivery is due while the gate is open; left is what remains of the
	// delay while it is closed.
	due  time.Time
	left time.Duration
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

// nackDelay is the application's redelivery delay for n, as the client would compute it: the
// backoff policy's for the message's redelivery count (Nack) or for 1 (NackID), else
// NackRedeliveryDelay.
func nackDelay(opts pulsar.ConsumerOptions, n deferredNack) time.Duration {
	policy := opts.NackBackoffPolicy
	if policy == nil && opts.EnableDefaultNackBackoffPolicy {
		policy = defaultNackBackoff{}
	}
	switch {
	case policy != nil && n.msg != nil:
		return policy.Next(n.msg.RedeliveryCount())
	case policy != nil:
		return policy.Next(1)
	case opts.NackRedeliveryDelay > 0:
		return opts.NackRedeliveryDelay
	}
	return defaultNackDelay
}

// defaultNackBackoff is what EnableDefaultNackBackoffPolicy selects in the client: one second
// doubled per redelivery, at most ten minutes.
type defaultNackBackoff struct{}

func (defaultNackBackoff) Next(redeliveryCount uint32) time.Duration {
	const lowest, highest = time.Second, 10 * time.Minute
	if redeliveryCount >= 30 { // 1 s << 30 is past the cap already
		return highest
	}
	return min(lowest<<redeliveryCount, highest)
}

// clientNackOptions sets the options through which the client redelivers a nack as soon as the
// agent hands it over.
func clientNackOptions(opts *pulsar.ConsumerOptions) {
	precision := int64(0)
	opts.NackRedeliveryDelay = nackHandoff
	opts.NackBackoffPolicy = nil
	opts.EnableDefaultNackBackoffPolicy = false
	opts.NackPrecisionBit = &precision
}

// nack keeps a nack until its delay has passed with the gate open. Past maxDeferredNacks,
// nacks go to the client at once (counted in a metric).
func (c *Consumer) nack(n deferredNack) {
	c.mu.Lock()
	defer c.unlockGate()
	if c.inner == nil {
		return // stopped or closed: closing returned the message to the broker already
	}
	// The application asked for the message again: the broker's next copy must pass the
	// redelivery filter, unless the gate still holds a copy, which is the one asked for (the
	// broker's copies of a message held through a pause are duplicates of it).
	if id := n.messageID(); !c.held.has(id) {
		c.handed.forgetID(id)
	}
	c.syncFastLocked()
	if len(c.nacks) >= maxDeferredNacks {
		c.metrics.m.nacksOverflow.Inc()
		n.issue(c.inner)
		return
	}
	delay := nackDelay(c.opts, n)
	n.due, n.left = time.Now().Add(delay), delay
	c.nacks = append(c.nacks, n)
	c.metrics.deferredNacks.Set(float64(len(c.nacks)))
	c.scheduleNacksLocked()
}

// freezeNacksLocked stops the nacks' clock: the gate has just closed.
func (c *Consumer) freezeNacksLocked() {
	c.stopNackTimerLocked()
	now := time.Now()
	for i := range c.nacks {
		c.nacks[i].left = max(c.nacks[i].due.Sub(now), 0)
	}
}

// thawNacksLocked restarts the nacks' clock with what was left: the gate has just opened.
func (c *Consumer) thawNacksLocked() {
	now := time.Now()
	for i := range c.nacks {
		c.nacks[i].due = now.Add(c.nacks[i].left)
	}
	c.scheduleNacksLocked()
}

// scheduleNacksLocked arms the timer for the earliest hand-over, while the gate is open.
func (c *Consumer) scheduleNacksLocked() {
	if c.phase != gateOpen || len(c.nacks) == 0 {
		return
	}
	next := c.nacks[0].due
	for _, n := range c.nacks[1:] {
		if n.due.Before(next) {
			next = n.due
		}
	}
	c.stopNackTimerLocked()
	c.nackTimer = time.AfterFunc(max(time.Until(next)-nackHandoff, 0), c.handOverDueNacks)
}

func (c *Consumer) stopNackTimerLocked() {
	if c.nackTimer != nil {
		c.nackTimer.Stop()
		c.nackTimer = nil
	}
}

// handOverDueNacks hands the nacks that are due within nackHandoff to the client, if the gate
// is still open (else the next open reschedules them).
func (c *Consumer) handOverDueNacks() {
	c.mu.Lock()
	defer c.unlockGate()
	if c.phase != gateOpen || c.inner == nil {
		return
	}
	horizon := time.Now().Add(nackHandoff)
	kept := c.nacks[:0]
	for _, n := range c.nacks {
		if n.due.After(horizon) {
			kept = append(kept, n)
			continue
		}
		n.issue(c.inner)
	}
	clear(c.nacks[len(kept):])
	c.nacks = kept
	c.metrics.deferredNacks.Set(float64(len(c.nacks)))
	c.scheduleNacksLocked()
}

// dropNacksLocked forgets the kept nacks: the consumer closes or seeks, and the broker
// returns or repositions those messages anyway.
func (c *Consumer) dropNacksLocked() {
	c.stopNackTimerLocked()
	clear(c.nacks)
	c.nacks = c.nacks[:0]
	c.metrics.deferredNacks.Set(0)
}

// DeferredNacks returns how many nacks the agent keeps: made while paused, or waiting for their
// redelivery delay to pass while running.
func (c *Consumer) DeferredNacks() int {
	c.mu.Lock()
	defer c.unlockGate()
	return len(c.nacks)
}
