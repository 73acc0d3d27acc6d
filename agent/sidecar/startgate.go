package sidecar

import (
	"context"
	"errors"
	"fmt"

	"github.com/subflow-dev/subflow/agent"
	"github.com/subflow-dev/subflow/agent/internal/startgate"
	"github.com/subflow-dev/subflow/agent/protocol"
)

// newStartGate checks the start-up gate's options (Options.StartGated) and starts the gate.
func (s *Sidecar) newStartGate() error {
	if s.opts.SyncTimeout <= 0 {
		s.opts.SyncTimeout = agent.DefaultSyncTimeout
	}
	if s.opts.FallbackState == "" {
		s.opts.FallbackState = protocol.Running
	}
	if !s.opts.FallbackState.Valid() {
		return fmt.Errorf("sidecar: fallback state %q: want Running, Paused or Stopped", s.opts.FallbackState)
	}
	s.startGate = startgate.New(s.opts.StartGated, s.opts.SyncTimeout, s.opts.FallbackState, s.log, s.regate)
	return nil
}

// MarkSynced lifts the start-up gate: the controller has pushed the rules in force (the
// control server calls it once it applied them). A no-op once synced.
func (s *Sidecar) MarkSynced() { s.startGate.MarkSynced() }

// Synced reports whether MarkSynced was called or StartGated is off.
func (s *Sidecar) Synced() bool { return s.startGate.Synced() }

// regate brings every consumer to its state after the start-up gate moved.
func (s *Sidecar) regate() {
	for _, c := range s.Consumers() {
		if err := c.regate(context.Background()); err != nil && !errors.Is(err, agent.ErrConsumerClosed) {
			s.log.Error(err, "Applying the start-up state failed", "consumer", c.name, "topic", c.topic)
		}
	}
}
