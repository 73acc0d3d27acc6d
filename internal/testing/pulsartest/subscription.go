package pulsartest

import (
	"cmp"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

type subType = pb.CommandSubscribe_SubType

// subscription is a cursor over its topic plus the consumers it dispatches
// to. All of it is guarded by the topic's mutex.
type subscription struct {
	t       *topic
	name    string
	kind    subType
	durable bool

	markDelete int              // every offset below is acknowledged
	readPos    int              // next offset never dispatched since the last reset
	acked      map[int]struct{} // acknowledged offsets at or above markDelete
	owner      map[int]*consumer
	replay     []int       // sorted offsets to dispatch again before readPos
	replayHash map[int]int // sticky key hash -> entries of it in replay (Key_Shared ordering)
	redelivery map[int]uint32

	consumers    []*consumer       // in join order
	active       *consumer         // Exclusive and Failover
	selector     keySharedSelector // Key_Shared
	switching    bool              // Failover: waiting activeConsumerFailoverDelay before dispatching to a new active consumer
	resetting    bool              // a reset is disconnecting the active consumer: no election (closeFuture is set)
	blocked      bool              // maxUnackedMessagesPerSubscription reached (blockedDispatcherOnUnackedMsgs)
	totalPermits int64             // dispatcher total: sum of consumer permits minus their pending FLOW updates
	dispatched   int64             // messages
	ackedMsgs    int64
	nextShared   int
	expired      int64 // entries skipped by message TTL (totalMsgExpired)
	lastExpire   int64 // ms of the last expiry that moved the cursor (lastExpireTimestamp)
	created      time.Time
	// heldRead: a read was waiting for entries when the topic was terminated; it never
	// completes, and the dispatcher reads nothing more until the last consumer leaves
	// (cancelPendingRead). staleRead: a read at the end of the terminated topic failed
	// (NoMoreEntriesToReadException) and left its op waiting in the cursor, so every later
	// read waits on it (ManagedCursorImpl.checkForNewEntries, ConcurrentWaitCallbackException).
	heldRead, staleRead bool
}

// consumer is one SUBSCRIBE on one connection.
type consumer struct {
	sub            *subscription
	conn           *conn
	id             uint64
	name           string
	priority       int32
	permits        int64
	pendingFlow    int64         // FLOW permits not yet applied to the dispatcher total
	blockedPermits int64         // FLOW permits received while blocked on unacked messages
	blocked        bool          // maxUnackedMessagesPerConsumer reached (blockedConsumerOnUnackedMsgs)
	unacked        map[int]int32 // offset -> messages in the entry
	unackedMsgs    int64
	hashes         map[int]int // sticky key hash -> unacked entries (Key_Shared draining)
	dispatched     int64
	removed        bool
	metadata       map[string]string // SUBSCRIBE metadata (ConsumerOptions.Properties)
}

func newSubscription(t *topic, name string, kind subType, durable bool, start int) *subscription {
	s := &subscription{
		t: t, name: name, kind: kind, durable: durable,
		markDelete: start, readPos: start,
		acked: map[int]struct{}{}, owner: map[int]*consumer{}, redelivery: map[int]uint32{}, replayHash: map[int]int{},
		created: t.b.now(),
	}
	return s
}

// waitingForEntries tells whether the dispatcher has a read waiting for new
// entries on the cursor (ManagedCursorImpl.waitingReadOp, the topic's
// waitingCursorsCount): a consumer could take entries and there are none.
func (s *subscription) waitingForEntries() bool {
	if s.readPos < len(s.t.entries) || len(s.replay) > 0 {
		return false
	}
	if !s.individualAck() {
		return s.active != nil && !s.switching && s.active.permits > 0
	}
	return !s.blocked && s.firstAvailablePermits() > 0
}

func (s *subscription) opts() *Options { return &s.t.b.opts }

// individualAck is Subscription.isIndividualAckMode: only Shared and
// Key_Shared track pending acks, unacked limits and redelivery counts.
func (s *subscription) individualAck() bool {
	return s.kind == pb.CommandSubscribe_Shared || s.kind == pb.CommandSubscribe_Key_Shared
}

func (s *subscription) isAcked(off int) bool {
	if off < s.markDelete {
		return true
	}
	_, ok := s.acked[off]
	return ok
}

func (s *subscription) deliver(c *consumer, off int) {
	e := s.t.entries[off]
	n := int64(e.messages)
	c.permits -= n
	s.totalPermits -= n
	c.unacked[off] = e.messages
	c.unackedMsgs += n
	c.hashes[e.stickyHash]++
	c.dispatched += n
	s.dispatched += n
	s.owner[off] = c
	msg := &pb.CommandMessage{ConsumerId: proto.Uint64(c.id), MessageId: s.t.idOf(off)}
	// Single-active dispatchers use RedeliveryTrackerDisabled: always 0.
	if r := s.redelivery[off]; r > 0 && s.individualAck() {
		msg.RedeliveryCount = proto.Uint32(r)
	}
	cmd := &pb.BaseCommand{Type: pb.BaseCommand_MESSAGE.Enum(), Message: msg}
	if c.conn.entryMetadata {
		c.conn.send(cmd, e.brokerMeta, e.data)
	} else {
		c.conn.send(cmd, e.data)
	}
	s.updateBlocked(c)
}

// forget drops an entry from a consumer's pending acks.
func (s *subscription) forget(c *consumer, off int) {
	n, ok := c.unacked[off]
	if !ok {
		return
	}
	delete(c.unacked, off)
	c.unackedMsgs -= int64(n)
	h := s.t.entries[off].stickyHash
	if c.hashes[h]--; c.hashes[h] <= 0 {
		delete(c.hashes, h)
	}
	delete(s.owner, off)
	s.updateBlocked(c)
}

// giveBack returns a consumer's unacked entry to the subscription. Only a
// nack or ack-timeout redelivery counts (incrementAndGetRedeliveryCount); a
// closed consumer's entries are re-queued without counting.
func (s *subscription) giveBack(c *consumer, off int, count bool) {
	if _, ok := c.unacked[off]; !ok {
		return
	}
	s.forget(c, off)
	if s.isAcked(off) {
		return
	}
	if count {
		s.redelivery[off]++
	}
	s.addReplay(off)
}

func (s *subscription) addReplay(off int) {
	if i, found := slices.BinarySearch(s.replay, off); !found {
		s.replay = slices.Insert(s.replay, i, off)
		s.replayHash[s.t.entries[off].stickyHash]++
	}
}

func (s *subscription) removeReplay(off int) {
	if i, found := slices.BinarySearch(s.replay, off); found {
		s.replay = slices.Delete(s.replay, i, i+1)
		h := s.t.entries[off].stickyHash
		if s.replayHash[h]--; s.replayHash[h] <= 0 {
			delete(s.replayHash, h)
		}
	}
}

func (s *subscription) clearReplay() {
	s.replay = nil
	s.replayHash = map[int]int{}
}

func (s *subscription) ack(off int) {
	if off < 0 || off >= len(s.t.entries) || s.isAcked(off) {
		return
	}
	if c := s.owner[off]; c != nil {
		s.forget(c, off)
	}
	s.removeReplay(off)
	delete(s.redelivery, off)
	s.acked[off] = struct{}{}
	s.ackedMsgs += int64(s.t.entries[off].messages)
	for {
		if _, ok := s.acked[s.markDelete]; !ok {
			break
		}
		delete(s.acked, s.markDelete)
		s.markDelete++
	}
	if s.readPos < s.markDelete {
		s.readPos = s.markDelete // expiry and acks can move the cursor past the read position
	}
}

// backlog counts entries not yet acknowledged, like msgBacklog.
func (s *subscription) backlog() int64 {
	return int64(len(s.t.entries) - s.markDelete - len(s.acked))
}

// flow handles a FLOW. Consumer.flowPermits: while the consumer is blocked on
// unacked messages the permits are put aside. Shared and Key_Shared apply
// the dispatcher total later, on the topic's dispatch lane, as the fixed
// Java broker does; until then they are pending on the consumer.
func (s *subscription) flow(c *consumer, permits uint32) {
	if c.removed {
		return // a FLOW that raced with removal must not reach the total
	}
	if s.individualAck() && c.blocked {
		c.blockedPermits += int64(permits)
		return
	}
	s.grant(c, int64(permits))
}

func (s *subscription) grant(c *consumer, n int64) {
	c.permits += n
	if !s.individualAck() {
		s.totalPermits += n
		s.dispatch()
		return
	}
	c.pendingFlow += n
	t := s.t
	t.lane.submit(func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		c.pendingFlow -= n
		if !c.removed && slices.Contains(s.consumers, c) {
			s.totalPermits += n
		}
		s.dispatch()
	})
}

// disconnect removes a consumer; notify sends CLOSE_CONSUMER so the client
// reconnects. Its unacked messages return to the subscription.
func (s *subscription) disconnect(c *consumer, notify bool) {
	if c.removed {
		return
	}
	c.removed = true
	// Only the balance the dispatcher knows of leaves the total: permits
	// whose FLOW update is still queued were never added to it.
	if s.t.b.legacyPermitRemoval {
		s.totalPermits -= c.permits
	} else {
		s.totalPermits -= c.permits - c.pendingFlow
	}
	s.consumers = slices.DeleteFunc(s.consumers, func(x *consumer) bool { return x == c })
	for _, off := range sortedOffsets(c.unacked) {
		s.giveBack(c, off, false)
	}
	if s.individualAck() && len(s.consumers) == 0 {
		// PersistentDispatcherMultipleConsumers.clearComponentsAfterRemovedAllConsumers:
		// the last consumer gone, the replay queue and the redelivery
		// counts are dropped and reads start again at the mark-delete
		// position, so the next consumer sees redelivery count 0.
		s.clearReplay()
		s.redelivery = map[int]uint32{}
		s.readPos = s.markDelete
	}
	if len(s.consumers) == 0 {
		s.heldRead = false // cancelPendingRead: the waiting read is cancelled with the last consumer
	}
	c.conn.mu.Lock()
	if c.conn.consumers[c.id] == c {
		delete(c.conn.consumers, c.id)
	}
	c.conn.mu.Unlock()
	if notify {
		c.conn.send(&pb.BaseCommand{
			Type:          pb.BaseCommand_CLOSE_CONSUMER.Enum(),
			CloseConsumer: &pb.CommandCloseConsumer{ConsumerId: proto.Uint64(c.id), RequestId: proto.Uint64(^uint64(0))},
		})
	}
	s.membershipChanged()
	if !s.durable && len(s.consumers) == 0 {
		delete(s.t.subs, s.name)
	}
}

// membershipChanged re-selects after a consumer joined or left.
func (s *subscription) membershipChanged() {
	switch s.kind {
	case pb.CommandSubscribe_Key_Shared:
		if s.opts().KeySharedHashRanges {
			r, _ := s.selector.(*keyHashRanges)
			if r == nil {
				r = &keyHashRanges{}
				s.selector = r
			}
			r.sync(s.consumers)
		} else {
			s.selector = buildKeySharedRing(s.consumers)
		}
	case pb.CommandSubscribe_Exclusive, pb.CommandSubscribe_Failover:
		if len(s.consumers) == 0 {
			s.active = nil
		} else if !s.resetting {
			s.electActive()
		}
	}
	s.updateBlocked(nil)
}

func sortedOffsets(m map[int]int32) []int {
	out := make([]int, 0, len(m))
	for off := range m {
		out = append(out, off)
	}
	sort.Ints(out)
	return out
}

// electActive is AbstractDispatcherSingleActiveConsumer.pickAndScheduleActiveConsumer:
// consumers sorted by priority level then name; among those of the highest
// priority, partition index mod count on a partition, else a hash ring of
// the names probed with the topic name (so join order does not matter). It
// returns whether the active consumer changed.
func (s *subscription) electActive() bool {
	sorted := slices.Clone(s.consumers)
	slices.SortStableFunc(sorted, func(a, b *consumer) int {
		if a.priority != b.priority {
			return cmp.Compare(a.priority, b.priority)
		}
		return strings.Compare(a.name, b.name)
	})
	n := 0
	for n < len(sorted) && sorted[n].priority == sorted[0].priority {
		n++
	}
	next := sorted[failoverIndex(sorted, n, int(s.t.partition), s.t.name.full)]
	if next == s.active {
		return false
	}
	s.active = next
	s.scheduleReadOnActive()
	return true
}

// scheduleReadOnActive is PersistentDispatcherSingleActiveConsumer.scheduleReadOnActiveConsumer:
// rewind the cursor so the new active consumer gets every unacked message,
// notify the consumers, and read. A Failover subscription does this only
// after activeConsumerFailoverDelayTimeMillis, and dispatches nothing meanwhile.
func (s *subscription) scheduleReadOnActive() {
	delay := s.opts().ActiveConsumerFailoverDelay
	if s.kind != pb.CommandSubscribe_Failover || delay <= 0 {
		s.activate()
		return
	}
	if s.switching {
		return
	}
	s.switching = true
	time.AfterFunc(delay, func() {
		s.t.mu.Lock()
		defer s.t.mu.Unlock()
		s.switching = false
		s.activate()
	})
}

func (s *subscription) activate() {
	s.rewind()
	if s.kind == pb.CommandSubscribe_Failover && s.active != nil {
		for _, c := range s.consumers {
			s.notifyActive(c)
		}
	}
	s.dispatch()
}

func (s *subscription) notifyActive(c *consumer) {
	c.conn.send(&pb.BaseCommand{
		Type:                 pb.BaseCommand_ACTIVE_CONSUMER_CHANGE.Enum(),
		ActiveConsumerChange: &pb.CommandActiveConsumerChange{ConsumerId: proto.Uint64(c.id), IsActive: proto.Bool(c == s.active)},
	})
}

// rewind is ManagedCursor.rewind: read again from the mark-delete position;
// whatever was dispatched and not acknowledged goes out again.
func (s *subscription) rewind() {
	for _, c := range s.consumers {
		for off := range c.unacked {
			s.forget(c, off)
		}
	}
	s.owner = map[int]*consumer{}
	s.clearReplay()
	s.readPos = s.markDelete
}

// resetCursor moves the subscription so that off is read next, as a seek or
// reset-cursor does. PersistentSubscription.resetCursor calls
// dispatcher.disconnectActiveConsumers(true): a Shared or Key_Shared
// dispatcher closes every consumer, a single-active one
// (AbstractDispatcherSingleActiveConsumer.disconnectActiveConsumers) only the
// ACTIVE consumer; a Failover standby stays connected, unaware. While the
// reset runs the dispatcher does not elect another active consumer. It
// returns the connections of the consumers it closed: the reset is answered
// once their CLOSE_CONSUMER frames are written.
func (s *subscription) resetCursor(off int) []*conn {
	var closed []*conn
	if s.individualAck() {
		for _, c := range slices.Clone(s.consumers) {
			s.disconnect(c, true)
			closed = append(closed, c.conn)
		}
	} else if c := s.active; c != nil {
		s.resetting = true
		s.disconnect(c, true)
		s.resetting = false
		s.active = nil
		closed = append(closed, c.conn)
	}
	s.markDelete, s.readPos = off, off
	s.acked = map[int]struct{}{}
	s.owner = map[int]*consumer{}
	s.clearReplay()
	s.redelivery = map[int]uint32{}
	for _, c := range s.consumers {
		c.unacked, c.unackedMsgs, c.hashes = map[int]int32{}, 0, map[int]int{}
	}
	return closed
}

// removeConsumer handles a consumer that went away with its connection or
// by a client CLOSE_CONSUMER.
func (t *topic) removeConsumer(c *consumer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := c.sub
	s.disconnect(c, false)
	s.dispatch()
}

func (c *conn) handleSubscribe(req *pb.CommandSubscribe) {
	reqID := req.GetRequestId()
	tn, ok := c.clientTopic(reqID, req.GetTopic(), "subscribe to")
	if !ok {
		return
	}
	if existing := c.consumer(req.GetConsumerId()); existing != nil {
		c.sendSuccess(reqID) // a retried SUBSCRIBE for a consumer that exists
		return
	}
	t := c.b.getTopic(tn.full, true)
	t.mu.Lock()
	cons, code, msg := t.subscribe(c, req)
	holder := t.exclusiveHolder(req.GetSubscription())
	t.mu.Unlock()
	if cons == nil && code == pb.ServerError_ConsumerBusy && holder != nil && holder != c {
		// AbstractDispatcherSingleActiveConsumer.addConsumer: before refusing a second
		// Exclusive consumer, the broker checks that the holder's connection is alive and
		// closes it if not, so a client that reconnects before its old connection is noticed
		// gone is not refused (pulsar-client-go v0.20 and later give up on ConsumerBusy).
		go func() {
			if !holder.alive() {
				holder.close()
				<-holder.gone // whoever closes it, its consumers are removed first
				t.mu.Lock()
				cons, code, msg = t.subscribe(c, req)
				t.mu.Unlock()
			}
			c.answerSubscribe(reqID, cons, code, msg)
		}()
		return
	}
	c.answerSubscribe(reqID, cons, code, msg)
}

func (c *conn) answerSubscribe(reqID uint64, cons *consumer, code pb.ServerError, msg string) {
	if cons == nil {
		c.sendError(reqID, code, msg)
		return
	}
	c.sendSuccess(reqID)
}

// exclusiveHolder is the connection of an Exclusive subscription's consumer, if any; t.mu is
// held.
func (t *topic) exclusiveHolder(sub string) *conn {
	if s := t.subs[sub]; s != nil && s.kind == pb.CommandSubscribe_Exclusive && len(s.consumers) > 0 {
		return s.consumers[0].conn
	}
	return nil
}

// subscribe attaches a consumer; t.mu is held, so an unload running
// meanwhile closes the consumer it adds.
func (t *topic) subscribe(c *conn, req *pb.CommandSubscribe) (*consumer, pb.ServerError, string) {
	if !c.b.owns(t.name.full) {
		return nil, pb.ServerError_ServiceNotReady, c.b.notServedError(t.name)
	}
	s := t.subs[req.GetSubscription()]
	if s == nil {
		start := len(t.entries)
		if req.GetInitialPosition() == pb.CommandSubscribe_Earliest {
			start = 0
		}
		if !req.GetDurable() && req.GetStartMessageId() != nil {
			start = t.offsetForStart(req.GetStartMessageId())
		}
		s = newSubscription(t, req.GetSubscription(), req.GetSubType(), req.GetDurable(), start)
		t.subs[s.name] = s
	}
	if s.kind != req.GetSubType() && len(s.consumers) > 0 {
		return nil, pb.ServerError_ConsumerBusy, "Subscription is of different type"
	}
	s.kind = req.GetSubType()
	if s.kind == pb.CommandSubscribe_Exclusive && len(s.consumers) > 0 {
		return nil, pb.ServerError_ConsumerBusy, "Exclusive consumer is already connected"
	}
	cons := &consumer{
		sub: s, conn: c, id: req.GetConsumerId(), name: req.GetConsumerName(), priority: req.GetPriorityLevel(),
		unacked: map[int]int32{}, hashes: map[int]int{}, metadata: keyValues(req.GetMetadata()),
	}
	c.mu.Lock()
	c.consumers[cons.id] = cons
	c.mu.Unlock()
	if c.isClosed() {
		// The connection went away while subscribing: do not leave a ghost.
		c.mu.Lock()
		delete(c.consumers, cons.id)
		c.mu.Unlock()
		if !s.durable && len(s.consumers) == 0 {
			delete(t.subs, s.name)
		}
		return nil, pb.ServerError_ServiceNotReady, "connection closed"
	}
	s.consumers = append(s.consumers, cons)
	if s.kind == pb.CommandSubscribe_Shared {
		// PersistentDispatcherMultipleConsumers.addConsumer keeps the list sorted by
		// priority level, join order within a level; getNextConsumer walks it.
		slices.SortStableFunc(s.consumers, func(a, b *consumer) int { return cmp.Compare(a.priority, b.priority) })
	}
	if s.individualAck() {
		s.membershipChanged()
	} else if !s.electActive() && s.active != nil {
		// AbstractDispatcherSingleActiveConsumer.addConsumer: the active
		// consumer did not change, so only the newcomer is told who it is.
		s.notifyActive(cons)
	}
	return cons, 0, ""
}

func (c *conn) handleFlow(req *pb.CommandFlow) {
	cons := c.consumer(req.GetConsumerId())
	if cons == nil {
		return
	}
	t := cons.sub.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if cons.removed {
		return
	}
	c.b.recordFlow(Flow{
		Time: time.Now(), Topic: t.name.full, Subscription: cons.sub.name, ConsumerName: cons.name,
		ConsumerID: cons.id, Conn: c.id, Permits: req.GetMessagePermits(),
	})
	cons.sub.flow(cons, req.GetMessagePermits())
}

func (c *conn) handleAck(req *pb.CommandAck) {
	cons := c.consumer(req.GetConsumerId())
	if cons != nil {
		t := cons.sub.t
		t.mu.Lock()
		s := cons.sub
		applied := false // the ack reached the subscription
		for _, id := range req.GetMessageId() {
			applied = applied || req.GetAckType() == pb.CommandAck_Individual || !s.individualAck()
			if len(id.GetAckSet()) > 0 {
				continue // partial batch acks: the entry stays until fully acked
			}
			off, ok := t.offsetOf(id.GetLedgerId(), id.GetEntryId())
			if !ok {
				continue
			}
			if req.GetAckType() == pb.CommandAck_Cumulative {
				// Consumer.messageAcked ignores a cumulative ack on Shared
				// and Key_Shared ("Received cumulative ack on shared
				// subscription, ignoring").
				if s.individualAck() {
					continue
				}
				for i := s.markDelete; i <= off; i++ {
					s.ack(i)
				}
			} else {
				s.ack(off)
			}
		}
		s.dispatch() // acks can unblock consumers and draining hashes
		if applied {
			// PersistentSubscription.acknowledgeMessage: on a terminated topic, an ack that
			// leaves no backlog tells every consumer the end was reached.
			s.checkEndAfterAck()
		}
		t.mu.Unlock()
	}
	if req.RequestId != nil {
		c.send(&pb.BaseCommand{
			Type:        pb.BaseCommand_ACK_RESPONSE.Enum(),
			AckResponse: &pb.CommandAckResponse{ConsumerId: proto.Uint64(req.GetConsumerId()), RequestId: proto.Uint64(req.GetRequestId())},
		})
	}
}

func (c *conn) handleRedeliver(req *pb.CommandRedeliverUnacknowledgedMessages) {
	cons := c.consumer(req.GetConsumerId())
	if cons == nil {
		return
	}
	t := cons.sub.t
	t.mu.Lock()
	defer t.mu.Unlock()
	s := cons.sub
	if !s.individualAck() {
		// PersistentDispatcherSingleActiveConsumer.redeliverUnacknowledgedMessages:
		// only the active consumer may ask, not while a switch is pending;
		// the cursor is rewound, positions are not redelivered one by one.
		if cons == s.active && !s.switching {
			s.heldRead, s.staleRead = false, false // cursor.cancelPendingReadRequest()
			s.rewind()
			s.dispatch()
		}
		return
	}
	ids := req.GetMessageIds()
	if len(ids) == 0 {
		for _, off := range sortedOffsets(cons.unacked) {
			s.giveBack(cons, off, true)
		}
	} else {
		for _, id := range ids {
			if off, ok := t.offsetOf(id.GetLedgerId(), id.GetEntryId()); ok {
				s.giveBack(cons, off, true)
			}
		}
	}
	s.dispatch()
}

func (c *conn) handleSeek(req *pb.CommandSeek) {
	reqID := req.GetRequestId()
	cons := c.consumerOrNotFound(reqID, req.GetConsumerId())
	if cons == nil {
		return
	}
	t := cons.sub.t
	t.mu.Lock()
	var closed []*conn
	switch {
	case req.MessageId != nil:
		closed = cons.sub.resetCursor(t.offsetForStart(req.GetMessageId()))
	case req.MessagePublishTime != nil:
		closed = cons.sub.resetCursor(t.offsetForTime(int64(req.GetMessagePublishTime())))
	default:
		t.mu.Unlock()
		c.sendError(reqID, pb.ServerError_MetadataError, "seek needs a message id or a publish time")
		return
	}
	t.mu.Unlock()
	// The real broker disconnects the subscription's consumers before it
	// answers; the client only resumes after reconnecting.
	awaitFlushed(slices.DeleteFunc(closed, func(x *conn) bool { return x == c }))
	c.sendSuccess(reqID)
}

func (c *conn) handleGetLastMessageID(req *pb.CommandGetLastMessageId) {
	reqID := req.GetRequestId()
	cons := c.consumerOrNotFound(reqID, req.GetConsumerId())
	if cons == nil {
		return
	}
	c.send(&pb.BaseCommand{
		Type: pb.BaseCommand_GET_LAST_MESSAGE_ID_RESPONSE.Enum(),
		GetLastMessageIdResponse: &pb.CommandGetLastMessageIdResponse{
			LastMessageId:              cons.sub.t.lastMessageID(),
			RequestId:                  proto.Uint64(reqID),
			ConsumerMarkDeletePosition: cons.sub.markDeleteID(),
		},
	})
}

// markDeleteID is the subscription's mark-delete position as ServerCnx.handleGetLastMessageId
// answers it (consumer_mark_delete_position, always set): the last entry of the acknowledged
// prefix, or entry -1 of the first ledger when nothing is acknowledged.
func (s *subscription) markDeleteID() *pb.MessageIdData {
	t := s.t
	t.mu.Lock()
	defer t.mu.Unlock()
	id := &pb.MessageIdData{LedgerId: proto.Uint64(0), EntryId: proto.Uint64(^uint64(0))}
	switch {
	case s.markDelete > 0:
		e := t.entries[s.markDelete-1]
		id.LedgerId, id.EntryId = proto.Uint64(e.ledgerID), proto.Uint64(e.entryID)
	case len(t.ledgers) > 0:
		id.LedgerId = proto.Uint64(t.ledgers[0].id)
	}
	return id
}

func (c *conn) handleCloseConsumer(req *pb.CommandCloseConsumer) {
	if cons := c.consumer(req.GetConsumerId()); cons != nil {
		cons.sub.t.removeConsumer(cons)
	}
	c.sendSuccess(req.GetRequestId())
}

func (c *conn) handleUnsubscribe(req *pb.CommandUnsubscribe) {
	reqID := req.GetRequestId()
	cons := c.consumerOrNotFound(reqID, req.GetConsumerId())
	if cons == nil {
		return
	}
	t := cons.sub.t
	t.mu.Lock()
	s := cons.sub
	if len(s.consumers) > 1 && !req.GetForce() {
		t.mu.Unlock()
		c.sendError(reqID, pb.ServerError_MetadataError, "Subscription has active connected consumers")
		return
	}
	for _, other := range slices.Clone(s.consumers) {
		s.disconnect(other, other != cons)
	}
	delete(t.subs, s.name)
	t.mu.Unlock()
	c.sendSuccess(reqID)
}
