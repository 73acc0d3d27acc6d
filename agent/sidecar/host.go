package sidecar

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent"
	"github.com/subflow-dev/subflow/agent/control"
	"github.com/subflow-dev/subflow/agent/protocol"
)

// errSeekUnsupported is what a seek executed by a sidecar answers: the sidecar does not move
// cursors yet. A flow whose pods include agents has them execute it; a sidecar pod that did
// not execute a seek still drops what it held from before it.
var errSeekUnsupported = fmt.Errorf("%w: the protocol sidecar does not move cursors yet; a pod with the agent library can execute it", control.ErrSeekUnsupported)

// ControlHost is the sidecar as the control server drives it (control.NewForHost), so the
// controller pushes to a sidecar pod exactly as to an agent pod. admin is an agent with no
// consumers of its own: it makes the admin calls (backlog reads) with the pod's credentials.
func (s *Sidecar) ControlHost(admin *agent.Agent) control.Host {
	return &controlHost{Sidecar: s, admin: admin}
}

var _ control.Consumer = (*Consumer)(nil)

type controlHost struct {
	*Sidecar
	admin *agent.Agent
}

func (*controlHost) Kind() string { return protocol.KindSidecar }

func (h *controlHost) Consumers() []control.Consumer {
	consumers := h.Sidecar.Consumers()
	out := make([]control.Consumer, len(consumers))
	for i, c := range consumers {
		out[i] = c
	}
	return out
}

func (h *controlHost) OnSubscribe(fn func(control.Consumer)) {
	h.Sidecar.OnSubscribe(func(c *Consumer) { fn(c) })
}

// MarkSynced has nothing to lift: the sidecar has no start-up gate.
func (*controlHost) MarkSynced() {}

func (h *controlHost) WatchBacklog(topic, subscription string) {
	h.admin.WatchBacklog(topic, subscription)
}

func (h *controlHost) StopWatchingBacklog(topic, subscription string) {
	h.admin.StopWatchingBacklog(topic, subscription)
}

func (h *controlHost) LatestBacklog(topic, subscription string) []protocol.BacklogStatus {
	return h.admin.LatestBacklog(topic, subscription)
}

// Options describe what the consumer reads, for matching flows by topic: the sidecar sees
// each partition subscribe on its own, so it is the partition's topic.
func (c *Consumer) Options() pulsar.ConsumerOptions {
	return pulsar.ConsumerOptions{Topic: c.topic, SubscriptionName: c.subscription, Name: c.name}
}

// SeekPartitionsByIndex answers control.ErrSeekUnsupported (see there).
func (c *Consumer) SeekPartitionsByIndex(context.Context, []protocol.PartitionIndex) (*agent.SeekResult, error) {
	return nil, errSeekUnsupported
}

// DropHeldOf drops what DropHeld drops when the consumer's partition is one of partitions
// (nil: any). A non-partitioned topic is partition -1.
func (c *Consumer) DropHeldOf(before time.Time, partitions []int32) int {
	if partitions != nil && !slices.Contains(partitions, partitionOf(c.topic)) {
		return 0
	}
	return c.DropHeld(before)
}

// FilterSeekTargets filters nothing: the sidecar forwards batch entries whole, so after a seek
// into a batch the client gets the batch's messages before the target too (docs/sidecar.md).
func (*Consumer) FilterSeekTargets([]protocol.SeekPosition) error { return nil }

func partitionOf(topic string) int32 {
	i := strings.LastIndex(topic, "-partition-")
	if i < 0 {
		return -1
	}
	n, err := strconv.ParseInt(topic[i+len("-partition-"):], 10, 32)
	if err != nil {
		return -1
	}
	return int32(n)
}
