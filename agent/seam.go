package agent

import (
	"context"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/internal/seam"
	"github.com/subflow-dev/subflow/agent/protocol"
)

// The control server (agent/control) drives an agent through agent/internal/seam: what it
// applies (the controller's state with a generation, the drops and filters after another
// consumer's seek, the start-up sync, the backlog reads) is no part of the application's API,
// so it is reached through these adapters, which package agent registers when it is
// initialised, and never through an exported method.
func init() {
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

func (c controlledConsumer) SetState(ctx context.Context, state protocol.State, generation int64) error {
	return c.setState(ctx, state, generation)
}

func (c controlledConsumer) DropHeldOf(before time.Time, partitions []int32) int {
	return c.dropHeldOf(before, partitions)
}

func (c controlledConsumer) FilterSeekTargets(positions []protocol.SeekPosition) error {
	return c.filterSeekTargets(positions)
}
