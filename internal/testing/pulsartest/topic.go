package pulsartest

import (
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// entry is one stored SEND: a single message or a batch.
type entry struct {
	ledgerID, entryID uint64
	data              []byte // checksum, metadata and payload exactly as the producer sent them
	brokerMeta        []byte // encoded broker-entry section, sent before data
	messages          int32
	publishTime       int64 // ms, from the message metadata
	brokerTime        int64 // ms, when the broker stored it
	lastIndex         int64 // broker-entry index of the entry's last message
	key               string
	stickyHash        int // Key_Shared hash of the sticky key
	meta              *pb.MessageMetadata
	payload           []byte // data after the metadata
}

type ledgerInfo struct {
	id      uint64
	first   int // offset of its first entry
	entries int
	size    int64
	created time.Time
	closed  time.Time // when it filled up and was closed (LedgerInfo.timestamp); zero while open
}

// topic is one non-partitioned topic or one partition. Its mutex guards the
// storage, the subscriptions and their consumers: dispatch, acks and permit
// accounting of a topic are serialised, which keeps the permit invariant
// exact without the deferred updates the Java broker needs.
type topic struct {
	b         *Broker
	name      topicName
	partition int32

	mu        sync.Mutex
	entries   []*entry
	ledgers   []ledgerInfo
	lastIndex int64
	// indexAtLedgerOpen is the broker-entry index the interceptor stored in
	// the managed ledger's properties when the current ledger was opened.
	indexAtLedgerOpen int64
	size              int64
	subs              map[string]*subscription
	producers         map[*producer]struct{}
	exclusive         *producer        // hasExclusiveProducer / exclusiveProducerName
	waiting           []*producer      // WaitForExclusive producers, in arrival order
	epoch             int64            // topic epoch of exclusive producers; -1 until the first
	terminated        bool             // no more producers (PersistentTopic.terminate)
	lastSeq           map[string]int64 // per producer name, for deduplication across reconnects
	msgIn             int64
	lane              lane // deferred dispatcher updates (FLOW)
}

type producer struct {
	id       uint64
	name     string
	conn     *conn
	t        *topic
	mode     pb.ProducerAccessMode
	epoch    *uint64 // the topic epoch the client had (on a reconnection)
	reqID    uint64  // the PRODUCER request, answered again when a waiting producer is ready
	metadata map[string]string
}

// newTopic opens a topic with its first ledger, as ManagedLedgerImpl does
// when it is created: internal stats list that empty ledger and
// lastConfirmedEntry is (ledger, -1).
func newTopic(b *Broker, tn topicName) *topic {
	return &topic{
		b:                 b,
		name:              tn,
		partition:         int32(tn.partition),
		ledgers:           []ledgerInfo{{id: b.st.nextLedger.Add(1), created: b.now()}},
		lastIndex:         -1,
		epoch:             -1,
		indexAtLedgerOpen: -1,
		subs:              map[string]*subscription{},
		producers:         map[*producer]struct{}{},
		lastSeq:           map[string]int64{},
	}
}

// position of an offset, as a message id.
func (t *topic) idOf(off int) *pb.MessageIdData {
	e := t.entries[off]
	return &pb.MessageIdData{LedgerId: proto.Uint64(e.ledgerID), EntryId: proto.Uint64(e.entryID), Partition: proto.Int32(t.partition)}
}

// offsetAtOrAfter returns the offset of the first entry at or after the
// position; len(entries) when there is none.
func (t *topic) offsetAtOrAfter(ledgerID, entryID uint64) int {
	return sort.Search(len(t.entries), func(i int) bool {
		e := t.entries[i]
		return e.ledgerID > ledgerID || (e.ledgerID == ledgerID && e.entryID >= entryID)
	})
}

// offsetOf returns the offset of the entry at exactly that position.
func (t *topic) offsetOf(ledgerID, entryID uint64) (int, bool) {
	off := t.offsetAtOrAfter(ledgerID, entryID)
	if off < len(t.entries) && t.entries[off].ledgerID == ledgerID && t.entries[off].entryID == entryID {
		return off, true
	}
	return off, false
}

// offsetForStart maps a start or seek message id to the offset to read next;
// the entry of the id itself is included, the client discards what it must.
func (t *topic) offsetForStart(id *pb.MessageIdData) int {
	const latest = uint64(1<<63 - 1)
	switch l := id.GetLedgerId(); {
	case l == ^uint64(0): // earliest
		return 0
	case l >= latest:
		return len(t.entries)
	default:
		return t.offsetAtOrAfter(l, id.GetEntryId())
	}
}

// offsetForTime is the first entry published at or after ms.
func (t *topic) offsetForTime(ms int64) int {
	return sort.Search(len(t.entries), func(i int) bool { return t.entryTime(t.entries[i]) >= ms })
}

// entryTime is the time a seek by time compares, like the Java message
// finder: the broker timestamp when there is one, else the publish time.
func (t *topic) entryTime(e *entry) int64 {
	if e.brokerTime > 0 {
		return e.brokerTime
	}
	return e.publishTime
}

func (t *topic) currentLedger(now time.Time) *ledgerInfo {
	n := len(t.ledgers)
	if n == 0 || t.ledgers[n-1].entries >= t.b.opts.EntriesPerLedger {
		t.openLedger(now)
		n++
	}
	return &t.ledgers[n-1]
}

// openLedger starts a new current ledger; t.mu is held.
func (t *topic) openLedger(now time.Time) {
	t.ledgers = append(t.ledgers, ledgerInfo{id: t.b.st.nextLedger.Add(1), first: len(t.entries), created: now})
	t.indexAtLedgerOpen = t.lastIndex
}

// reopen is the managed ledger closed by an unload and opened again: the
// current ledger is closed (an empty one is dropped) and a new one opened.
// A ledger closed this way records no close timestamp.
func (t *topic) reopen() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n := len(t.ledgers); n > 0 && t.ledgers[n-1].entries == 0 {
		t.ledgers = t.ledgers[:n-1]
	}
	t.openLedger(t.b.now())
}

// append stores a SEND and dispatches it; it returns the entry's id, or
// nil when the sequence id shows a duplicate of an already stored send.
func (t *topic) append(p *producer, send *pb.CommandSend, data []byte) (*pb.MessageIdData, error) {
	meta, payload, err := parseSendPayload(data)
	if err != nil {
		return nil, err
	}
	messages := send.GetNumMessages()
	if meta.NumMessagesInBatch != nil {
		messages = meta.GetNumMessagesInBatch()
	}
	if messages < 1 {
		messages = 1
	}
	now := t.b.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	// MessageDeduplication is off by default (brokerDeduplicationEnabled=false):
	// a resend after a reconnect is then stored again.
	if t.b.opts.Deduplication {
		seq := int64(send.GetSequenceId())
		if last, ok := t.lastSeq[p.name]; ok && seq <= last {
			return nil, nil
		}
		t.lastSeq[p.name] = max(seq, int64(send.GetHighestSequenceId()))
	}
	l := t.currentLedger(now)
	e := &entry{
		ledgerID:    l.id,
		entryID:     uint64(l.entries),
		data:        data,
		messages:    messages,
		publishTime: int64(meta.GetPublishTime()),
		brokerTime:  now.UnixMilli(),
		key:         entryKey(meta),
		stickyHash:  t.b.stickyKeyHashOf([]byte(stickyKey(meta))),
		meta:        meta,
		payload:     payload,
	}
	t.storeLocked(l, e, now)
	for _, s := range t.subs {
		s.dispatch()
	}
	return t.idOf(len(t.entries) - 1), nil
}

// storeLocked appends e to ledger l as the next entry: its broker-entry index and metadata,
// the ledger's rollover, and the topic's counters. Callers hold t.mu and dispatch afterwards.
func (t *topic) storeLocked(l *ledgerInfo, e *entry, now time.Time) {
	t.lastIndex += int64(e.messages)
	e.lastIndex = t.lastIndex
	e.brokerMeta = t.brokerEntryMeta(e)
	l.entries++
	if l.entries >= t.b.opts.EntriesPerLedger {
		l.closed = now // a full ledger is closed at once; the next append opens a new one
	}
	l.size += int64(len(e.data))
	t.size += int64(len(e.data))
	t.msgIn += int64(e.messages)
	t.entries = append(t.entries, e)
}

func (t *topic) brokerEntryMeta(e *entry) []byte {
	m := &pb.BrokerEntryMetadata{BrokerTimestamp: proto.Uint64(uint64(e.brokerTime))}
	if !t.b.opts.DisableIndexMetadata {
		m.Index = proto.Uint64(uint64(e.lastIndex))
	}
	return pb.AppendBrokerEntry(nil, m)
}

// entryKey is the key Key_Shared dispatch hashes: ordering key, else
// partition key (the key-based batcher sets it for a whole batch).
func entryKey(meta *pb.MessageMetadata) string {
	if len(meta.GetOrderingKey()) > 0 {
		return string(meta.GetOrderingKey())
	}
	return meta.GetPartitionKey()
}

// stickyKey is Commands.peekStickyKey: ordering key, else partition key,
// else "NONE_KEY".
func stickyKey(meta *pb.MessageMetadata) string {
	if k := entryKey(meta); k != "" {
		return k
	}
	return noneKey
}

func (t *topic) lastMessageID() *pb.MessageIdData {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.entries) == 0 {
		// ServerCnx.handleGetLastMessageId reads
		// PersistentTopic.getLastDispatchablePosition, which is
		// PositionFactory.EARLIEST (-1:-1) when no entry can be dispatched.
		return &pb.MessageIdData{LedgerId: proto.Uint64(^uint64(0)), EntryId: proto.Uint64(^uint64(0)), Partition: proto.Int32(t.partition)}
	}
	id := t.idOf(len(t.entries) - 1)
	if n := t.entries[len(t.entries)-1].messages; n > 1 {
		id.BatchIndex = proto.Int32(n - 1)
	}
	return id
}

// addProducer registers a producer and returns its last stored sequence id,
// or the error to answer: the broker does not own the topic, a producer of
// that name is already connected, or its access mode is refused. queued means
// a WaitForExclusive producer waits for the exclusive one to go. The
// ownership check is under t.mu so that an unload running meanwhile closes
// the producer. An initial subscription name creates that subscription
// first, if absent (ServerCnx.handleProducer: topic.createSubscription(name,
// InitialPosition.Earliest, ...)): durable, at the topic's first entry,
// whether or not the producer is then admitted.
func (t *topic) addProducer(p *producer, initialSub string) (last int64, queued bool, code pb.ServerError, msg string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !p.conn.b.owns(t.name.full) {
		return 0, false, pb.ServerError_ServiceNotReady, p.conn.b.notServedError(t.name)
	}
	if initialSub != "" && t.subs[initialSub] == nil {
		t.subs[initialSub] = newSubscription(t, initialSub, pb.CommandSubscribe_Exclusive, true, 0)
	}
	if t.terminated {
		return 0, false, pb.ServerError_TopicTerminatedError, topicTerminated + "Topic was already terminated"
	}
	for other := range t.producers {
		if other.name == p.name {
			return 0, false, pb.ServerError_ProducerBusy, fmt.Sprintf("Producer with name '%s' is already connected to topic", p.name)
		}
	}
	if queued, code, msg = t.admit(p); msg != "" || queued {
		return 0, queued, code, msg
	}
	t.producers[p] = struct{}{}
	return t.lastSequence(p), false, 0, ""
}

func (t *topic) lastSequence(p *producer) int64 {
	if last, ok := t.lastSeq[p.name]; ok && t.b.opts.Deduplication {
		return last
	}
	return -1
}

// admit applies the producer's access mode (AbstractTopic.incrementTopicEpochIfNeeded);
// t.mu is held. Shared is refused with ProducerBusy beside an exclusive or waiting
// producer; Exclusive with ProducerFenced beside any producer; ExclusiveWithFencing
// closes the others on the broker side only (Producer.close(true) tells no client: its
// next SEND closes the connection) and fails the waiting ones with ProducerFenced "Fenced
// out"; WaitForExclusive queues behind any producer. A producer reconnecting with a topic
// epoch older than the topic's is fenced, as a new exclusive producer came meanwhile. The
// messages carry the exception's class, as ServerCnx writes them.
func (t *topic) admit(p *producer) (queued bool, code pb.ServerError, msg string) {
	switch p.mode {
	case pb.ProducerAccessMode_Shared:
		if t.exclusive != nil || len(t.waiting) > 0 {
			return false, pb.ServerError_ProducerBusy, producerBusy + "Topic has an existing exclusive producer: " + t.exclusiveName()
		}
		return false, 0, ""
	case pb.ProducerAccessMode_Exclusive:
		if t.exclusive != nil || len(t.waiting) > 0 {
			return false, pb.ServerError_ProducerFenced, producerFenced + "Topic has an existing exclusive producer: " + t.exclusiveName()
		}
		if len(t.producers) > 0 {
			return false, pb.ServerError_ProducerFenced, producerFenced + "Topic has existing shared producers"
		}
	case pb.ProducerAccessMode_ExclusiveWithFencing:
		if t.exclusive != nil || len(t.producers) > 0 {
			waiting := t.waiting
			t.waiting = nil
			for _, w := range waiting {
				w.conn.forgetProducer(w)
				w.conn.sendError(w.reqID, pb.ServerError_ProducerFenced, producerFenced+"Fenced out")
			}
			for other := range t.producers {
				t.removeProducerLocked(other)
				other.conn.forgetProducer(other)
			}
		}
	case pb.ProducerAccessMode_WaitForExclusive:
		if t.exclusive != nil || len(t.producers) > 0 {
			t.waiting = append(t.waiting, p)
			return true, 0, ""
		}
	default:
		return false, pb.ServerError_UnknownError, "Invalid producer access mode: " + p.mode.String()
	}
	if p.epoch != nil && int64(*p.epoch) < t.epoch {
		return false, pb.ServerError_ProducerFenced, producerFenced + fmt.Sprintf("Topic epoch has already moved. Current epoch: %d, Producer epoch: %d", t.epoch, *p.epoch)
	}
	t.takeExclusive(p)
	return false, 0, ""
}

// The prefixes of ServerCnx's error messages for producers the topic refuses: the message of
// the CompletionException, which names the BrokerServiceException it wraps.
const (
	producerFenced  = "org.apache.pulsar.broker.service.BrokerServiceException$ProducerFencedException: "
	producerBusy    = "org.apache.pulsar.broker.service.BrokerServiceException$ProducerBusyException: "
	topicTerminated = "org.apache.pulsar.broker.service.BrokerServiceException$TopicTerminatedException: "
)

// connected tells whether the topic has a producer or a consumer.
func (t *topic) connected() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.producers) > 0 || len(t.waiting) > 0 {
		return true
	}
	for _, s := range t.subs {
		if len(s.consumers) > 0 {
			return true
		}
	}
	return false
}

func (t *topic) isWaiting(p *producer) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Contains(t.waiting, p)
}

func (t *topic) exclusiveName() string {
	if t.exclusive == nil {
		return "null"
	}
	return t.exclusive.name
}

// takeExclusive gives the topic to p: the epoch it reconnects with, else the next one
// (setTopicEpoch, incrementTopicEpoch).
func (t *topic) takeExclusive(p *producer) {
	t.exclusive = p
	if p.epoch != nil {
		t.epoch = int64(*p.epoch)
	} else {
		t.epoch++
	}
}

// topicEpoch is the epoch PRODUCER_SUCCESS carries, absent before any exclusive producer.
func (t *topic) topicEpoch() *uint64 {
	if t.epoch < 0 {
		return nil
	}
	return proto.Uint64(uint64(t.epoch))
}

func (t *topic) removeProducer(p *producer) {
	t.mu.Lock()
	t.removeProducerLocked(p)
	t.mu.Unlock()
	p.conn.forgetProducer(p)
}

// removeProducerLocked is AbstractTopic.removeProducer and handleProducerRemoved: while an
// exclusive producer is registered, any producer's removal ends it and readies the first
// waiting producer. A waiting producer closed before it was ready leaves the queue.
func (t *topic) removeProducerLocked(p *producer) {
	if i := slices.Index(t.waiting, p); i >= 0 {
		t.waiting = slices.Delete(t.waiting, i, i+1)
		return
	}
	if _, ok := t.producers[p]; !ok {
		return
	}
	delete(t.producers, p)
	if t.exclusive == nil {
		return
	}
	t.exclusive = nil
	for len(t.waiting) > 0 {
		next := t.waiting[0]
		t.waiting = t.waiting[1:]
		if next.conn.isClosed() {
			continue
		}
		t.takeExclusive(next)
		t.producers[next] = struct{}{}
		next.conn.producerSuccess(next, t.lastSequence(next), t.topicEpoch(), true)
		return
	}
}

// closeProducerLocked disconnects a producer from the broker side (Producer.disconnect):
// CLOSE_PRODUCER tells the client, SENDs still in flight are ignored.
func (t *topic) closeProducerLocked(p *producer) {
	t.removeProducerLocked(p)
	p.conn.forgetProducer(p)
	p.conn.mu.Lock()
	p.conn.closedProducers[p.id] = struct{}{}
	p.conn.mu.Unlock()
	p.conn.send(&pb.BaseCommand{
		Type:          pb.BaseCommand_CLOSE_PRODUCER.Enum(),
		CloseProducer: &pb.CommandCloseProducer{ProducerId: proto.Uint64(p.id), RequestId: proto.Uint64(^uint64(0))},
	})
}

// terminate is PersistentTopic.terminate: no producer is admitted any more and those
// connected are disconnected (CLOSE_PRODUCER; reconnecting, they are refused with
// TopicTerminatedError). It returns the last entry's id; again on a terminated topic.
func (t *topic) terminate() *pb.MessageIdData {
	t.mu.Lock()
	t.terminated = true
	t.disconnectProducersLocked()
	for _, s := range t.subs { // again on a terminated topic, as ManagedLedgerImpl.asyncTerminate completes again
		s.topicTerminated()
	}
	t.mu.Unlock()
	return t.lastMessageID()
}

func (t *topic) disconnectProducersLocked() {
	for _, p := range slices.Clone(t.waiting) { // before the exclusive one, so none is readied
		t.closeProducerLocked(p)
	}
	for p := range t.producers {
		t.closeProducerLocked(p)
	}
}

// unload closes every producer and consumer of the topic from the broker side.
func (t *topic) unload() {
	t.mu.Lock()
	t.disconnectProducersLocked()
	names := make([]string, 0, len(t.subs))
	for name := range t.subs {
		names = append(names, name)
	}
	t.mu.Unlock()
	for _, name := range names {
		t.closeConsumers(name, func(*consumer) bool { return true })
	}
	t.reopen()
}

// closeConsumers closes the matching consumers of a subscription from the
// broker side; their unacked messages return to the subscription.
func (t *topic) closeConsumers(subName string, match func(*consumer) bool) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.subs[subName]
	if s == nil {
		return 0
	}
	n := 0
	for _, c := range append([]*consumer(nil), s.consumers...) {
		if match(c) {
			s.disconnect(c, true)
			n++
		}
	}
	s.dispatch()
	return n
}

func (t *topic) String() string { return fmt.Sprintf("topic(%s)", t.name.full) }
