// Package seam is where the control server (agent/control) meets what it drives: the Host and
// Consumer interfaces, which the agent library and the protocol sidecar (agent/sidecar) both
// implement, and the agent's registration of its own implementation.
//
// The control-plane operations (apply the controller's state with a generation, drop what a
// seek made stale, report backlogs, lift the start-up gate) are no part of an application's
// API, so package agent keeps them unexported and hands the control server adapters through
// AgentHost, as grpc-go's internal package carries the functions its packages register. Only
// packages under agent/ can import this one; everything else reaches it through agent/control,
// whose Host and Consumer are aliases of these.
package seam

import (
	"context"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/internal/pulsaradmin"
	"github.com/subflow-dev/subflow/agent/protocol"
)

// Host is the pod's side of subflow that the control server drives: the agent linked into a
// Go application, or the protocol sidecar next to an application in any language. Both report
// the consumers they gate, and the server applies the rules to them in the same way, so the
// controller cannot tell them apart but by Kind.
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
	// WatchBacklog, StopWatchingBacklog and LatestBacklog are the background backlog reads
	// (pulsaradmin.Watches): a host without admin access reports backlog unknown.
	WatchBacklog(topic, subscription string)
	StopWatchingBacklog(topic, subscription string)
	LatestBacklog(topic, subscription string) []protocol.BacklogStatus
}

// Consumer is one gated consumer, with the transitions the control server applies.
type Consumer interface {
	Name() string
	Topic() string
	Subscription() string
	// Options say which topics the consumer reads (Topic, Topics or TopicsPattern).
	Options() pulsar.ConsumerOptions
	// SetState applies a state computed with the given generation: a lower generation, or the
	// same one with another state, is refused with an *agent.StaleGenerationError.
	SetState(ctx context.Context, state protocol.State, generation int64) error
	Status() protocol.ConsumerStatus
	// SeekPartitionsByIndex executes a seek (agent.Consumer.SeekPartitionsByIndex).
	SeekPartitionsByIndex(ctx context.Context, targets []protocol.PartitionIndex) (*pulsaradmin.SeekResult, error)
	// DropHeldOf and FilterSeekTargets make a consumer that did not execute a seek agree with
	// the cursors it moved.
	DropHeldOf(before time.Time, partitions []int32) int
	FilterSeekTargets(positions []protocol.SeekPosition) error
}

// AgentHost returns the Host of an *agent.Agent. agent.New sets it, once, before it returns the
// first agent, so whoever holds an *agent.Agent finds it set; an init function would link the
// agent's consumer into every program that imports package agent (the protocol sidecar does,
// without creating an agent).
var AgentHost func(agent any) Host
