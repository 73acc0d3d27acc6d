// Package startgate is the start-up gate the agent and the sidecar share: the state every
// consumer is held to at most until the controller's first push (MarkSynced), with a bounded
// wait after which a fallback state applies.
package startgate

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// Gate is Paused while gated, the fallback after the timeout, then Running once synced.
type Gate struct {
	moved    func() // brings every consumer to its state after the gate moved
	log      logr.Logger
	fallback protocol.State
	timeout  time.Duration

	mu     sync.Mutex
	synced bool
	timer  *time.Timer
	state  atomic.Value // protocol.State, read by consumers under their own locks
}

// New opens the gate at once (gated false) or closes it, starting the bounded wait; moved is
// called, without the gate's lock, whenever its state changes.
func New(gated bool, timeout time.Duration, fallback protocol.State, log logr.Logger, moved func()) *Gate {
	g := &Gate{moved: moved, log: log, fallback: fallback, timeout: timeout, synced: !gated}
	g.state.Store(protocol.Running)
	if gated {
		g.state.Store(protocol.Paused)
		g.timer = time.AfterFunc(timeout, g.timedOut)
	}
	return g
}

// State is the gate's state: consumers take the most restrictive of it and their rules'.
func (g *Gate) State() protocol.State { return g.state.Load().(protocol.State) }

// MarkSynced lifts the gate: the controller has pushed (and the host applied) the rules in
// force. A no-op once synced.
func (g *Gate) MarkSynced() { g.set(protocol.Running, true) }

// Synced reports whether MarkSynced was called or the gate never closed.
func (g *Gate) Synced() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.synced
}

// Stop ends the bounded wait.
func (g *Gate) Stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.timer != nil {
		g.timer.Stop()
	}
}

func (g *Gate) timedOut() {
	if g.Synced() {
		return
	}
	g.log.Info("Start-up sync timed out", "fallbackState", g.fallback, "timeout", g.timeout.String())
	g.set(g.fallback, false)
}

func (g *Gate) set(state protocol.State, synced bool) {
	g.mu.Lock()
	if g.synced {
		g.mu.Unlock()
		return
	}
	g.synced = synced
	g.state.Store(state)
	if synced && g.timer != nil {
		g.timer.Stop()
	}
	g.mu.Unlock()
	g.moved()
}
