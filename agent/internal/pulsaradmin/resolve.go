package pulsaradmin

import (
	"context"
	"errors"
	"fmt"
)

// Position is an entry in a topic or partition.
type Position struct{ Ledger, Entry int64 }

// ledgerSpan is one ledger and how many entries it holds.
type ledgerSpan struct {
	ledger  int64
	entries int64
}

// entryMeta is what the broker tells about one entry: the index of its last message, how many
// messages it holds, and whether it is a chunk of a chunked message.
type entryMeta struct {
	index, messages int64
	chunk           chunkInfo
}

// chunkInfo places an entry in a chunked message; the zero value is an entry of its own.
type chunkInfo struct {
	uuid string // the message's
	id   int32  // 0 for the first chunk
}

// firstIndex is the index of the entry's first message.
func (m entryMeta) firstIndex() int64 { return m.index - m.messages + 1 }

// indexSource is the admin API as the resolver needs it.
type indexSource interface {
	ledgers(ctx context.Context, topic string) ([]ledgerSpan, error)
	entryMeta(ctx context.Context, topic string, p Position) (entryMeta, error)
	entryByIndex(ctx context.Context, topic string, index int64) (Position, error)
}

// resolution is where a seek to an index puts a cursor: the message at batch position batch
// of entry pos is delivered next. batch equals the entry's message count when the cursor goes
// past the entry (the latest position); empty means the topic holds nothing.
type resolution struct {
	pos   Position
	batch int32
	index int64 // the index delivered next (A when below the range, B when above)
	empty bool
	past  bool // the latest position: the cursor goes past entry pos
	// cursor, when set, is where the cursor goes instead of pos: the first chunk of a chunked
	// message the target lies inside (see firstChunks). The entries from cursor up to the
	// target are delivered again and the gate drops what lies before the target.
	cursor *Position
}

// resetTo is the position the cursor is reset to.
func (r resolution) resetTo() Position {
	if r.cursor != nil {
		return *r.cursor
	}
	return r.pos
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

func (s *countingSource) entryMeta(ctx context.Context, topic string, p Position) (entryMeta, error) {
	s.probes++
	return s.indexSource.entryMeta(ctx, topic, p)
}

func (s *countingSource) entryByIndex(ctx context.Context, topic string, index int64) (Position, error) {
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

// ordinal is the inverse of at: p's place across ledgers.
func (l entryList) ordinal(p Position) int64 {
	var k int64
	for _, s := range l {
		if s.ledger == p.Ledger {
			return k + p.Entry
		}
		k += s.entries
	}
	panic(fmt.Sprintf("agent: entry %d:%d is in none of the ledgers", p.Ledger, p.Entry))
}

// at returns the k-th entry (0-based) across ledgers; entries of a ledger start at 0.
func (l entryList) at(k int64) Position {
	for _, s := range l {
		if k < s.entries {
			return Position{Ledger: s.ledger, Entry: k}
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
	r, ok, err := lookupIndex(ctx, src, topic, x)
	if err == nil && !ok {
		r, err = searchIndex(ctx, src, topic, entries, x, first, last)
	}
	if err != nil {
		return resolution{}, err
	}
	return firstChunks(ctx, src, topic, entries, r)
}

// maxChunkWalk bounds how far back firstChunks reads for the first chunks of chunked messages;
// chunkScan how far past the target it looks for messages that started before it.
const (
	maxChunkWalk = 4096
	chunkScan    = 64
)

// firstChunks moves the cursor of r back when the target cuts into chunked messages. A chunked
// message carries the index of its last chunk, so a target inside it makes it the next
// message; but a client that receives a chunk without the message's first one drops it without
// acknowledging it, which loses the message and leaves its chunks in the backlog for good. So
// the cursor goes back to where every chunked message with a chunk at or after it starts there
// or later (producers interleave their chunks); the agent's gate drops, and acknowledges, the
// whole messages that end before the target (agent/skip.go). Messages that started before the
// target are found among its chunkScan following entries, and by walking back from it.
func firstChunks(ctx context.Context, src indexSource, topic string, entries entryList, r resolution) (resolution, error) {
	if r.empty || r.past {
		return r, nil
	}
	target := entries.ordinal(r.pos)
	open, err := startedBefore(ctx, src, topic, entries, target)
	if err != nil {
		return resolution{}, err
	}
	k := target
	for walked := 0; len(open) > 0; walked++ {
		if k == 0 {
			break // the topic's first entries are gone (retention): nothing older to deliver
		}
		if walked == maxChunkWalk {
			return resolution{}, fmt.Errorf("agent: index %d lies inside a chunked message that starts more than %d entries earlier", r.index, maxChunkWalk)
		}
		k--
		m, err := src.entryMeta(ctx, topic, entries.at(k))
		if err != nil {
			return resolution{}, err
		}
		if m.chunk.uuid == "" {
			continue
		}
		if m.chunk.id > 0 {
			open[m.chunk.uuid] = true
		} else {
			delete(open, m.chunk.uuid)
		}
	}
	if k != target {
		at := entries.at(k)
		r.cursor = &at
	}
	return r, nil
}

// startedBefore names the chunked messages that have a chunk among the target entry and the
// chunkScan entries after it, and whose first chunk is not among them.
func startedBefore(ctx context.Context, src indexSource, topic string, entries entryList, target int64) (map[string]bool, error) {
	open, started := map[string]bool{}, map[string]bool{}
	for k := target; k < min(target+chunkScan, entries.total()); k++ {
		m, err := src.entryMeta(ctx, topic, entries.at(k))
		if err != nil {
			return nil, err
		}
		if m.chunk.uuid == "" {
			if k == target {
				return open, nil // not a chunked message: the common case costs one probe
			}
			continue
		}
		if m.chunk.id == 0 {
			started[m.chunk.uuid] = true
		} else if !started[m.chunk.uuid] {
			open[m.chunk.uuid] = true
		}
	}
	return open, nil
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
	if p.Ledger < 0 || p.Entry < 0 {
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
