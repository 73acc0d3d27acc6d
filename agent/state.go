package agent

import (
	"context"
	"errors"
	"fmt"

	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/go-logr/logr"

	"github.com/subflow-dev/subflow/agent/protocol"
)

type invalidStateError struct{ state protocol.State }

func (e *invalidStateError) Error() string {
	return fmt.Sprintf("agent: invalid state %q: want Running, Paused or Stopped", e.state)
}

// Pause closes the gate. When it returns, no message reaches the application through Receive,
// Chan or any other path until the consumer runs again; the consumer stays connected and
// grants the broker no new permits. Idempotent and safe for concurrent use.
func (c *Consumer) Pause() {
	_ = c.transitions.lock(context.Background())
	defer c.transitions.unlock()
	c.wishes.localPaused = true
	logIfFailed(c.log, c.reconcile())
}

// Resume reverses the application's Pause. Messages held by the gate are delivered first.
// The consumer stays gated while the controller or the start-up gate want it paused or stopped.
func (c *Consumer) Resume() {
	_ = c.transitions.lock(context.Background())
	defer c.transitions.unlock()
	c.wishes.localPaused = false
	logIfFailed(c.log, c.reconcile())
}

// Stop closes the underlying consumer for real: buffered and unacknowledged messages return to
// the broker for other consumers. Receive blocks as while paused. Pause and Resume still record
// the application's wish, applied once the consumer runs again.
func (c *Consumer) Stop() {
	_ = c.transitions.lock(context.Background())
	defer c.transitions.unlock()
	c.wishes.localStopped = true
	logIfFailed(c.log, c.reconcile())
}

// Run reverses the application's Stop: the consumer subscribes again with the same options.
// It returns the subscribe error, if any; a later Run, Resume or controller push retries.
func (c *Consumer) Run() error {
	if err := c.transitions.lock(context.Background()); err != nil {
		return err
	}
	defer c.transitions.unlock()
	c.wishes.localStopped = false
	return c.reconcile()
}

// State returns the state the consumer is actually in.
func (c *Consumer) State() protocol.State { return c.observed.Load().state }

// IsPaused reports whether the gate is closed (Paused or Stopped).
func (c *Consumer) IsPaused() bool { return c.State() != protocol.Running }

func logIfFailed(log logr.Logger, err error) {
	if err != nil && !errors.Is(err, ErrConsumerClosed) {
		log.Error(err, "Applying state failed")
	}
}

// start performs the first reconcile; before it, reconcile only records wishes.
func (c *Consumer) start() error {
	_ = c.transitions.lock(context.Background())
	defer c.transitions.unlock()
	c.started = true
	return c.reconcile()
}

// wishes are what the application (Pause, Stop) and the controller (setState) want of a
// consumer; the start-up gate is the agent's (Agent.gate).
type wishes struct {
	localPaused, localStopped bool
	remote                    protocol.State
	remoteGen                 int64
}

// desired combines the wishes with the start-up gate's: the most restrictive wins.
func (w wishes) desired(startGate protocol.State) protocol.State {
	local := protocol.Running
	if w.localPaused {
		local = protocol.Paused
	}
	if w.localStopped {
		local = protocol.Stopped
	}
	return protocol.MostRestrictive(protocol.MostRestrictive(local, w.remote), startGate)
}

// reconcile brings the consumer to the desired state. Callers hold the transition lock.
func (c *Consumer) reconcile() error {
	if c.session.state == sessionEnded {
		return ErrConsumerClosed
	}
	if !c.started {
		return nil
	}
	want := c.wishes.desired(c.agent.startGate.State())
	if c.session.state == sessionSeeking {
		// A seek by index keeps the consumer unsubscribed, its gate closed, while it resets
		// the cursors, whatever the wishes say; the wish is reported now and applied when the
		// seek ends (endReset).
		c.session.seekWant = want
		c.recordState()
		return nil
	}
	var err error
	switch want {
	case protocol.Running:
		if err = c.session.subscribe(); err == nil {
			c.openGate()
		}
	case protocol.Paused:
		c.closeGate()
		err = c.session.subscribe()
		c.session.armRenewal(c.renew)
	case protocol.Stopped:
		c.closeGate()
		c.session.end(sessionUnsubscribed)
	}
	c.recordState()
	if err != nil {
		return fmt.Errorf("agent: subscribe %s/%s for state %s: %w", c.topic, c.opts.SubscriptionName, want, err)
	}
	return nil
}

// openGate opens the gate on the session's client consumer, and starts the nacks' clock.
func (c *Consumer) openGate() {
	if c.gate.open() {
		c.session.disarmRenewal()
		c.nacks.thaw()
	}
	if p, ok := c.session.inner.(nativePauser); ok {
		p.Resume()
	}
}

// closeGate stops the nacks' clock and closes the gate: when it returns, nothing reaches the
// application.
func (c *Consumer) closeGate() {
	c.nacks.freeze()
	c.gate.close()
	if p, ok := c.session.inner.(nativePauser); ok {
		p.Pause()
	}
}

// recordState derives the observed state from the session and the gate, and reports a change.
func (c *Consumer) recordState() {
	actual := protocol.Running
	switch {
	case c.session.state == sessionSeeking:
		// Unsubscribed and gated for the seek: what it was asked to be is what it returns to,
		// and Paused and Stopped already hold (nothing reaches the application, nothing is
		// connected).
		actual = c.session.seekWant
	case c.session.state != sessionSubscribed:
		actual = protocol.Stopped
	case !c.gate.isOpen():
		actual = protocol.Paused
	}
	from := c.observed.Load().state
	if actual == from {
		return
	}
	c.observed.Store(&observation{state: actual, since: time.Now()})
	held, _ := c.gate.counts()
	c.metrics.setState(from, actual)
	c.log.Info("Consumer state changed", "from", from, "state", actual, "session", c.session.state.String(), "heldMessages", held, "generation", c.wishes.remoteGen)
}

// observation is the state the consumer is in, and since when; written by recordState.
type observation struct {
	state protocol.State
	since time.Time
}

// seekWith closes the gate, runs seek on the client consumer, drops the held messages the seek
// made stale and reopens the gate if the consumer should run. Callers see no message from
// before the seek once it returns.
func (c *Consumer) seekWith(ctx context.Context, seek func(pulsar.Consumer) error) error {
	if err := c.seeks.lock(ctx); err != nil {
		return err
	}
	defer c.seeks.unlock()
	if err := c.transitions.lock(ctx); err != nil {
		return err
	}
	defer c.transitions.unlock()
	inner, err := c.session.current()
	if err != nil {
		return err
	}
	c.closeGate()
	c.gate.stopFetch()
	c.gate.unplug() // the client's Seek empties its channel itself; closing plugs it again
	if err = seek(inner); err == nil {
		dropped := c.gate.cursorMoved(time.Time{}, nil, func(skipSet) skipSet { return nil }) // filters of an earlier seek no longer apply
		c.nacks.drop()
		if dropped > 0 {
			c.log.Info("Held messages dropped by seek", "dropped", dropped)
		}
	}
	return errors.Join(err, c.reconcile())
}
