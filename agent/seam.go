package agent

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/internal/seam"
	"github.com/subflow-dev/subflow/agent/protocol"
)

// The control server (agent/control) drives an agent through agent/internal/seam: what it
// applies (the controller's state with a generation, the drops and filters after another
// consumer's seek, the start-up sync, the backlog reads) is no part of the application's API,
// so it is reached through these adapters, never through an exported method.
//
// New registers them, once, rather than an init function: a program that links package agent
// without creating an agent (the protocol sidecar, through agent/control) then links neither
// the adapters nor the consumer behind them.
var seamRegistered sync.Once

func registerSeam() {
	seam.AgentHost = func(a any) seam.Host { return agentHost{a.(*Agent)} }
}

// agentHost is the agent as the control server drives it.
type agentHost struct{ a *Agent }

func (h agentHost) Name() string { return h.a.opts.Name }
func (agentHost) Kind() string   { return protocol.KindAgent }
func (h agentHost) MarkSynced()  { h.a.markSynced() }
func (h agentHost) Consumers() []seam.Consumer {
	consumers := h.a.consumersNow()
	out := make([]seam.Consumer, len(consumers))
	for i, c := range consumers {
		out[i] = controlledConsumer{c}
	}
	return out
}

func (h agentHost) OnSubscribe(fn func(seam.Consumer)) {
	h.a.onSubscribe(func(c *Consumer) { fn(controlledConsumer{c}) })
}

func (h agentHost) WatchBacklog(topic, subscription string) { h.a.backlog.Watch(topic, subscription) }

func (h agentHost) StopWatchingBacklog(topic, subscription string) {
	h.a.backlog.Stop(topic, subscription)
}

func (h agentHost) LatestBacklog(topic, subscription string) []protocol.BacklogStatus {
	return h.a.backlog.Latest(topic, subscription)
}

// controlledConsumer is a consumer as the control server drives it: the application's methods
// (Name, Subscription, Status, SeekPartitionsByIndex) and the controller's.
type controlledConsumer struct{ *Consumer }

// Topic is the topic, the comma-separated topics or the pattern the consumer was created for.
func (c controlledConsumer) Topic() string { return c.topic }

// Options are the options as the application gave them (with Name filled in). The client gets
// them with the agent's MessageChannel and nack settings (nack.go).
func (c controlledConsumer) Options() pulsar.ConsumerOptions { return c.opts }

// SetState applies the controller's desired state (the control server's SetState, through
// the seam). generation must grow with every change
// (start at 1): a lower generation, or the same generation with another state, is refused with
// a *StaleGenerationError so that a late retry never undoes a newer request. Repeating the
// applied request is a no-op that retries a failed subscribe.
func (c controlledConsumer) SetState(ctx context.Context, state protocol.State, generation int64) error {
	if !state.Valid() {
		return &invalidStateError{state: state}
	}
	if err := c.transitions.lock(ctx); err != nil {
		return err
	}
	defer c.transitions.unlock()
	if generation < c.wishes.remoteGen || (generation == c.wishes.remoteGen && state != c.wishes.remote) {
		return &StaleGenerationError{Requested: generation, Applied: c.wishes.remoteGen, State: state}
	}
	c.wishes.remote, c.wishes.remoteGen = state, generation
	return c.reconcile()
}

// DropHeldOf drops, unacknowledged, the messages the gate took at or before `before` (all when
// zero) of some partitions (-1 names a non-partitioned topic; nil names every partition), after
// a seek another consumer ran: messages from before the seek never reach the application, and
// a seek that moved only some cursors leaves the others' messages wanted. The messages of an
// earlier seek target's entry on a moved partition are wanted again too.
func (c controlledConsumer) DropHeldOf(before time.Time, partitions []int32) int {
	set := newPartitionSet(partitions)
	n := c.gate.cursorMoved(before, set, func(old skipSet) skipSet { return old.without(set) })
	if n > 0 {
		c.log.Info("Held messages dropped", "dropped", n, "partitions", partitions)
	}
	return n
}

// FilterSeekTargets takes on the seek filters of a seek another consumer ran (positions as
// the executor reports them): on Shared and Key_Shared the broker may send the target's batch
// entry to this consumer, and the messages before the target in it must not reach the
// application here either; nor may a message from before the new cursor that the client
// still had in hand. Held messages before a target are dropped now.
func (c controlledConsumer) FilterSeekTargets(positions []protocol.SeekPosition) error {
	filters := skipSet{}
	for _, p := range positions {
		if p.MessageID == "" {
			continue // an empty topic: nothing to filter
		}
		f, err := parseTarget(p)
		if err != nil {
			return err
		}
		f.stale = &atomic.Bool{}
		f.stale.Store(true)
		filters[max(p.Partition, 0)] = f
	}
	if len(filters) == 0 {
		return nil
	}
	c.gate.filterSeekTargets(filters)
	return nil
}
