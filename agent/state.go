package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
func (c *Consumer) State() protocol.State {
	c.mu.Lock()
	defer c.unlockGate()
	return c.state
}

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
	if c.isClosed() {
		return ErrConsumerClosed
	}
	if !c.started {
		return nil
	}
	want := c.desired()
	if c.parkedForSeek(want) {
		return nil
	}
	var err error
	switch want {
	case protocol.Running:
		if err = c.ensureSubscribed(); err == nil {
			c.openGate()
		}
	case protocol.Paused:
		c.closeGate()
		err = c.ensureSubscribed()
		c.mu.Lock()
		c.armRenewalLocked()
		c.unlockGate()
	case protocol.Stopped:
		c.closeGate()
		c.closeInner()
	}
	c.recordState()
	if err != nil {
		return fmt.Errorf("agent: subscribe %s/%s for state %s: %w", c.topic, c.opts.SubscriptionName, want, err)
	}
	return nil
}

// parkedForSeek keeps the consumer unsubscribed, its gate closed, while a seek by index resets
// its cursors, whatever the wishes say; it records the wish, which the consumer reports now and
// applies when the seek ends (endReset).
func (c *Consumer) parkedForSeek(want protocol.State) bool {
	c.mu.Lock()
	seeking := c.seeking
	if seeking {
		c.seekWant = want
	}
	c.unlockGate()
	if seeking {
		c.recordState()
	}
	return seeking
}

func (c *Consumer) isClosed() bool {
	c.mu.Lock()
	defer c.unlockGate()
	return c.closed
}

func (c *Consumer) openGate() {
	c.mu.Lock()
	c.openGateLocked()
	inner := c.inner
	c.unlockGate()
	if p, ok := inner.(nativePauser); ok {
		p.Resume()
	}
}

func (c *Consumer) closeGate() {
	c.mu.Lock()
	c.closeGateLocked()
	inner := c.inner
	c.unlockGate()
	if p, ok := inner.(nativePauser); ok {
		p.Pause()
	}
}

// ensureSubscribed subscribes with the application's options and a fresh channel, plugged
// since the gate is closed meanwhile. The client grants its initial permits on subscribe; with
// the gate closed those messages stay buffered in the client.
func (c *Consumer) ensureSubscribed() error {
	c.mu.Lock()
	if c.inner != nil {
		c.unlockGate()
		return nil
	}
	plugged := c.phase != gateOpen
	src := newSource(c.zeroQueue, plugged)
	c.unlockGate()
	opts := c.opts
	opts.MessageChannel = src
	opts.Topics = slices.Clone(c.opts.Topics) // the client rewrites topic names in place
	clientNackOptions(&opts)                  // the agent owns the nack delay (nack.go)
	broker := newBrokerSession(time.Now)
	opts.BackOffPolicyFunc = broker.policyFunc(c.opts.BackOffPolicyFunc)
	inner, err := c.client.Subscribe(opts)
	if err != nil {
		return err
	}
	broker.subscribed()
	if p, ok := inner.(nativePauser); ok {
		p.Pause() // the gate is closed until the caller opens it
	}
	c.mu.Lock()
	c.setInnerLocked(inner, src, plugged)
	c.broker = broker
	c.unlockGate()
	c.log.Info("Consumer subscribed")
	return nil
}

// closeInner closes the underlying consumer; the gate is closed already. Held messages and
// deferred nacks are dropped unacknowledged: closing returns those messages to the broker.
func (c *Consumer) closeInner() {
	c.waitFetchStopped()
	c.mu.Lock()
	inner := c.inner
	c.disarmRenewalLocked()
	dropped := c.dropHeldLocked(time.Time{}, nil)
	c.setInnerLocked(nil, nil, false)
	c.dropNacksLocked()
	c.handed.forget()
	c.metrics.held.Set(0)
	c.unlockGate()
	if inner == nil {
		return
	}
	inner.Close()
	c.log.Info("Consumer unsubscribed", "droppedHeld", dropped)
}

// waitFetchStopped cancels a zero-queue fetch in flight and waits for it to end.
func (c *Consumer) waitFetchStopped() {
	c.mu.Lock()
	done := c.stopFetchLocked()
	c.unlockGate()
	if done != nil {
		<-done
	}
}

// recordState derives the observed state from the gate and reports a change.
func (c *Consumer) recordState() {
	c.mu.Lock()
	actual := protocol.Running
	switch {
	case c.closed:
		actual = protocol.Stopped
	case c.seeking:
		// Unsubscribed and gated for the seek: what it was asked to be is what it returns to,
		// and Paused and Stopped already hold (nothing reaches the application, nothing is
		// connected).
		actual = c.seekWant
	case c.inner == nil:
		actual = protocol.Stopped
	case c.phase != gateOpen:
		actual = protocol.Paused
	}
	from := c.state
	changed := actual != from
	if changed {
		c.state, c.since = actual, time.Now()
	}
	held, phase := c.heldCountLocked(), c.phase
	c.unlockGate()
	if !changed {
		return
	}
	c.metrics.setState(from, actual)
	c.log.Info("Consumer state changed", "from", from, "state", actual, "gate", phase.String(), "heldMessages", held, "generation", c.remoteGen)
}

// seekWith closes the gate, runs seek on the underlying consumer, drops the held messages the
// seek made stale and reopens the gate if the consumer should run. Callers see no message
// from before the seek once it returns.
func (c *Consumer) seekWith(ctx context.Context, seek func(pulsar.Consumer) error) error {
	if err := c.lockSeeks(ctx); err != nil {
		return err
	}
	defer c.unlockSeeks()
	if err := c.lock(ctx); err != nil {
		return err
	}
	defer c.unlock()
	inner, err := c.current()
	if err != nil {
		return err
	}
	c.closeGate()
	c.waitFetchStopped()
	c.mu.Lock()
	c.unplugLocked() // the client's Seek empties its channel itself; closing plugs it again
	c.unlockGate()
	if err = seek(inner); err == nil {
		c.mu.Lock()
		c.setSkips(nil) // filters of an earlier seek no longer apply
		dropped := c.dropHeldLocked(time.Time{}, nil)
		c.dropNacksLocked()
		c.handed.forget()
		c.unlockGate()
		if dropped > 0 {
			c.log.Info("Held messages dropped by seek", "dropped", dropped)
		}
	}
	return errors.Join(err, c.reconcile())
}
