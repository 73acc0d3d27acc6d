package pulsartest

import (
	"slices"
	"sort"
	"strings"
	"time"
)

// BacklogQuota is BacklogQuotaImpl: a size limit (destination_storage
// quota) or an age limit (message_age quota) and what to do past it.
type BacklogQuota struct {
	LimitSize int64  // bytes; negative means no limit
	LimitTime int    // seconds; 0 or negative means no limit
	Policy    string // consumer_backlog_eviction, producer_request_hold or producer_exception
}

// Backlog quota types and retention policies, as Pulsar spells them.
const (
	QuotaDestinationStorage = "destination_storage"
	QuotaMessageAge         = "message_age"

	ConsumerBacklogEviction = "consumer_backlog_eviction"
	ProducerRequestHold     = "producer_request_hold"
	ProducerException       = "producer_exception"
)

func validQuotaType(t string) bool {
	return t == QuotaDestinationStorage || t == QuotaMessageAge
}

func validQuotaPolicy(p string) bool {
	return p == ConsumerBacklogEviction || p == ProducerRequestHold || p == ProducerException
}

// policies are the namespace and topic policies of the metadata store that
// retention reads. Topic policies are kept by base name: the partitions of
// a partitioned topic share them, as in Pulsar. Guarded by store.mu.
type policies struct {
	namespaceTTL   map[string]int // "tenant/namespace" -> seconds
	topicTTL       map[string]int // topic base name -> seconds
	namespaceQuota map[string]map[string]BacklogQuota
	topicQuota     map[string]map[string]BacklogQuota
}

func newPolicies() policies {
	return policies{
		namespaceTTL: map[string]int{}, topicTTL: map[string]int{},
		namespaceQuota: map[string]map[string]BacklogQuota{}, topicQuota: map[string]map[string]BacklogQuota{},
	}
}

func (tn topicName) namespaceKey() string { return tn.tenant + "/" + tn.namespace }

// defaultQuota is BacklogQuotaManager's defaultQuota.
func (o *Options) defaultQuota() BacklogQuota {
	if o.DefaultBacklogQuota != nil {
		return *o.DefaultBacklogQuota
	}
	return BacklogQuota{LimitSize: -1, LimitTime: -1, Policy: ProducerRequestHold}
}

// appliedTTL is the effective messageTTL in seconds: the topic's, else its
// namespace's, else ttlDurationDefaultInSeconds (HierarchyTopicPolicies).
func (b *Broker) appliedTTL(tn topicName) int {
	st := b.st
	st.mu.Lock()
	defer st.mu.Unlock()
	if v, ok := st.policies.topicTTL[tn.base()]; ok {
		return v
	}
	if v, ok := st.policies.namespaceTTL[tn.namespaceKey()]; ok {
		return v
	}
	return int(b.opts.DefaultMessageTTL / time.Second)
}

// appliedQuota is the effective backlog quota of one type: the topic's, else
// its namespace's, else the broker default.
func (b *Broker) appliedQuota(tn topicName, kind string) BacklogQuota {
	st := b.st
	st.mu.Lock()
	defer st.mu.Unlock()
	if q, ok := st.policies.topicQuota[tn.base()][kind]; ok {
		return q
	}
	if q, ok := st.policies.namespaceQuota[tn.namespaceKey()][kind]; ok {
		return q
	}
	return b.opts.defaultQuota()
}

// ownedTopics are the topics (partitions) this broker serves.
func (b *Broker) ownedTopics() []*topic {
	return slices.DeleteFunc(b.allTopics(), func(t *topic) bool { return !b.owns(t.name.full) })
}

// RunExpiryCheck is one round of BrokerService.checkMessageExpiry over the
// topics this broker owns: PersistentTopic.checkMessageExpiry gives every
// subscription's PersistentMessageExpiryMonitor the applied messageTTL.
func (b *Broker) RunExpiryCheck() {
	now := b.now()
	for _, t := range b.ownedTopics() {
		ttl := b.appliedTTL(t.name)
		if ttl <= 0 {
			continue
		}
		t.mu.Lock()
		for _, s := range t.subs {
			s.expire(now, time.Duration(ttl)*time.Second)
		}
		t.mu.Unlock()
	}
}

// CheckBacklogQuotas is one round of BrokerService.monitorBacklogQuota over
// the topics this broker owns. Only consumer_backlog_eviction acts here; the
// producer_* policies are stored and reported but not enforced.
func (b *Broker) CheckBacklogQuotas() {
	now := b.now()
	for _, t := range b.ownedTopics() {
		size := b.appliedQuota(t.name, QuotaDestinationStorage)
		age := b.appliedQuota(t.name, QuotaMessageAge)
		t.mu.Lock()
		if size.Policy == ConsumerBacklogEviction && t.sizeBacklogExceeded(size) {
			t.dropBacklogForSizeLimit(size)
		}
		if age.Policy == ConsumerBacklogEviction && t.timeBacklogExceeded(age, now) {
			t.dropBacklogForTimeLimit(age, now)
		}
		t.mu.Unlock()
	}
}

// startPeriodicChecks runs both checks at the broker's intervals, as the
// broker's scheduled executors do.
func (b *Broker) startPeriodicChecks() {
	b.every(b.opts.MessageExpiryCheckInterval, b.RunExpiryCheck)
	b.every(b.opts.BacklogQuotaCheckInterval, b.CheckBacklogQuotas)
}

func (b *Broker) every(d time.Duration, f func()) {
	if d <= 0 {
		return
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		tick := time.NewTicker(d)
		defer tick.Stop()
		for {
			select {
			case <-b.stop:
				return
			case <-tick.C:
				f()
			}
		}
	}()
}

// expire is PersistentMessageExpiryMonitor.expireMessages: the cursor is
// mark-deleted up to the newest entry that MessageImpl.isEntryExpired calls
// expired (now > entry timestamp + ttl, the broker timestamp when there is
// one), found from the mark-delete position on. t.mu is held.
func (s *subscription) expire(now time.Time, ttl time.Duration) {
	cutoff := now.Add(-ttl).UnixMilli()
	entries := s.t.entries[s.markDelete:]
	end := s.markDelete + sort.Search(len(entries), func(i int) bool { return s.t.entryTime(entries[i]) >= cutoff })
	if n := s.skipTo(end); n > 0 {
		s.expired += int64(n)
		s.lastExpire = now.UnixMilli()
		s.dispatch()
	}
}

// skipTo mark-deletes every entry before end (ManagedCursor.markDelete /
// skipEntries): they leave the backlog and are never dispatched again;
// copies already sent stay with their consumers, whose acks become no-ops.
// It returns how many backlog entries it removed. t.mu is held.
func (s *subscription) skipTo(end int) int {
	end = min(end, len(s.t.entries))
	if end <= s.markDelete {
		return 0
	}
	before := s.backlog()
	for off := s.markDelete; off < end; off++ {
		if c := s.owner[off]; c != nil {
			s.forget(c, off)
		}
		s.removeReplay(off)
		delete(s.redelivery, off)
		delete(s.acked, off)
	}
	s.markDelete = end
	for {
		if _, ok := s.acked[s.markDelete]; !ok {
			break
		}
		delete(s.acked, s.markDelete)
		s.markDelete++
	}
	s.readPos = max(s.readPos, s.markDelete)
	return int(before - s.backlog())
}

// slowestCursor is ManagedLedgerImpl.getSlowestConsumer: the durable
// subscription with the oldest mark-delete position (ties by name).
func (t *topic) slowestCursor() *subscription {
	var slowest *subscription
	for _, s := range t.subs {
		if !s.durable {
			continue
		}
		if slowest == nil || s.markDelete < slowest.markDelete ||
			(s.markDelete == slowest.markDelete && strings.Compare(s.name, slowest.name) < 0) {
			slowest = s
		}
	}
	return slowest
}

// sizeFrom is the stored size of the entries from offset off on.
func (t *topic) sizeFrom(off int) int64 {
	var n int64
	for _, e := range t.entries[off:] {
		n += int64(len(e.data))
	}
	return n
}

// estimatedBacklogSize is ManagedLedgerImpl.getEstimatedBacklogSize: the
// size after the slowest cursor's mark-delete position (exact here).
func (t *topic) estimatedBacklogSize() int64 {
	s := t.slowestCursor()
	if s == nil {
		return 0
	}
	return t.sizeFrom(s.markDelete)
}

// sizeBacklogExceeded is PersistentTopic.isSizeBacklogExceeded.
func (t *topic) sizeBacklogExceeded(q BacklogQuota) bool {
	return q.LimitSize >= 0 && t.estimatedBacklogSize() >= q.LimitSize
}

// dropBacklogForSizeLimit is BacklogQuotaManager.dropBacklogForSizeLimit:
// aim at 90% of the limit; skip on the slowest cursor the share of its
// backlog entries that the excess is of the backlog size; stop when the
// same cursor is the slowest twice or nothing is left to skip.
func (t *topic) dropBacklogForSizeLimit(q BacklogQuota) {
	target := 0.9 * float64(q.LimitSize)
	size := float64(t.estimatedBacklogSize())
	var previous *subscription
	for size > target {
		slowest := t.slowestCursor()
		if slowest == nil || slowest == previous {
			return
		}
		skip := int((size - target) / size * float64(slowest.backlog()))
		if skip == 0 {
			return
		}
		// skipEntries(n, IndividualDeletedEntries.Include): acknowledged
		// entries count among the n.
		slowest.skipTo(slowest.markDelete + skip)
		slowest.dispatch()
		size = float64(t.estimatedBacklogSize())
		previous = slowest
	}
}

// timeBacklogExceeded is PersistentTopic.checkTimeBacklogExceeded: with
// preciseTimeBasedBacklogQuotaCheck the slowest cursor's oldest unacked
// message is older than limitTime; without it (the default), the ledger
// holding it was closed more than limitTime ago.
func (t *topic) timeBacklogExceeded(q BacklogQuota, now time.Time) bool {
	s := t.slowestCursor()
	if q.LimitTime <= 0 || s == nil || s.markDelete >= len(t.entries) {
		return false
	}
	limit := time.Duration(q.LimitTime) * time.Second
	if t.b.opts.PreciseTimeBasedBacklogQuotaCheck {
		return now.UnixMilli() > t.entryTime(t.entries[s.markDelete])+limit.Milliseconds()
	}
	l := t.ledgerOf(s.markDelete)
	return !l.closed.IsZero() && now.Sub(l.closed) > limit
}

// dropBacklogForTimeLimit is BacklogQuotaManager.dropBacklogForTimeLimit:
// precisely, every subscription expires what is older than 90% of
// limitTime; otherwise the slowest cursor skips each whole closed ledger
// that was closed more than limitTime ago, cursor after cursor.
func (t *topic) dropBacklogForTimeLimit(q BacklogQuota, now time.Time) {
	limit := time.Duration(q.LimitTime) * time.Second
	if t.b.opts.PreciseTimeBasedBacklogQuotaCheck {
		target := time.Duration(int(0.9*float64(q.LimitTime))) * time.Second
		for _, s := range t.subs {
			s.expire(now, target)
		}
		return
	}
	for range len(t.ledgers) * (len(t.subs) + 1) { // each round skips a ledger or stops
		s := t.slowestCursor()
		if s == nil || s.markDelete >= len(t.entries) {
			return
		}
		l := t.ledgerOf(s.markDelete)
		if l.closed.IsZero() || now.Sub(l.closed) <= limit {
			return
		}
		s.skipTo(l.first + l.entries)
		s.dispatch()
	}
}

// ledgerOf returns the ledger holding the entry at offset off.
func (t *topic) ledgerOf(off int) *ledgerInfo {
	i := sort.Search(len(t.ledgers), func(i int) bool { return t.ledgers[i].first+t.ledgers[i].entries > off })
	return &t.ledgers[i]
}

// earliestPublishTime is earliestMsgPublishTimeInBacklog: the entry
// timestamp (Commands.getEntryTimestamp: the broker timestamp, else the
// publish time) of the first entry after the mark-delete position, -1 when
// the backlog is empty (PersistentSubscription.getStatsAsync). It is the
// time message TTL compares, so time + TTL is when the entry may expire.
func (s *subscription) earliestPublishTime() int64 {
	if s.backlog() == 0 {
		return -1
	}
	return s.t.entryTime(s.t.entries[s.markDelete])
}
