package pulsaradmin

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/subflow-dev/subflow/agent/protocol"
)

var (
	// ErrSeekPartial means a seek of a partitioned topic moved some partitions' cursors and
	// not others; its SeekResult tells which.
	ErrSeekPartial = errors.New("agent: the seek moved some partitions and not others")
	// ErrNoAdminURL is returned by a seek by index without an admin URL.
	ErrNoAdminURL = errors.New("agent: seek by index needs an admin URL (the agent's Options.AdminURL, the sidecar's --admin-url)")
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

// ResetByIndex is a seek by index for a subscription whose consumers are not the caller's (the
// protocol sidecar's): it resolves every index on topic, calls beforeReset (if not nil) with
// the positions the cursors are about to take, then resets the subscription's cursors. The
// broker disconnects the subscription's consumers on a reset (on Exclusive and Failover the
// active one), so they subscribe again and are delivered from the new cursors; beforeReset is
// the caller's chance to get ready for that, as the sidecar does to cut the target's batch
// entry. What a client had buffered from before the reset may still reach its application.
func (a *Client) ResetByIndex(ctx context.Context, topic, subscription string, targets []protocol.PartitionIndex, beforeReset func([]protocol.SeekPosition)) (*SeekResult, error) {
	if a == nil {
		return nil, ErrNoAdminURL
	}
	full, err := fullTopicName(topic)
	if err != nil {
		return nil, err
	}
	partitions, err := a.partitionNames(ctx, full)
	if err != nil {
		return nil, err
	}
	plan, result, err := a.Resolve(ctx, full, partitions, targets)
	if err != nil {
		return result, err
	}
	if beforeReset != nil {
		positions := make([]protocol.SeekPosition, len(plan))
		for i, step := range plan {
			positions[i] = step.Position()
		}
		beforeReset(positions)
	}
	moved, failures, errs := a.ResetCursors(ctx, subscription, plan)
	return result, result.Record(plan, moved, failures, errors.Join(errs...))
}

// Resolve plans a seek of targets on topic, whose partitions (or itself) are given, and
// resolves every index before anything moves. The result counts the admin calls made, also
// when a resolution failed.
func (a *Client) Resolve(ctx context.Context, topic string, partitions []string, targets []protocol.PartitionIndex) ([]Step, *SeekResult, error) {
	plan, err := planSeek(targets, partitions, isPartitioned(topic, partitions))
	if err != nil {
		return nil, nil, err
	}
	src := &countingSource{indexSource: a}
	result := &SeekResult{}
	for i := range plan {
		r, err := resolveIndex(ctx, src, plan[i].Topic, plan[i].Index)
		result.Probes = src.probes
		if err != nil {
			return nil, result, fmt.Errorf("agent: resolve index %d on %s: %w", plan[i].Index, plan[i].Topic, err)
		}
		plan[i].res = r
	}
	return plan, result, nil
}

// Record fills the result in from what the resets did and returns the seek's error, which
// wraps ErrSeekPartial when some partitions moved and others did not.
func (r *SeekResult) Record(plan []Step, moved map[int32]bool, failures map[int32]protocol.PartitionFailure, err error) error {
	for _, step := range plan {
		if failure, ok := failures[step.Partition]; ok {
			r.Failed = append(r.Failed, failure)
		} else if moved[step.Partition] {
			r.Positions = append(r.Positions, step.Position())
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

// Step is one partition's part of a seek.
type Step struct {
	Partition int32 // -1 for a non-partitioned topic
	Topic     string
	Index     int64
	res       resolution
}

func planSeek(targets []protocol.PartitionIndex, partitions []string, partitioned bool) ([]Step, error) {
	if len(targets) == 0 {
		return nil, errors.New("agent: seek by index without a target")
	}
	seen := map[int32]bool{}
	plan := make([]Step, 0, len(targets))
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
		step := Step{Partition: t.Partition, Index: t.Index, Topic: partitions[0]}
		if partitioned {
			step.Topic = partitions[t.Partition]
		} else {
			step.Partition = -1
		}
		plan = append(plan, step)
	}
	if !partitioned && len(plan) > 1 {
		return nil, errors.New("agent: a non-partitioned topic takes one index")
	}
	return plan, nil
}

// Position is where the step puts the cursor, as a seek reports it.
func (s Step) Position() protocol.SeekPosition {
	p := protocol.SeekPosition{Partition: s.Partition, Index: s.res.index}
	if !s.res.empty {
		p.MessageID = fmt.Sprintf("%d:%d:%d:%d", s.res.pos.Ledger, s.res.pos.Entry, s.Partition, s.res.batch)
		if c := s.res.cursor; c != nil {
			p.Cursor = fmt.Sprintf("%d:%d", c.Ledger, c.Entry)
		}
	}
	return p
}

// Landing says where a reset of this step lands inside an entry: the cursor goes to from (the
// target's entry, or the first chunk of a chunked message the target lies inside), and the
// message delivered next is message batch of entry target. ok is false when the step moves
// no cursor into an entry: the topic is empty, or the cursor goes past its last entry.
func (s Step) Landing() (from, target Position, batch int32, ok bool) {
	if s.res.empty || s.res.past {
		return Position{}, Position{}, 0, false
	}
	return s.res.resetTo(), s.res.pos, s.res.batch, true
}

// ResetCursors resets each partition's cursor; it returns the partitions whose cursor moved,
// and the failures and errors of the others. An empty topic's cursor has nothing to move and
// counts as moved.
func (a *Client) ResetCursors(ctx context.Context, subscription string, plan []Step) (map[int32]bool, map[int32]protocol.PartitionFailure, []error) {
	var errs []error
	failures := map[int32]protocol.PartitionFailure{}
	moved := map[int32]bool{}
	for _, step := range plan {
		if step.res.empty {
			moved[step.Partition] = true
			continue
		}
		if err := a.resetCursor(ctx, step.Topic, subscription, step.res.resetTo(), step.res.past); err != nil {
			err = fmt.Errorf("agent: reset cursor of %s: %w", step.Topic, err)
			errs = append(errs, err)
			failures[step.Partition] = protocol.PartitionFailure{Partition: step.Partition, Index: step.Index, Error: err.Error()}
			continue
		}
		moved[step.Partition] = true
	}
	return moved, failures, errs
}
