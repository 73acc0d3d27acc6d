package pulsartest

import (
	"hash/fnv"
	"slices"
	"sort"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/subflow-dev/subflow/internal/pulsartest/pulsarpb"
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
	replay     []int // sorted offsets to dispatch again before readPos
	redelivery map[int]uint32

	consumers    []*consumer // in join order
	active       *consumer   // Exclusive and Failover
	totalPermits int64       // dispatcher total; equals the sum of consumer permits
	dispatched   int64       // messages
	ackedMsgs    int64
	nextShared   int
}

// consumer is one SUBSCRIBE on one connection.
type consumer struct {
	sub         *subscription
	conn        *conn
	id          uint64
	name        string
	permits     int64
	unacked     map[int]int32 // offset -> messages in the entry
	unackedMsgs int64
	dispatched  int64
	removed     bool
}

func newSubscription(t *topic, name string, kind subType, durable bool, start int) *subscription {
	return &subscription{
		t: t, name: name, kind: kind, durable: durable,
		markDelete: start, readPos: start,
		acked: map[int]struct{}{}, owner: map[int]*consumer{}, redelivery: map[int]uint32{},
	}
}

func (s *subscription) isAcked(off int) bool {
	if off < s.markDelete {
		return true
	}
	_, ok := s.acked[off]
	return ok
}

// dispatch sends what the consumers' permits allow: redeliveries first, then
// entries never dispatched.
func (s *subscription) dispatch() {
	if len(s.consumers) == 0 || !s.anyPermits() {
		return
	}
	if len(s.replay) > 0 {
		kept := s.replay[:0]
		for i, off := range s.replay {
			if s.isAcked(off) || s.owner[off] != nil {
				continue
			}
			c := s.pick(s.t.entries[off])
			if c != nil {
				s.deliver(c, off)
				continue
			}
			if s.kind != pb.CommandSubscribe_Key_Shared {
				// Nobody can take more: keep the rest in order.
				kept = append(kept, s.replay[i:]...)
				break
			}
			kept = append(kept, off)
		}
		s.replay = kept
		if !s.anyPermits() {
			return
		}
	}
	for s.readPos < len(s.t.entries) && s.anyPermits() {
		off := s.readPos
		if s.isAcked(off) || s.owner[off] != nil {
			s.readPos++
			continue
		}
		c := s.pick(s.t.entries[off])
		if c == nil {
			if s.kind != pb.CommandSubscribe_Key_Shared {
				return
			}
			// The key's consumer has no permits: keep the entry for later
			// and let other keys through, as Key_Shared does.
			s.replay = append(s.replay, off)
		} else {
			s.deliver(c, off)
		}
		s.readPos++
	}
}

func (s *subscription) anyPermits() bool {
	for _, c := range s.consumers {
		if c.permits > 0 {
			return true
		}
	}
	return false
}

// pick chooses the consumer for an entry, nil when that consumer has no
// permits.
func (s *subscription) pick(e *entry) *consumer {
	var c *consumer
	switch s.kind {
	case pb.CommandSubscribe_Shared:
		for i := range s.consumers {
			cand := s.consumers[(s.nextShared+i)%len(s.consumers)]
			if cand.permits > 0 {
				s.nextShared = (s.nextShared + i + 1) % len(s.consumers)
				return cand
			}
		}
		return nil
	case pb.CommandSubscribe_Key_Shared:
		h := fnv.New32a()
		_, _ = h.Write([]byte(e.key))
		c = s.consumers[int(h.Sum32()%uint32(len(s.consumers)))]
	default:
		c = s.active
	}
	if c == nil || c.permits <= 0 {
		return nil
	}
	return c
}

func (s *subscription) deliver(c *consumer, off int) {
	e := s.t.entries[off]
	n := int64(e.messages)
	c.permits -= n
	s.totalPermits -= n
	c.unacked[off] = e.messages
	c.unackedMsgs += n
	c.dispatched += n
	s.dispatched += n
	s.owner[off] = c
	msg := &pb.CommandMessage{ConsumerId: proto.Uint64(c.id), MessageId: s.t.idOf(off)}
	if r := s.redelivery[off]; r > 0 {
		msg.RedeliveryCount = proto.Uint32(r)
	}
	cmd := &pb.BaseCommand{Type: pb.BaseCommand_MESSAGE.Enum(), Message: msg}
	if c.conn.entryMetadata {
		c.conn.send(cmd, e.brokerMeta, e.data)
	} else {
		c.conn.send(cmd, e.data)
	}
}

// giveBack returns a consumer's unacked entry to the subscription.
func (s *subscription) giveBack(c *consumer, off int) {
	n, ok := c.unacked[off]
	if !ok {
		return
	}
	delete(c.unacked, off)
	c.unackedMsgs -= int64(n)
	delete(s.owner, off)
	if s.isAcked(off) {
		return
	}
	s.redelivery[off]++
	if i, found := slices.BinarySearch(s.replay, off); !found {
		s.replay = slices.Insert(s.replay, i, off)
	}
}

func (s *subscription) ack(off int) {
	if off < 0 || off >= len(s.t.entries) || s.isAcked(off) {
		return
	}
	if c := s.owner[off]; c != nil {
		c.unackedMsgs -= int64(c.unacked[off])
		delete(c.unacked, off)
		delete(s.owner, off)
	}
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
}

// backlog counts entries not yet acknowledged, like msgBacklog.
func (s *subscription) backlog() int64 {
	return int64(len(s.t.entries) - s.markDelete - len(s.acked))
}

func (s *subscription) flow(c *consumer, permits uint32) {
	if c.removed {
		return // a FLOW that raced with removal must not reach the total
	}
	c.permits += int64(permits)
	s.totalPermits += int64(permits)
	s.dispatch()
}

// disconnect removes a consumer; notify sends CLOSE_CONSUMER so the client
// reconnects. Its unacked messages return to the subscription.
func (s *subscription) disconnect(c *consumer, notify bool) {
	if c.removed {
		return
	}
	c.removed = true
	s.totalPermits -= c.permits
	s.consumers = slices.DeleteFunc(s.consumers, func(x *consumer) bool { return x == c })
	for _, off := range sortedOffsets(c.unacked) {
		s.giveBack(c, off)
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
	if s.active == c {
		s.active = nil
		s.electActive()
	}
	if !s.durable && len(s.consumers) == 0 {
		delete(s.t.subs, s.name)
	}
}

func sortedOffsets(m map[int]int32) []int {
	out := make([]int, 0, len(m))
	for off := range m {
		out = append(out, off)
	}
	sort.Ints(out)
	return out
}

// electActive picks the Failover active consumer like the Java broker:
// consumers sorted by name, index partition mod count.
func (s *subscription) electActive() {
	if len(s.consumers) == 0 {
		s.active = nil
		return
	}
	if s.kind == pb.CommandSubscribe_Exclusive {
		s.active = s.consumers[0]
		return
	}
	sorted := slices.Clone(s.consumers)
	slices.SortStableFunc(sorted, func(a, b *consumer) int {
		switch {
		case a.name < b.name:
			return -1
		case a.name > b.name:
			return 1
		}
		return 0
	})
	idx := 0
	if s.t.partition > 0 {
		idx = int(s.t.partition) % len(sorted)
	}
	next := sorted[idx]
	if next == s.active {
		return
	}
	if old := s.active; old != nil {
		// The new active consumer gets what the old one had not acked.
		for _, off := range sortedOffsets(old.unacked) {
			s.giveBack(old, off)
		}
	}
	s.active = next
	for _, c := range s.consumers {
		c.conn.send(&pb.BaseCommand{
			Type:                 pb.BaseCommand_ACTIVE_CONSUMER_CHANGE.Enum(),
			ActiveConsumerChange: &pb.CommandActiveConsumerChange{ConsumerId: proto.Uint64(c.id), IsActive: proto.Bool(c == next)},
		})
	}
}

// resetCursor moves the subscription so that off is read next, as a seek or
// reset-cursor does, and disconnects its consumers, which reconnect.
func (s *subscription) resetCursor(off int) {
	for _, c := range slices.Clone(s.consumers) {
		c.unacked = map[int]int32{}
		c.unackedMsgs = 0
		s.disconnect(c, true)
	}
	s.markDelete, s.readPos = off, off
	s.acked = map[int]struct{}{}
	s.owner = map[int]*consumer{}
	s.replay = nil
	s.redelivery = map[int]uint32{}
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
	tn, err := parseTopic(req.GetTopic())
	if err != nil {
		c.sendError(reqID, pb.ServerError_InvalidTopicName, err.Error())
		return
	}
	if c.b.partitionsOf(tn.full) > 0 {
		c.sendError(reqID, pb.ServerError_InvalidTopicName, "subscribe to the partitions of a partitioned topic")
		return
	}
	if existing := c.consumer(req.GetConsumerId()); existing != nil {
		c.sendSuccess(reqID) // a retried SUBSCRIBE for a consumer that exists
		return
	}
	t := c.b.getTopic(tn.full, true)
	t.mu.Lock()
	cons, code, msg := t.subscribe(c, req)
	failover := cons != nil && cons.sub.kind == pb.CommandSubscribe_Failover // read under t.mu
	t.mu.Unlock()
	if cons == nil {
		c.sendError(reqID, code, msg)
		return
	}
	c.sendSuccess(reqID)
	if failover {
		t.mu.Lock()
		if !cons.removed {
			cons.conn.send(&pb.BaseCommand{
				Type:                 pb.BaseCommand_ACTIVE_CONSUMER_CHANGE.Enum(),
				ActiveConsumerChange: &pb.CommandActiveConsumerChange{ConsumerId: proto.Uint64(cons.id), IsActive: proto.Bool(cons.sub.active == cons)},
			})
		}
		t.mu.Unlock()
	}
}

// subscribe attaches a consumer; t.mu is held.
func (t *topic) subscribe(c *conn, req *pb.CommandSubscribe) (*consumer, pb.ServerError, string) {
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
	cons := &consumer{sub: s, conn: c, id: req.GetConsumerId(), name: req.GetConsumerName(), unacked: map[int]int32{}}
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
	if s.kind == pb.CommandSubscribe_Exclusive || s.kind == pb.CommandSubscribe_Failover {
		s.electActive()
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
		for _, id := range req.GetMessageId() {
			if len(id.GetAckSet()) > 0 {
				continue // partial batch acks: the entry stays until fully acked
			}
			off, ok := t.offsetOf(id.GetLedgerId(), id.GetEntryId())
			if !ok {
				continue
			}
			if req.GetAckType() == pb.CommandAck_Cumulative {
				for i := s.markDelete; i <= off; i++ {
					s.ack(i)
				}
			} else {
				s.ack(off)
			}
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
	ids := req.GetMessageIds()
	if len(ids) == 0 || s.kind == pb.CommandSubscribe_Exclusive || s.kind == pb.CommandSubscribe_Failover {
		// Single-active subscriptions rewind everything, like the Java broker.
		for _, off := range sortedOffsets(cons.unacked) {
			s.giveBack(cons, off)
		}
	} else {
		for _, id := range ids {
			if off, ok := t.offsetOf(id.GetLedgerId(), id.GetEntryId()); ok {
				s.giveBack(cons, off)
			}
		}
	}
	s.dispatch()
}

func (c *conn) handleSeek(req *pb.CommandSeek) {
	reqID := req.GetRequestId()
	cons := c.consumer(req.GetConsumerId())
	if cons == nil {
		c.sendError(reqID, pb.ServerError_ConsumerNotFound, "consumer not found")
		return
	}
	t := cons.sub.t
	t.mu.Lock()
	switch {
	case req.MessageId != nil:
		cons.sub.resetCursor(t.offsetForStart(req.GetMessageId()))
	case req.MessagePublishTime != nil:
		cons.sub.resetCursor(t.offsetForTime(int64(req.GetMessagePublishTime())))
	default:
		t.mu.Unlock()
		c.sendError(reqID, pb.ServerError_MetadataError, "seek needs a message id or a publish time")
		return
	}
	t.mu.Unlock()
	// The real broker disconnects the subscription's consumers before it
	// answers; the client only resumes after reconnecting.
	c.sendSuccess(reqID)
}

func (c *conn) handleGetLastMessageID(req *pb.CommandGetLastMessageId) {
	reqID := req.GetRequestId()
	cons := c.consumer(req.GetConsumerId())
	if cons == nil {
		c.sendError(reqID, pb.ServerError_ConsumerNotFound, "consumer not found")
		return
	}
	c.send(&pb.BaseCommand{
		Type: pb.BaseCommand_GET_LAST_MESSAGE_ID_RESPONSE.Enum(),
		GetLastMessageIdResponse: &pb.CommandGetLastMessageIdResponse{
			LastMessageId: cons.sub.t.lastMessageID(),
			RequestId:     proto.Uint64(reqID),
		},
	})
}

func (c *conn) handleCloseConsumer(req *pb.CommandCloseConsumer) {
	if cons := c.consumer(req.GetConsumerId()); cons != nil {
		cons.sub.t.removeConsumer(cons)
	}
	c.sendSuccess(req.GetRequestId())
}

func (c *conn) handleUnsubscribe(req *pb.CommandUnsubscribe) {
	reqID := req.GetRequestId()
	cons := c.consumer(req.GetConsumerId())
	if cons == nil {
		c.sendError(reqID, pb.ServerError_ConsumerNotFound, "consumer not found")
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
