package agent

import (
	"context"
	"errors"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/go-logr/logr"

	"github.com/subflow-dev/subflow/agent/internal/pulsaradmin"
	"github.com/subflow-dev/subflow/agent/protocol"
)

// SeekResult reports a seek by index: Positions tells, per partition whose cursor moved, which
// index is delivered next and from which message id; Failed lists the partitions whose cursor
// did not move, and why (a seek that moved some partitions and not others returns
// ErrSeekPartial: see SeekPartitionsByIndex); Probes counts the admin calls made to resolve the
// indexes.
type SeekResult = pulsaradmin.SeekResult

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
	ctx, stop := untilDone(ctx, c.life)
	defer stop()
	topic, err := singleTopic(c.opts)
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
	return result, result.Record(plan, moved, failures, err)
}

// resolveSeek plans a seek of targets on topic, whose partitions (or itself) are given, and
// resolves every index before anything moves; the admin calls it made are counted.
func (a *Agent) resolveSeek(ctx context.Context, topic string, partitions []string, targets []protocol.PartitionIndex) ([]seekStep, *SeekResult, error) {
	plan, result, err := a.admin.Resolve(ctx, topic, partitions, targets)
	if result != nil {
		a.metrics.seekProbes.Add(float64(result.Probes))
	}
	return plan, result, err
}

func singleTopic(opts pulsar.ConsumerOptions) (string, error) {
	switch {
	case opts.TopicsPattern != "" || len(opts.Topics) > 1:
		return "", ErrSeekUnsupported
	case opts.Topic != "":
		return opts.Topic, nil
	case len(opts.Topics) == 1:
		return opts.Topics[0], nil
	}
	return "", ErrSeekUnsupported
}

// seekStep is one partition's part of a seek, its index resolved.
type seekStep = pulsaradmin.Step

// position is an entry in a topic or partition.
type position struct{ ledger, entry int64 }

// untilDone derives a context that ends when life does (the consumer closes for good), so that
// a seek under way stops its admin calls then.
func untilDone(ctx, life context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(life, func() { cancel(ErrConsumerClosed) })
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
	c.session.seekWant = c.wishes.desired(c.agent.startGate.State())
	return nil
}

// movedCursors is what the resets of a seek changed: the partitions whose cursor moved, with
// the seek filter of each that landed inside a batch entry.
type movedCursors struct {
	partitions map[int32]bool
	skips      skipSet
}

// resetCursors resets each partition's cursor through the admin API; it returns what moved,
// and the failures and errors of the others. An empty topic's cursor has nothing to move and
// counts as moved.
func (a *Agent) resetCursors(ctx context.Context, subscription string, plan []seekStep) (movedCursors, map[int32]protocol.PartitionFailure, []error) {
	partitions, failures, errs := a.admin.ResetCursors(ctx, subscription, plan)
	moved := movedCursors{partitions: partitions, skips: skipSet{}}
	for _, step := range plan {
		from, target, batch, ok := step.Landing()
		if !ok || !partitions[step.Partition] {
			continue
		}
		filter := skipFilter{from: position{from.Ledger, from.Entry}, ledger: target.Ledger, entry: target.Entry, batch: batch}
		if filter.active() {
			moved.skips[max(step.Partition, 0)] = filter
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
