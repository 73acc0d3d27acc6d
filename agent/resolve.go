package agent

import (
	"context"
	"errors"
	"fmt"
)

// position is an entry in a topic or partition.
type position struct{ ledger, entry int64 }

// ledgerSpan is one ledger and how many entries it holds.
type ledgerSpan struct {
	ledger  int64
	entries int64
}

// entryMeta is what the broker's entry metadata tells about one entry: the index of its last
// message and how many messages it holds.
type entryMeta struct{ index, messages int64 }

// firstIndex is the index of the entry's first message.
func (m entryMeta) firstIndex() int64 { return m.index - m.messages + 1 }

// indexSource is the admin API as the resolver needs it.
type indexSource interface {
	ledgers(ctx context.Context, topic string) ([]ledgerSpan, error)
	entryMeta(ctx context.Context, topic string, p position) (entryMeta, error)
	entryByIndex(ctx context.Context, topic string, index int64) (position, error)
}

// resolution is where a seek to an index puts a cursor: the message at batch position batch
// of entry pos is delivered next. batch equals the entry's message count when the cursor goes
// past the entry (the latest position); empty means the topic holds nothing.
type resolution struct {
	pos   position
	batch int32
	index int64 // the index delivered next (A when below the range, B when above)
	empty bool
	past  bool // the latest position: the cursor goes past entry pos
}

// countingSource counts admin calls (probes).
type countingSource struct {
	indexSource
	probes int
}

func (s *countingSource) ledgers(ctx context.Context, topic string) ([]ledgerSpan, error) {
	s.probes++
	return s.indexSource.ledgers(ctx, topic)
}

func (s *countingSource) entryMeta(ctx context.Context, topic string, p position) (entryMeta, error) {
	s.probes++
	return s.indexSource.entryMeta(ctx, topic, p)
}

func (s *countingSource) entryByIndex(ctx context.Context, topic string, index int64) (position, error) {
	s.probes++
	return s.indexSource.entryByIndex(ctx, topic, index)
}

// entryList addresses the entries of a topic's ledgers as one array.
type entryList []ledgerSpan

func (l entryList) total() int64 {
	var n int64
	for _, s := range l {
		n += s.entries
	}
	return n
}

// at returns the k-th entry (0-based) across ledgers; entries of a ledger start at 0.
func (l entryList) at(k int64) position {
	for _, s := range l {
		if k < s.entries {
			return position{ledger: s.ledger, entry: k}
		}
		k -= s.entries
	}
	panic(fmt.Sprintf("agent: entry %d out of range", k))
}

// resolveIndex finds where a seek to index x puts the cursor, with PIP-101 semantics: for
// indexes in [A, B) the message with index x is next; below A means earliest, from B on
// latest. It uses PIP-415 getMessageIdByIndex when the broker has it, else a binary search
// over the ledgers reading each probed entry's index: O(log entries) probes.
func resolveIndex(ctx context.Context, src indexSource, topic string, x int64) (resolution, error) {
	spans, err := src.ledgers(ctx, topic)
	if err != nil {
		return resolution{}, err
	}
	entries := entryList(spans)
	total := entries.total()
	if total == 0 {
		return resolution{empty: true, index: x}, nil
	}
	first, err := src.entryMeta(ctx, topic, entries.at(0))
	if err != nil {
		return resolution{}, err
	}
	if x < first.firstIndex() {
		return resolution{pos: entries.at(0), index: first.firstIndex()}, nil
	}
	lastPos := entries.at(total - 1)
	last, err := src.entryMeta(ctx, topic, lastPos)
	if err != nil {
		return resolution{}, err
	}
	if x > last.index {
		return resolution{pos: lastPos, batch: int32(last.messages), index: last.index + 1, past: true}, nil
	}
	if r, ok, err := lookupIndex(ctx, src, topic, x); err != nil || ok {
		return r, err
	}
	return searchIndex(ctx, src, topic, entries, x, first, last)
}

// lookupIndex tries PIP-415; ok is false when the broker lacks it or answers oddly.
func lookupIndex(ctx context.Context, src indexSource, topic string, x int64) (resolution, bool, error) {
	p, err := src.entryByIndex(ctx, topic, x)
	if errors.Is(err, errIndexLookupUnsupported) {
		return resolution{}, false, nil
	}
	if err != nil {
		return resolution{}, false, err
	}
	if p.ledger < 0 || p.entry < 0 {
		// Pulsar 4.2 answers -1:-1 for an index inside the topic's first entry but its last.
		return resolution{}, false, nil
	}
	m, err := src.entryMeta(ctx, topic, p)
	if err != nil {
		return resolution{}, false, err
	}
	if x < m.firstIndex() || x > m.index {
		return resolution{}, false, nil // not the entry holding x: fall back to searching
	}
	return resolution{pos: p, batch: int32(x - m.firstIndex()), index: x}, true, nil
}

// searchIndex finds the first entry whose index is >= x; first and last are known already.
func searchIndex(ctx context.Context, src indexSource, topic string, entries entryList, x int64, first, last entryMeta) (resolution, error) {
	lo, hi := int64(0), entries.total()-1
	loMeta, hiMeta := first, last
	if loMeta.index >= x {
		hi, hiMeta = lo, loMeta
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		m, err := src.entryMeta(ctx, topic, entries.at(mid))
		if err != nil {
			return resolution{}, err
		}
		if m.index >= x {
			hi, hiMeta = mid, m
		} else {
			lo = mid + 1
		}
	}
	if x < hiMeta.firstIndex() {
		// A gap in the indexes (x is in no entry): the next existing message comes next.
		return resolution{pos: entries.at(hi), index: hiMeta.firstIndex()}, nil
	}
	return resolution{pos: entries.at(hi), batch: int32(x - hiMeta.firstIndex()), index: x}, nil
}
