package control

import (
	"context"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent"
	"github.com/subflow-dev/subflow/agent/protocol"
)

// Host is the pod's side of subflow that the control server drives: the agent linked into a
// Go application (New), or the protocol sidecar next to an application in any language
// (agent/sidecar). Both report the consumers they gate, and the server applies the rules to
// them in the same way, so the controller cannot tell them apart but by Kind.
type Host interface {
	// Name is how the host reports itself (the pod name).
	Name() string
	// Kind is protocol.KindAgent or protocol.KindSidecar.
	Kind() string
	// Consumers are the consumers open now.
	Consumers() []Consumer
	// OnSubscribe runs fn for every consumer that appears later, before its first permit.
	OnSubscribe(fn func(Consumer))
	// MarkSynced tells the host that the controller has pushed the rules in force.
	MarkSynced()
	// The backlog watches of agent.Agent: a host without admin access reports backlog unknown.
	WatchBacklog(topic, subscription string)
	StopWatchingBacklog(topic, subscription string)
	LatestBacklog(topic, subscription string) []protocol.BacklogStatus
}

// Consumer is one gated consumer, with the transitions of agent.Consumer.
type Consumer interface {
	Name() string
	Topic() string
	Subscription() string
	// Options say which topics the consumer reads (Topic, Topics or TopicsPattern).
	Options() pulsar.ConsumerOptions
	// SetState applies a state computed with the given generation (agent.Consumer.SetState).
	SetState(ctx context.Context, state protocol.State, generation int64) error
	Status() protocol.ConsumerStatus
	// SeekPartitionsByIndex executes a seek (agent.Consumer.SeekPartitionsByIndex).
	SeekPartitionsByIndex(ctx context.Context, targets []protocol.PartitionIndex) (*agent.SeekResult, error)
	// DropHeldOf and FilterSeekTargets make a consumer that did not execute a seek agree with
	// the cursors it moved.
	DropHeldOf(before time.Time, partitions []int32) int
	FilterSeekTargets(positions []protocol.SeekPosition) error
}

var _ Consumer = (*agent.Consumer)(nil)

// agentHost adapts agent.Agent, whose methods speak of its own *agent.Consumer.
type agentHost struct{ *agent.Agent }

// AgentHost is the Host of an agent linked into the application.
func AgentHost(a *agent.Agent) Host { return agentHost{a} }

func (agentHost) Kind() string { return protocol.KindAgent }

func (h agentHost) Consumers() []Consumer {
	consumers := h.Agent.Consumers()
	out := make([]Consumer, len(consumers))
	for i, c := range consumers {
		out[i] = c
	}
	return out
}

func (h agentHost) OnSubscribe(fn func(Consumer)) {
	h.Agent.OnSubscribe(func(c *agent.Consumer) { fn(c) })
}
