package control

import (
	"context"
	"errors"
	"time"

	"github.com/subflow-dev/subflow/agent"
	"github.com/subflow-dev/subflow/agent/protocol"
)

// DefaultSeekTimeout bounds one seek: resolving the indexes and moving the cursors.
const DefaultSeekTimeout = 2 * time.Minute

// seekHistory is how many records of seeks no rule names any more are kept, so that a
// retried or repeated id of a recent seek still runs at most once.
const seekHistory = 16

// seekKey names one seek: an id runs at most once per flow UID.
type seekKey struct{ uid, id string }

// seekRecord is what this agent knows of one seek.
type seekRecord struct {
	status protocol.SeekStatus
	// executor: this agent started the seek; it never starts it again.
	executor bool
	// announced is when this agent first heard of the seek; once told it succeeded, it drops
	// the held messages taken at or before that time (they predate the new cursor).
	announced time.Time
	// settled: the drop was done, or can no longer be done, so a later notice does nothing.
	settled bool
}

// seekBook holds the seek records, bounded: the records of the seeks the rules in force name,
// the running ones, and the seekHistory most recent others. Guarded by rules.mu.
type seekBook struct {
	records map[seekKey]*seekRecord
	order   []seekKey // oldest first
}

func newSeekBook() *seekBook { return &seekBook{records: map[seekKey]*seekRecord{}} }

// seekAction is what a push asks of the consumers once the rules lock is released.
type seekAction struct {
	status protocol.SeekStatus
	run    *seekRecord // start this seek in the background
	drop   heldDrop
}

// heldDrop asks to drop the held messages taken at or before a time (zero: none) of some
// partitions (nil: all): those from before a seek, on the partitions it moved; and to filter
// out the messages before its targets inside their batch entries.
type heldDrop struct {
	before     time.Time
	partitions []int32
	positions  []protocol.SeekPosition
}

func (d heldDrop) apply(consumers []Consumer) {
	if d.before.IsZero() {
		return
	}
	for _, c := range consumers {
		c.DropHeldOf(d.before, d.partitions)
		// The positions were validated when decoded, or come from this agent's own seek.
		_ = c.FilterSeekTargets(d.positions)
	}
}

// take records the seek part of a push and decides what to do:
//   - an executor push starts the seek once (single flight: the record is created under the
//     lock before the seek starts, so concurrent pushes see it running);
//   - any other push only notes the announcement, dropping nothing;
//   - a push saying the seek succeeded makes an agent that did not run it drop the messages
//     it held from before the announcement, once; a push saying it moved only some
//     partitions, the messages of those. An agent that first hears of the seek through that
//     notice keeps what it holds: it cannot tell old messages from new ones.
//
// A seek that moved nothing drops nothing anywhere: the executor's consumer is delivered
// from the unchanged cursors and the others were never told a cursor moved.
func (b *seekBook) take(uid string, req *protocol.SeekRequest, consumers int, now time.Time) seekAction {
	key := seekKey{uid: uid, id: req.ID}
	rec, known := b.records[key]
	if !known {
		rec = &seekRecord{status: protocol.SeekStatus{ID: req.ID, State: protocol.SeekObserved}, announced: now}
		b.records[key] = rec
		b.order = append(b.order, key)
	}
	var action seekAction
	switch {
	case req.Succeeded || len(req.MovedPartitions) > 0:
		if rec.executor {
			break // its own run drops what the pod's other consumers held (finish)
		}
		if !rec.settled && known {
			action.drop = heldDrop{before: rec.announced, positions: req.Positions}
			if !req.Succeeded {
				action.drop.partitions = req.MovedPartitions
			}
		}
		rec.settled = true
	case req.Execute && !rec.executor && !rec.settled:
		rec.executor = true
		if consumers == 0 {
			rec.status = failed(req.ID, protocol.SeekNoConsumer, "no consumer in this pod matches the flow's subscription and topic")
		} else {
			rec.status.State = protocol.SeekRunning
			action.run = rec
		}
	}
	action.status = rec.status
	return action
}

// finish stores the result of a seek this agent ran and tells which messages its other
// matched consumers hold from before it: none when no cursor moved.
func (b *seekBook) finish(rec *seekRecord, status protocol.SeekStatus) heldDrop {
	rec.status = status
	succeeded := status.State == protocol.SeekSucceeded
	if rec.settled || (!succeeded && len(status.Positions) == 0) {
		return heldDrop{}
	}
	rec.settled = true
	drop := heldDrop{before: rec.announced, positions: status.Positions}
	if !succeeded {
		drop.partitions = movedPartitions(status.Positions)
	}
	return drop
}

func movedPartitions(positions []protocol.SeekPosition) []int32 {
	out := make([]int32, 0, len(positions))
	for _, p := range positions {
		out = append(out, p.Partition)
	}
	return out
}

// prune keeps the records of live seeks and running ones, and the seekHistory newest others.
func (b *seekBook) prune(live map[seekKey]bool) {
	spare := 0
	for i := len(b.order) - 1; i >= 0; i-- {
		key := b.order[i]
		if live[key] || b.records[key].status.State == protocol.SeekRunning {
			continue
		}
		if spare++; spare > seekHistory {
			delete(b.records, key)
		}
	}
	kept := b.order[:0]
	for _, key := range b.order {
		if b.records[key] != nil {
			kept = append(kept, key)
		}
	}
	clear(b.order[len(kept):])
	b.order = kept
}

func failed(id, reason, message string) protocol.SeekStatus {
	return protocol.SeekStatus{ID: id, State: protocol.SeekFailed, Reason: reason, Error: message}
}

// executeSeek moves the cursors with the first matched consumer, under ctx.
func executeSeek(ctx context.Context, seek *protocol.SeekRequest, consumer Consumer) protocol.SeekStatus {
	targets := seek.Partitions
	if seek.Index != nil {
		targets = []protocol.PartitionIndex{{Partition: -1, Index: *seek.Index}}
	}
	result, err := consumer.SeekPartitionsByIndex(ctx, targets)
	var status protocol.SeekStatus
	switch {
	case err == nil:
		status = protocol.SeekStatus{ID: seek.ID, State: protocol.SeekSucceeded}
	case errors.Is(err, agent.ErrSeekPartial):
		status = failed(seek.ID, protocol.SeekPartiallyApplied, err.Error())
	case errors.Is(err, agent.ErrIndexMetadataDisabled):
		status = failed(seek.ID, protocol.SeekIndexMetadataDisabled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		status = failed(seek.ID, protocol.SeekTimedOut, err.Error())
	default:
		status = failed(seek.ID, protocol.SeekError, err.Error())
	}
	if result != nil {
		// The truth whatever the outcome: which cursors moved, and which did not.
		status.Positions, status.Failed = result.Positions, result.Failed
	}
	return status
}
