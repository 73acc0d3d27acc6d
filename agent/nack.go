package agent

import (
	"sync"
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

// nackBook keeps one consumer's nacks until their delay has passed with the gate open. It has
// a lock of its own; the consumer freezes it before closing the gate and thaws it after opening
// it, so that its clock runs exactly while the gate is open.
type nackBook struct {
	opts    pulsar.ConsumerOptions // the application's, for the delays
	metrics consumerMetrics

	mu      sync.Mutex
	inner   pulsar.Consumer // the session's client consumer; nil: nacks are no-ops
	running bool            // the gate is open: the delays run
	nacks   []deferredNack
	timer   *time.Timer // the next hand-over of nacks to the client, only while running
}

// use makes inner the client consumer nacks go to; use(nil) forgets the kept nacks: the
// session ends, and closing it returns those messages to the broker.
func (b *nackBook) use(inner pulsar.Consumer) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inner = inner
	if inner == nil {
		b.dropLocked()
	}
}

// add keeps a nack until its delay has passed with the gate open. Past maxDeferredNacks, nacks
// go to the client at once (counted in a metric).
func (b *nackBook) add(n deferredNack) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inner == nil {
		return // stopped or closed: closing returned the message to the broker already
	}
	if len(b.nacks) >= maxDeferredNacks {
		b.metrics.m.nacksOverflow.Inc()
		n.issue(b.inner)
		return
	}
	delay := nackDelay(b.opts, n)
	n.due, n.left = time.Now().Add(delay), delay
	b.nacks = append(b.nacks, n)
	b.metrics.deferredNacks.Set(float64(len(b.nacks)))
	b.schedule()
}

// freeze stops the nacks' clock, keeping what is left of each delay: the gate is about to close.
func (b *nackBook) freeze() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.running {
		return
	}
	b.running = false
	b.stopTimer()
	now := time.Now()
	for i := range b.nacks {
		b.nacks[i].left = max(b.nacks[i].due.Sub(now), 0)
	}
}

// thaw restarts the nacks' clock with what was left: the gate has just opened.
func (b *nackBook) thaw() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.running {
		return
	}
	b.running = true
	now := time.Now()
	for i := range b.nacks {
		b.nacks[i].due = now.Add(b.nacks[i].left)
	}
	b.schedule()
}

// drop forgets the kept nacks: the consumer seeks, and the broker repositions those messages.
func (b *nackBook) drop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dropLocked()
}

// count returns how many nacks the book keeps.
func (b *nackBook) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.nacks)
}

// isRunning reports whether the nacks' clock runs (for the consumer's invariants).
func (b *nackBook) isRunning() (running, timer bool, kept int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.running, b.timer != nil, len(b.nacks)
}

// schedule arms the timer for the earliest hand-over, while running; mu is held.
func (b *nackBook) schedule() {
	if !b.running || len(b.nacks) == 0 {
		return
	}
	next := b.nacks[0].due
	for _, n := range b.nacks[1:] {
		if n.due.Before(next) {
			next = n.due
		}
	}
	b.stopTimer()
	b.timer = time.AfterFunc(max(time.Until(next)-nackHandoff, 0), b.handOverDue)
}

func (b *nackBook) stopTimer() {
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
}

// handOverDue hands the nacks that are due within nackHandoff to the client, if the gate is
// still open (else the next thaw reschedules them).
func (b *nackBook) handOverDue() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.running || b.inner == nil {
		return
	}
	horizon := time.Now().Add(nackHandoff)
	kept := b.nacks[:0]
	for _, n := range b.nacks {
		if n.due.After(horizon) {
			kept = append(kept, n)
			continue
		}
		n.issue(b.inner)
	}
	clear(b.nacks[len(kept):])
	b.nacks = kept
	b.metrics.deferredNacks.Set(float64(len(b.nacks)))
	b.schedule()
}

func (b *nackBook) dropLocked() {
	b.stopTimer()
	clear(b.nacks)
	b.nacks = b.nacks[:0]
	b.metrics.deferredNacks.Set(0)
}
