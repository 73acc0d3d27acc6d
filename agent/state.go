package agent

import (
	"context"
	"errors"
	"fmt"

	"time"

	"github.com/apache/pulsar-client-go/pulsar"

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
	_ = c.lock(context.Background())
	defer c.unlock()
	c.localPaused = true
	c.logIfFailed(c.reconcile())
}

// Resume reverses the application's Pause. Messages held by the gate are delivered first.
// The consumer stays gated while the controller or the start-up gate want it paused or stopped.
func (c *Consumer) Resume() {
	_ = c.lock(context.Background())
	defer c.unlock()
	c.localPaused = false
	c.logIfFailed(c.reconcile())
}

// Stop closes the underlying consumer for real: buffered and unacknowledged messages return to
// the broker for other consumers. Receive blocks as while paused. Pause and Resume still record
// the application's wish, applied once the consumer runs again.
func (c *Consumer) Stop() {
	_ = c.lock(context.Background())
	defer c.unlock()
	c.localStopped = true
	c.logIfFailed(c.reconcile())
}

// Run reverses the application's Stop: the consumer subscribes again with the same options.
// It returns the subscribe error, if any; a later Run, Resume or SetState retries.
func (c *Consumer) Run() error {
	if err := c.lock(context.Background()); err != nil {
		return err
	}
	defer c.unlock()
	c.localStopped = false
	return c.reconcile()
}

// SetState applies the controller's desired state. generation must grow with every change
// (start at 1): a lower generation, or the same generation with another state, is refused with
// a *StaleGenerationError so that a late retry never undoes a newer request. Repeating the
// applied request is a no-op that retries a failed subscribe.
func (c *Consumer) SetState(ctx context.Context, state protocol.State, generation int64) error {
	if !state.Valid() {
		return &invalidStateError{state: state}
	}
	if err := c.lock(ctx); err != nil {
		return err
	}
	defer c.unlock()
	if generation < c.remoteGen || (generation == c.remoteGen && state != c.remote) {
		return &StaleGenerationError{Requested: generation, Applied: c.remoteGen, State: state}
	}
	c.remote, c.remoteGen = state, generation
	return c.reconcile()
}

// Generation returns the controller generation last applied by SetState (0 before any).
func (c *Consumer) Generation() int64 {
	_ = c.lock(context.Background())
	defer c.unlock()
	return c.remoteGen
}

// State returns the state the consumer is actually in.
func (c *Consumer) State() protocol.State { return c.observed.Load().state }

// IsPaused reports whether the gate is closed (Paused or Stopped).
func (c *Consumer) IsPaused() bool { return c.State() != protocol.Running }

func (c *Consumer) logIfFailed(err error) {
	if err != nil && !errors.Is(err, ErrConsumerClosed) {
		c.log.Error(err, "Applying state failed")
	}
}

// start performs the first reconcile; before it, reconcile only records wishes.
func (c *Consumer) start() error {
	_ = c.lock(context.Background())
	defer c.unlock()
	c.started = true
	return c.reconcile()
}

// reconcileLocked takes the transition lock and reconciles; for agent-wide changes.
func (c *Consumer) reconcileLocked() error {
	_ = c.lock(context.Background())
	defer c.unlock()
	return c.reconcile()
}

// desired combines the wishes: the most restrictive wins.
func (c *Consumer) desired() protocol.State {
	local := protocol.Running
	if c.localPaused {
		local = protocol.Paused
	}
	if c.localStopped {
		local = protocol.Stopped
	}
	return protocol.MostRestrictive(protocol.MostRestrictive(local, c.remote), c.agent.gate.State())
}

// reconcile brings the consumer to the desired state. Callers hold the transition lock.
func (c *Consumer) reconcile() error {
	if c.session.state == sessionEnded {
		return ErrConsumerClosed
	}
	if !c.started {
		return nil
	}
	want := c.desired()
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
	c.log.Info("Consumer state changed", "from", from, "state", actual, "session", c.session.state.String(), "heldMessages", held, "generation", c.remoteGen)
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
	if err := c.lockSeeks(ctx); err != nil {
		return err
	}
	defer c.unlockSeeks()
	if err := c.lock(ctx); err != nil {
		return err
	}
	defer c.unlock()
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
