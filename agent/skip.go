package agent

import (
	"fmt"
	"maps"
	"sync/atomic"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// The seek filter.
//
// A seek by index to a message inside a batch entry resets the cursor to the entry: the broker
// has no position between the messages of an entry (a reset's batch index is kept only where
// the broker deletes at batch-index level, off by default), so it sends the whole entry, and
// sends it again whenever the entry is still unacknowledged and the consumer reconnects, nacks
// one of its messages, or is stopped and run again. The messages before the target are never
// the application's: the gate acknowledges them (so that the entry can be acknowledged once the
// application has acknowledged the rest) and drops them, every time they come.
//
// So the filter outlives the target's arrival: it lasts until the cursor moves again (another
// seek by this consumer, or dropHeld after a seek another consumer ran) or the consumer closes.
// Consumers that did not run the seek take the same filter when told where the cursors moved
// (filterSeekTargets): on Shared and Key_Shared the broker may send the entry to any of them.
// The cost is one atomic load per message; a filter matches only messages of the target's
// entry, so it never drops anything the seek did not mean to skip. A cursor reset made outside
// subflow back past that entry would still see those few messages skipped, as the client's own
// Seek would skip (and acknowledge) everything up to its target after every reconnect.

// skipFilter drops the messages before a seek target inside its batch entry.
type skipFilter struct {
	// from is where the cursor was put: the target's entry, or the first chunk of a chunked
	// message the target lies inside (resolution.cursor).
	from position
	// The target: messages from `from` up to, not including, message batch of this entry are
	// acked and skipped (for a chunked message, by the position of its last chunk).
	ledger, entry int64
	batch         int32
	// stale, when set, drops messages before from too, unacknowledged, until one at or after
	// from arrives (then it clears). Only a consumer that did not run the seek needs it: a
	// reset disconnects it and its client empties its receiver queue, but a batch entry its
	// dispatcher already had in hand arrives afterwards, from before the new cursor.
	stale *atomic.Bool
}

// before reports whether a message at (ledger, entry, batch) lies from f.from up to the target.
// A message that is not in a batch entry has batch index -1: it is the entry's only message.
func (f skipFilter) before(ledger, entry int64, batch int32) bool {
	if ledger < f.from.ledger || (ledger == f.from.ledger && entry < f.from.entry) {
		return false
	}
	batch = max(batch, 0)
	switch {
	case ledger != f.ledger:
		return ledger < f.ledger
	case entry != f.entry:
		return entry < f.entry
	}
	return batch < f.batch
}

// skipSet holds one filter per partition (0 for a non-partitioned topic, as the client numbers
// it). Never changed once published: setSkips replaces it.
type skipSet map[int32]skipFilter

// setSkips publishes the filters of a seek; an empty set removes the filter. mu is held.
func (g *gate) setSkips(s skipSet) {
	if len(s) == 0 {
		g.skips.Store(nil)
		return
	}
	g.skips.Store(&s)
}

// currentSkips is the published filter set, nil when none.
func (g *gate) currentSkips() skipSet {
	if s := g.skips.Load(); s != nil {
		return *s
	}
	return nil
}

// after is the filter set once a seek moved the given cursors: a moved partition takes the
// seek's filter (or none), one that did not move keeps the filter it had.
func (s skipSet) after(moved movedCursors) skipSet {
	set := partitionSet{}
	for p := range moved.partitions {
		set[max(p, 0)] = true
	}
	out := s.without(set)
	maps.Copy(out, moved.skips)
	return out
}

// without is the filter set less the filters of the given partitions (nil: all of them), for
// a seek another agent ran.
func (s skipSet) without(partitions partitionSet) skipSet {
	out := skipSet{}
	if partitions != nil {
		for p, f := range s {
			if !partitions.has(p) {
				out[p] = f
			}
		}
	}
	return out
}

func beforeCursor(from position, id pulsar.MessageID) bool {
	return id.LedgerID() < from.ledger || (id.LedgerID() == from.ledger && id.EntryID() < from.entry)
}

// parseTarget reads a seek position: its message id, "ledger:entry:partition:batch", and the
// cursor, "ledger:entry", when it was put before the target.
func parseTarget(p protocol.SeekPosition) (skipFilter, error) {
	var f skipFilter
	var partition int32
	if _, err := fmt.Sscanf(p.MessageID, "%d:%d:%d:%d", &f.ledger, &f.entry, &partition, &f.batch); err != nil {
		return skipFilter{}, fmt.Errorf("agent: seek position %q: want ledger:entry:partition:batch", p.MessageID)
	}
	f.from = position{ledger: f.ledger, entry: f.entry}
	if p.Cursor != "" {
		if _, err := fmt.Sscanf(p.Cursor, "%d:%d", &f.from.ledger, &f.from.entry); err != nil {
			return skipFilter{}, fmt.Errorf("agent: seek cursor %q: want ledger:entry", p.Cursor)
		}
	}
	return f, nil
}

// active reports whether the filter drops anything: a target inside a batch entry, or a cursor
// put before the target.
func (f skipFilter) active() bool {
	return f.batch > 0 || f.from != position{ledger: f.ledger, entry: f.entry}
}

// skipBeforeTarget reports whether cm lies before a seek target inside the target's batch
// entry, and then acknowledges it through the consumer that received it. Lock-free: every
// take calls it.
func (g *gate) skipBeforeTarget(cm pulsar.ConsumerMessage) bool {
	s := g.skips.Load()
	if s == nil || cm.Message == nil {
		return false
	}
	id := cm.Message.ID()
	f, ok := (*s)[id.PartitionIdx()]
	if !ok {
		return false
	}
	if f.stale != nil && f.stale.Load() {
		if beforeCursor(f.from, id) {
			return true // left over from before the seek: the broker no longer counts it unacked
		}
		f.stale.Store(false)
	}
	if !f.before(id.LedgerID(), id.EntryID(), id.BatchIdx()) {
		return false
	}
	if cm.Consumer != nil {
		_ = cm.Consumer.AckID(id)
	}
	return true
}
