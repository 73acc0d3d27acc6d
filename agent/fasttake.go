package agent

import (
	"sync/atomic"

	"github.com/apache/pulsar-client-go/pulsar"
)

// fastTake is the switch of the gate's take without the gate's lock, for the common case: the gate
// open, nothing held, no redelivery filter. gate.syncFast turns it on and off with the gate's lock
// held; takers enter and leave without it. Sequentially consistent atomics make the hand-off safe:
// a taker announces itself, then re-checks on; the closer clears on, then waits until no taker is
// left. Either the closer sees the taker, or the taker sees on cleared.
type fastTake struct {
	on     atomic.Bool
	takers atomic.Int64
	// src is the MessageChannel fast takers read and closing is closed when on is cleared;
	// both are written before on is set and not again until every fast taker has left.
	src     chan pulsar.ConsumerMessage
	closing chan struct{}
}

// set turns the fast take on over src, or off. Called with the gate's lock held.
func (f *fastTake) set(on bool, src chan pulsar.ConsumerMessage) {
	switch {
	case on && !f.on.Load():
		f.src, f.closing = src, make(chan struct{})
		f.on.Store(true)
	case !on && f.on.Load():
		f.on.Store(false)
		close(f.closing)
	}
}

func (f *fastTake) isOn() bool { return f.on.Load() }

// busy reports whether a fast taker may still hand a message over.
func (f *fastTake) busy() bool { return f.takers.Load() > 0 }

// enter announces a fast taker; false when the fast take is off. A taker that entered
// calls leave when done, whatever it found next.
func (f *fastTake) enter() bool {
	if !f.on.Load() {
		return false
	}
	f.takers.Add(1)
	return true
}

// channels returns, to a taker that entered, the channel to take from and the one closed when
// the fast take is turned off; ok is false when it was turned off before the taker entered.
func (f *fastTake) channels() (src chan pulsar.ConsumerMessage, closing <-chan struct{}, ok bool) {
	if !f.on.Load() {
		return nil, nil, false
	}
	return f.src, f.closing, true
}

// leave ends a fast take. It reports whether this was the last taker of a fast take turned
// off, which a closer may be waiting for.
func (f *fastTake) leave() (lastAfterOff bool) {
	return f.takers.Add(-1) == 0 && !f.on.Load()
}
