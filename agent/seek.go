package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// SeekResult reports a seek by index.
type SeekResult struct {
	// Positions tells, per partition whose cursor moved, which index is delivered next and from
	// which message id.
	Positions []protocol.SeekPosition
	// Failed lists the partitions whose cursor did not move, and why. A seek that moved some
	// partitions and not others returns ErrSeekPartial: see SeekPartitionsByIndex.
	Failed []protocol.PartitionFailure
	// Probes counts the admin calls made to resolve the indexes.
	Probes int
}

// SeekByIndex resets the subscription of a non-partitioned topic so that the message with
// broker-entry index `index` is the next one delivered (PIP-101: below the topic's range means
// earliest, at or past its end latest). Messages held by the gate are dropped, never acked.
// The indexes are resolved through the admin API with the application's credentials; a broker
// without index metadata gives ErrIndexMetadataDisabled and nothing moves.
func (c *Consumer) SeekByIndex(ctx context.Context, index int64) (*SeekResult, error) {
	return c.SeekPartitionsByIndex(ctx, []protocol.PartitionIndex{{Partition: -1, Index: index}})
}

// SeekPartitionsByIndex is SeekByIndex with one index per partition of a partitioned topic
// (partition -1 addresses a non-partitioned topic). Every index is resolved before anything
// moves. Then the consumer is closed, each cursor is reset through the admin API and the
// consumer subscribes again. Partitions are reset one by one and a reset cannot be undone, so
// when some resets fail after others succeeded the error wraps ErrSeekPartial and the result
// tells both: Positions the partitions that moved, Failed the ones that did not (whose
// messages are delivered from where they were, as if no seek had been asked for them). A
// retry then asks only for the Failed partitions, so that no partition is replayed twice. The client's own Seek is not used: pulsar-client-go cannot seek
// a partitioned consumer, and a client that seeks keeps the seek position as a pending
// "discard up to here" mark. On Exclusive and Failover a real broker disconnects only the
// active consumer on a seek, so a standby that sought would apply the mark at some later
// reconnect and discard (and ack) messages then; and any client that sought keeps discarding
// up to the mark after later reconnects, so a later backward seek by another agent would lose
// messages. A closed consumer keeps no such state.
func (c *Consumer) SeekPartitionsByIndex(ctx context.Context, targets []protocol.PartitionIndex) (*SeekResult, error) {
	res, err := c.seekPartitionsByIndex(ctx, targets)
	c.agent.logSeek(c.log, res, err)
	return res, err
}

// logSeek logs a seek's outcome and counts it.
func (a *Agent) logSeek(log logr.Logger, res *SeekResult, err error) {
	result := "Completed"
	if err != nil {
		result = "Failed"
		log.Error(err, "Seek by index failed")
	} else {
		log.Info("Seek by index completed", "positions", res.Positions, "probes", res.Probes)
	}
	a.metrics.seeks.WithLabelValues(result).Inc()
}

func (c *Consumer) seekPartitionsByIndex(ctx context.Context, targets []protocol.PartitionIndex) (*SeekResult, error) {
	if c.agent.admin == nil {
		return nil, ErrNoAdminURL
	}
	ctx, stop := c.untilClosed(ctx)
	defer stop()
	topic, err := c.singleTopic()
	if err != nil {
		return nil, err
	}
	partitions, err := c.client.TopicPartitions(topic)
	if err != nil {
		return nil, err
	}
	plan, result, err := c.agent.resolveSeek(ctx, topic, partitions, targets)
	if err != nil {
		return result, err
	}
	moved, failures, err := c.resetPartitions(ctx, plan)
	return result, result.record(plan, moved, failures, err)
}

// ResetByIndex is SeekPartitionsByIndex for a subscription whose consumers are not this
// agent's (the protocol sidecar's): it resolves every index on topic, calls beforeReset (if
// not nil) with the positions the cursors are about to take, then resets the subscription's
// cursors through the admin API. The broker disconnects the subscription's consumers on a
// reset (on Exclusive and Failover the active one), so they subscribe again and are delivered
// from the new cursors; beforeReset is the caller's chance to get ready for that, as the
// sidecar does to cut the target's batch entry. What a client had buffered from before the
// reset may still reach its application.
func (a *Agent) ResetByIndex(ctx context.Context, topic, subscription string, targets []protocol.PartitionIndex, beforeReset func([]protocol.SeekPosition)) (*SeekResult, error) {
	res, err := a.resetByIndex(ctx, topic, subscription, targets, beforeReset)
	a.logSeek(a.log.WithValues("topic", topic, "subscription", subscription), res, err)
	return res, err
}

func (a *Agent) resetByIndex(ctx context.Context, topic, subscription string, targets []protocol.PartitionIndex, beforeReset func([]protocol.SeekPosition)) (*SeekResult, error) {
	if a.admin == nil {
		return nil, ErrNoAdminURL
	}
	full, err := fullTopicName(topic)
	if err != nil {
		return nil, err
	}
	partitions, err := a.admin.partitionNames(ctx, full)
	if err != nil {
		return nil, err
	}
	plan, result, err := a.resolveSeek(ctx, full, partitions, targets)
	if err != nil {
		return result, err
	}
	if beforeReset != nil {
		positions := make([]protocol.SeekPosition, len(plan))
		for i, step := range plan {
			positions[i] = step.seekPosition()
		}
		beforeReset(positions)
	}
	moved, failures, errs := a.resetCursors(ctx, subscription, plan)
	return result, result.record(plan, moved.partitions, failures, errors.Join(errs...))
}

// resolveSeek plans a seek of targets on topic, whose partitions (or itself) are given, and
// resolves every index before anything moves.
func (a *Agent) resolveSeek(ctx context.Context, topic string, partitions []string, targets []protocol.PartitionIndex) ([]seekStep, *SeekResult, error) {
	plan, err := planSeek(targets, partitions, isPartitioned(topic, partitions))
	if err != nil {
		return nil, nil, err
	}
	src := &countingSource{indexSource: a.admin}
	defer func() { a.metrics.seekProbes.Add(float64(src.probes)) }()
	result := &SeekResult{}
	for i := range plan {
		r, err := resolveIndex(ctx, src, plan[i].topic, plan[i].index)
		result.Probes = src.probes
		if err != nil {
			return nil, result, fmt.Errorf("agent: resolve index %d on %s: %w", plan[i].index, plan[i].topic, err)
		}
		plan[i].res = r
	}
	return plan, result, nil
}

// record fills the result in from what the resets did and returns the seek's error, which
// wraps ErrSeekPartial when some partitions moved and others did not.
func (r *SeekResult) record(plan []seekStep, moved map[int32]bool, failures map[int32]protocol.PartitionFailure, err error) error {
	for _, step := range plan {
		if failure, ok := failures[step.partition]; ok {
			r.Failed = append(r.Failed, failure)
		} else if moved[step.partition] {
			r.Positions = append(r.Positions, step.seekPosition())
		}
	}
	if len(r.Positions) > 0 && len(r.Failed) > 0 {
		return fmt.Errorf("%w: %w", ErrSeekPartial, err)
	}
	return err
}

// isPartitioned tells a partitioned topic from a non-partitioned one (or a single partition
// named directly) by the client's partition list.
func isPartitioned(topic string, partitions []string) bool {
	if len(partitions) != 1 {
		return len(partitions) > 1
	}
	return strings.HasSuffix(partitions[0], "-partition-0") && !strings.HasSuffix(topic, "-partition-0")
}

func (c *Consumer) singleTopic() (string, error) {
	switch {
	case c.opts.TopicsPattern != "" || len(c.opts.Topics) > 1:
		return "", ErrSeekUnsupported
	case c.opts.Topic != "":
		return c.opts.Topic, nil
	case len(c.opts.Topics) == 1:
		return c.opts.Topics[0], nil
	}
	return "", ErrSeekUnsupported
}

// seekStep is one partition's part of a seek.
type seekStep struct {
	partition int32 // -1 for a non-partitioned topic
	topic     string
	index     int64
	res       resolution
}

func planSeek(targets []protocol.PartitionIndex, partitions []string, partitioned bool) ([]seekStep, error) {
	if len(targets) == 0 {
		return nil, errors.New("agent: seek by index without a target")
	}
	seen := map[int32]bool{}
	plan := make([]seekStep, 0, len(targets))
	for _, t := range targets {
		switch {
		case !partitioned && t.Partition > 0, partitioned && (t.Partition < 0 || int(t.Partition) >= len(partitions)):
			return nil, fmt.Errorf("agent: partition %d does not exist (the topic has %d)", t.Partition, len(partitions))
		case seen[t.Partition]:
			return nil, fmt.Errorf("agent: partition %d given twice", t.Partition)
		case t.Index < 0:
			return nil, fmt.Errorf("agent: negative index %d", t.Index)
		}
		seen[t.Partition] = true
		step := seekStep{partition: t.Partition, index: t.Index, topic: partitions[0]}
		if partitioned {
			step.topic = partitions[t.Partition]
		} else {
			step.partition = -1
		}
		plan = append(plan, step)
	}
	if !partitioned && len(plan) > 1 {
		return nil, errors.New("agent: a non-partitioned topic takes one index")
	}
	return plan, nil
}

func (s seekStep) seekPosition() protocol.SeekPosition {
	p := protocol.SeekPosition{Partition: s.partition, Index: s.res.index}
	if !s.res.empty {
		p.MessageID = fmt.Sprintf("%d:%d:%d:%d", s.res.pos.ledger, s.res.pos.entry, s.partition, s.res.batch)
		if c := s.res.cursor; c != nil {
			p.Cursor = fmt.Sprintf("%d:%d", c.ledger, c.entry)
		}
	}
	return p
}

// untilClosed derives a context that ends when the consumer closes for good, so that a seek
// under way stops its admin calls then.
func (c *Consumer) untilClosed(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(c.life, func() { cancel(ErrConsumerClosed) })
	return ctx, func() {
		stop()
		cancel(nil)
	}
}

// resetPartitions resets cursors through the admin API. A connected consumer is closed first
// and subscribes again afterwards, so that no message read from the old position is handed
// over; messages before the target inside its batch entry are acked and skipped by the gate
// every time the broker sends that entry, until the cursor moves again (skip.go).
//
// The transition lock is not held while the admin API works (a broker can take long, and the
// seek's deadline is minutes): Close, Pause, Stop and the others apply meanwhile. The consumer
// stays unsubscribed with its gate closed until the resets are done (reconcile parks it), and
// a Close ends the seek: its admin calls are cancelled and it never subscribes again.
//
// It returns the partitions whose cursor moved and those whose reset failed; the error joins
// the failures and whatever else went wrong (a cursor can move and the subscribe after it fail).
func (c *Consumer) resetPartitions(ctx context.Context, plan []seekStep) (map[int32]bool, map[int32]protocol.PartitionFailure, error) {
	if err := c.seeks.lock(ctx); err != nil {
		return nil, nil, err
	}
	defer c.seeks.unlock()
	if err := c.beginReset(ctx); err != nil {
		return nil, nil, err
	}
	moved, failures, errs := c.agent.resetCursors(ctx, c.opts.SubscriptionName, plan)
	return moved.partitions, failures, c.endReset(moved, errs)
}

// beginReset closes the gate and the underlying consumer, and parks the consumer for the seek.
func (c *Consumer) beginReset(ctx context.Context) error {
	if err := c.transitions.lock(ctx); err != nil {
		return err
	}
	defer c.transitions.unlock()
	if c.session.state == sessionEnded {
		return ErrConsumerClosed
	}
	c.closeGate()
	c.session.end(sessionSeeking)
	c.session.seekWant = c.wishes.desired(c.agent.gate.State())
	return nil
}

// movedCursors is what the resets of a seek changed: the partitions whose cursor moved, with
// the seek filter of each that landed inside a batch entry.
type movedCursors struct {
	partitions map[int32]bool
	skips      skipSet
}

// resetCursors resets each partition's cursor; it returns what moved, and the failures and
// errors of the others. An empty topic's cursor has nothing to move and counts as moved.
func (a *Agent) resetCursors(ctx context.Context, subscription string, plan []seekStep) (movedCursors, map[int32]protocol.PartitionFailure, []error) {
	var errs []error
	failures := map[int32]protocol.PartitionFailure{}
	moved := movedCursors{partitions: map[int32]bool{}, skips: skipSet{}}
	for _, step := range plan {
		if step.res.empty {
			moved.partitions[step.partition] = true
			continue
		}
		if err := a.admin.resetCursor(ctx, step.topic, subscription, step.res.resetTo(), step.res.past); err != nil {
			err = fmt.Errorf("agent: reset cursor of %s: %w", step.topic, err)
			errs = append(errs, err)
			failures[step.partition] = protocol.PartitionFailure{Partition: step.partition, Index: step.index, Error: err.Error()}
			continue
		}
		moved.partitions[step.partition] = true
		filter := skipFilter{from: step.res.resetTo(), ledger: step.res.pos.ledger, entry: step.res.pos.entry, batch: step.res.batch}
		if filter.active() && !step.res.past {
			moved.skips[max(step.partition, 0)] = filter
		}
	}
	return moved, failures, errs
}

// endReset unparks the consumer and brings it to the state wished for now. A consumer closed
// meanwhile stays closed. Everything held is dropped: the consumer subscribes again, and the
// broker delivers each partition from its cursor, moved or not. A partition whose reset failed
// keeps the seek filter of an earlier seek, as its cursor did not move.
func (c *Consumer) endReset(moved movedCursors, errs []error) error {
	_ = c.transitions.lock(context.Background())
	defer c.transitions.unlock()
	if c.session.state == sessionEnded {
		return errors.Join(append([]error{ErrConsumerClosed}, errs...)...)
	}
	c.session.set(sessionUnsubscribed, nil, nil)
	c.gate.cursorMoved(time.Time{}, nil, func(old skipSet) skipSet { return old.after(moved) })
	return errors.Join(append(errs, c.reconcile())...)
}
