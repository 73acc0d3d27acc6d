package pulsartest

import (
	"sync"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// dispatchRoundRobinBatch is dispatcherMaxRoundRobinBatchSize.
const dispatchRoundRobinBatch = 20

// dispatch sends what the consumers' permits allow, read by read, the way
// the dispatcher of the subscription's type does.
func (s *subscription) dispatch() {
	if len(s.consumers) == 0 {
		return
	}
	switch s.kind {
	case pb.CommandSubscribe_Shared:
		s.dispatchShared()
	case pb.CommandSubscribe_Key_Shared:
		s.dispatchKeyShared()
	default:
		s.dispatchSingleActive()
	}
	s.checkEndOnRead()
}

// take is one cursor read of up to n entries: the replay queue when it holds
// any (a replay read), else entries never dispatched when normal is true.
func (s *subscription) take(n int, normal bool) []int {
	if out := s.takeReplay(n); len(out) > 0 || !normal {
		return out
	}
	return s.takeNormal(n)
}

func (s *subscription) takeReplay(n int) []int {
	var out []int
	for len(s.replay) > 0 && len(out) < n {
		off := s.replay[0]
		s.removeReplay(off)
		if !s.isAcked(off) && s.owner[off] == nil {
			out = append(out, off)
		}
	}
	return out
}

func (s *subscription) takeNormal(n int) []int {
	var out []int
	for s.readPos < len(s.t.entries) && len(out) < n {
		off := s.readPos
		s.readPos++
		if !s.isAcked(off) && s.owner[off] == nil {
			out = append(out, off)
		}
	}
	return out
}

// dispatchSingleActive is PersistentDispatcherSingleActiveConsumer.readMoreEntries
// and calculateToRead: while the active consumer has permits, read
// min(permits, dispatcherMaxReadBatchSize) ENTRIES and send them all, so with
// batching one grant delivers far more messages than permits and the
// permits go negative. With preciseDispatcherFlowControl reads are sized by
// messages (modelled as one entry per read).
func (s *subscription) dispatchSingleActive() {
	c := s.active
	if c == nil || s.switching {
		return
	}
	for c.permits > 0 {
		n := min(int(c.permits), s.opts().ReadBatchSize)
		if s.opts().PreciseDispatcherFlowControl {
			n = 1
		}
		offs := s.take(n, true)
		if len(offs) == 0 {
			return
		}
		for _, off := range offs {
			s.deliver(c, off)
		}
	}
}

// availablePermits is what a consumer may still get: its permits capped by
// its room under maxUnackedMessagesPerConsumer; 0 while blocked.
func (s *subscription) availablePermits(c *consumer) int64 {
	if c.blocked {
		return 0
	}
	p := c.permits
	if limit := int64(s.opts().MaxUnackedPerConsumer); limit > 0 {
		p = min(p, max(limit-c.unackedMsgs, 0))
	}
	return p
}

// firstAvailablePermits is PersistentDispatcherMultipleConsumers.getFirstAvailableConsumerPermits.
func (s *subscription) firstAvailablePermits() int64 {
	for _, c := range s.consumers {
		if !c.blocked && c.permits > 0 {
			return c.permits
		}
	}
	return 0
}

// dispatchShared is PersistentDispatcherMultipleConsumers: a read takes
// min(max(total, first consumer's permits), dispatcherMaxReadBatchSize)
// entries; trySendMessagesToConsumers then gives each consumer in turn
// max(min(remaining messages, its permits, round-robin batch) / average
// batch size, 1) entries. What nobody can take goes to the replay queue.
// While the subscription is blocked on unacked messages only replays run.
func (s *subscription) dispatchShared() {
	for {
		first := s.firstAvailablePermits()
		if first <= 0 || max(s.totalPermits, first) <= 0 {
			return
		}
		offs := s.take(min(int(max(s.totalPermits, first)), s.opts().ReadBatchSize), !s.blocked)
		if len(offs) == 0 {
			return
		}
		s.sendShared(offs)
	}
}

func (s *subscription) sendShared(offs []int) {
	remaining := int64(0)
	for _, off := range offs {
		remaining += int64(s.t.entries[off].messages)
	}
	avg := max(remaining/int64(len(offs)), 1)
	i := 0
	for i < len(offs) {
		c := s.nextSharedConsumer()
		if c == nil {
			break
		}
		k := min(remaining, s.availablePermits(c), dispatchRoundRobinBatch)
		end := min(i+int(max(k/avg, 1)), len(offs))
		for _, off := range offs[i:end] {
			s.deliver(c, off)
			remaining -= int64(s.t.entries[off].messages)
		}
		i = end
	}
	for _, off := range offs[i:] {
		s.addReplay(off)
	}
}

// nextSharedConsumer is AbstractDispatcherMultipleConsumers.getNextConsumer
// (ConsumerPrioritySelector.select) over consumers sorted by priority level:
// from the round-robin cursor, an available consumer of a lower level number
// comes first, then the next available one of the cursor's level (wrapping
// within the level), then the first available one of a higher number.
// Available is not blocked and with permits.
func (s *subscription) nextSharedConsumer() *consumer {
	cs := s.consumers
	if len(cs) == 0 {
		return nil
	}
	if s.nextShared >= len(cs) {
		s.nextShared = 0
	}
	available := func(c *consumer) bool { return !c.blocked && c.permits > 0 }
	pick := func(i int) *consumer {
		s.nextShared = i + 1
		return cs[i]
	}
	cur := s.nextShared
	level := cs[cur].priority
	for i := 0; i < cur && cs[i].priority < level; i++ {
		if available(cs[i]) {
			return pick(i)
		}
	}
	first, end := cur, cur
	for first > 0 && cs[first-1].priority == level {
		first--
	}
	for end < len(cs) && cs[end].priority == level {
		end++
	}
	for k := range end - first {
		if i := first + (cur-first+k)%(end-first); available(cs[i]) {
			return pick(i)
		}
	}
	for i := end; i < len(cs); i++ {
		if available(cs[i]) {
			return pick(i)
		}
	}
	return nil
}

// lookAheadLimit is PersistentStickyKeyDispatcherMultipleConsumers.getEffectiveLookAheadLimit.
func (s *subscription) lookAheadLimit() int {
	o := s.opts()
	perConsumer, perSub := o.KeySharedLookAheadPerConsumer, o.KeySharedLookAheadPerSubscription
	limit := perSub
	if perConsumer > 0 {
		limit = perConsumer * len(s.consumers)
		if perSub > 0 && perSub < limit {
			limit = perSub
		}
	}
	if limit <= 0 {
		bySub, byConsumers := o.MaxUnackedPerSubscription, o.MaxUnackedPerConsumer*len(s.consumers)
		if bySub <= 0 {
			bySub = 1 << 31
		}
		if byConsumers <= 0 {
			byConsumers = 1 << 31
		}
		limit = min(bySub, byConsumers)
	}
	return limit
}

// dispatchKeyShared is PersistentStickyKeyDispatcherMultipleConsumers (4.x):
// replays first, then normal reads. filterAndGroupEntriesForDispatching
// sends an entry to the consumer its key hash selects when that consumer
// has permits left in this read (counted per ENTRY) and the hash is neither
// draining on another consumer (PIP-379) nor, on a normal read, waiting in
// the replay queue (ordering); otherwise the entry goes to the replay queue
// and other keys flow on. Normal reads stop for EVERY consumer once the
// replay queue reaches the look-ahead limit.
func (s *subscription) dispatchKeyShared() {
	for s.firstAvailablePermits() > 0 {
		n := min(int(max(s.totalPermits, s.firstAvailablePermits())), s.opts().ReadBatchSize)
		if len(s.replay) > 0 && s.sendKeyShared(s.takeReplay(len(s.replay)), true) > 0 {
			continue
		}
		if s.blocked || len(s.replay) >= s.lookAheadLimit() {
			return
		}
		before := s.readPos
		s.sendKeyShared(s.takeNormal(n), false)
		if s.readPos == before {
			return
		}
	}
}

func (s *subscription) sendKeyShared(offs []int, replay bool) int {
	sent := 0
	left := map[*consumer]int64{}
	for _, off := range offs {
		h := s.t.entries[off].stickyHash
		var c *consumer
		if s.selector != nil {
			c = s.selector.selectConsumer(h)
		}
		if c != nil {
			p, seen := left[c]
			if !seen {
				p = s.availablePermits(c)
			}
			if p > 0 && !s.drainingElsewhere(h, c) && (replay || s.replayHash[h] == 0) {
				left[c] = p - 1
				s.deliver(c, off)
				sent++
				continue
			}
			left[c] = p
		}
		s.addReplay(off)
	}
	return sent
}

// drainingElsewhere: another consumer still has unacked entries of the
// hash, so the hash is draining there (DrainingHashesTracker).
func (s *subscription) drainingElsewhere(hash int, c *consumer) bool {
	for _, other := range s.consumers {
		if other != c && other.hashes[hash] > 0 {
			return true
		}
	}
	return false
}

// updateBlocked applies the unacked-message limits with their hysteresis:
// Consumer.addAndGetUnAckedMsgs blocks a consumer at maxUnackedMessagesPerConsumer
// and unblocks it at half, releasing the permits it received meanwhile;
// PersistentDispatcherMultipleConsumers.addUnAckedMessages does the same for
// the subscription with maxUnackedMessagesPerSubscription.
func (s *subscription) updateBlocked(c *consumer) {
	if !s.individualAck() {
		return
	}
	if limit := int64(s.opts().MaxUnackedPerConsumer); c != nil && limit > 0 {
		switch {
		case !c.blocked && c.unackedMsgs >= limit:
			c.blocked = true
		case c.blocked && c.unackedMsgs <= limit/2:
			c.blocked = false
			if p := c.blockedPermits; p > 0 && !c.removed {
				c.blockedPermits = 0
				s.grant(c, p)
			}
		}
	}
	if limit := int64(s.opts().MaxUnackedPerSubscription); limit > 0 {
		var total int64
		for _, x := range s.consumers {
			total += x.unackedMsgs
		}
		switch {
		case !s.blocked && total >= limit:
			s.blocked = true
		case s.blocked && total < limit/2:
			s.blocked = false
		}
	}
}

// lane runs a topic's deferred dispatcher work in order on one goroutine at
// a time, like the Java dispatcher's topic-worker lane.
type lane struct {
	mu      sync.Mutex
	tasks   []func()
	running bool
	held    bool // tests hold the lane to keep FLOW updates pending
}

func (l *lane) submit(f func()) {
	l.mu.Lock()
	l.tasks = append(l.tasks, f)
	start := !l.running && !l.held
	l.running = l.running || start
	l.mu.Unlock()
	if start {
		go l.run()
	}
}

func (l *lane) run() {
	for {
		l.mu.Lock()
		if len(l.tasks) == 0 || l.held {
			l.running = false
			l.mu.Unlock()
			return
		}
		f := l.tasks[0]
		l.tasks = l.tasks[1:]
		l.mu.Unlock()
		f()
	}
}

// hold stops the lane after its current task; release resumes it.
func (l *lane) hold() {
	l.mu.Lock()
	l.held = true
	l.mu.Unlock()
}

func (l *lane) release() {
	l.mu.Lock()
	l.held = false
	start := !l.running && len(l.tasks) > 0
	l.running = l.running || start
	l.mu.Unlock()
	if start {
		go l.run()
	}
}
