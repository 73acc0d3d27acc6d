package pulsartest

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

func (c *conn) handleProducer(req *pb.CommandProducer) {
	reqID := req.GetRequestId()
	tn, ok := c.clientTopic(reqID, req.GetTopic(), "produce to")
	if !ok {
		return
	}
	if existing := c.producer(req.GetProducerId()); existing != nil {
		// ServerCnx.handleProducer: "Producer with the same id is already
		// created": the existing producer is confirmed again, by name.
		c.send(&pb.BaseCommand{
			Type: pb.BaseCommand_PRODUCER_SUCCESS.Enum(),
			ProducerSuccess: &pb.CommandProducerSuccess{
				RequestId:      proto.Uint64(reqID),
				ProducerName:   proto.String(existing.name),
				LastSequenceId: proto.Int64(-1),
			},
		})
		return
	}
	name := req.GetProducerName()
	if name == "" {
		name = fmt.Sprintf("pulsartest-%d", c.b.st.nextProducer.Add(1))
	}
	t := c.b.getTopic(tn.full, true)
	p := &producer{
		id: req.GetProducerId(), name: name, conn: c, t: t, mode: req.GetProducerAccessMode(), reqID: reqID,
		metadata: keyValues(req.GetMetadata()),
	}
	if req.TopicEpoch != nil {
		p.epoch = proto.Uint64(req.GetTopicEpoch())
	}
	// Registered before the topic can ready a waiting producer, so a CLOSE_PRODUCER finds it.
	c.mu.Lock()
	c.producers[p.id] = p
	delete(c.closedProducers, p.id)
	c.mu.Unlock()
	last, queued, code, msg := t.addProducer(p, req.GetInitialSubscriptionName())
	if msg != "" {
		c.forgetProducer(p)
		c.sendError(reqID, code, msg)
		return
	}
	if c.isClosed() { // the connection closed meanwhile: no ghost producer
		t.removeProducer(p)
		return
	}
	if queued {
		// ServerCnx.buildProducerAndAddTopic: "Producer is waiting in queue", answered at
		// once with producer_ready=false; the client keeps waiting for the second answer.
		c.producerSuccess(p, last, nil, false)
		return
	}
	t.mu.Lock()
	epoch := t.topicEpoch()
	t.mu.Unlock()
	c.producerSuccess(p, last, epoch, true)
}

func (c *conn) producerSuccess(p *producer, last int64, epoch *uint64, ready bool) {
	c.send(&pb.BaseCommand{
		Type: pb.BaseCommand_PRODUCER_SUCCESS.Enum(),
		ProducerSuccess: &pb.CommandProducerSuccess{
			RequestId:      proto.Uint64(p.reqID),
			ProducerName:   proto.String(p.name),
			LastSequenceId: proto.Int64(last),
			TopicEpoch:     epoch,
			ProducerReady:  proto.Bool(ready),
		},
	})
}

// forgetProducer drops a producer from the connection, if it is still the one of its id.
func (c *conn) forgetProducer(p *producer) {
	c.mu.Lock()
	if c.producers[p.id] == p {
		delete(c.producers, p.id)
	}
	c.mu.Unlock()
}

func keyValues(kvs []*pb.KeyValue) map[string]string {
	if len(kvs) == 0 {
		return nil
	}
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		m[kv.GetKey()] = kv.GetValue()
	}
	return m
}

func (c *conn) handleSend(req *pb.CommandSend, payload []byte) {
	p := c.producer(req.GetProducerId())
	if p == nil && c.recentlyClosed(req.GetProducerId()) {
		// ServerCnx.handleSend: "We expect these messages because we
		// recently closed the producer"; the client sends them again
		// after it reconnects.
		return
	}
	if p != nil && p.t.isWaiting(p) {
		p = nil // waiting for exclusive access: not ready
	}
	if p == nil {
		// ServerCnx.handleSend: "Received message, but the producer is not ready. Closing
		// the connection" - a producer never created, or closed by the broker without
		// telling the client (fenced out); the client reconnects.
		c.close()
		return
	}
	id, err := p.t.append(p, req, payload)
	if err != nil {
		c.send(&pb.BaseCommand{
			Type: pb.BaseCommand_SEND_ERROR.Enum(),
			SendError: &pb.CommandSendError{
				ProducerId: proto.Uint64(p.id), SequenceId: proto.Uint64(req.GetSequenceId()),
				Error: pb.ServerError_ChecksumError.Enum(), Message: proto.String(err.Error()),
			},
		})
		return
	}
	if id == nil { // duplicate of a stored send: acknowledge it as deduplicated
		id = &pb.MessageIdData{LedgerId: proto.Uint64(^uint64(0)), EntryId: proto.Uint64(^uint64(0)), Partition: proto.Int32(p.t.partition)}
	}
	c.send(&pb.BaseCommand{
		Type: pb.BaseCommand_SEND_RECEIPT.Enum(),
		SendReceipt: &pb.CommandSendReceipt{
			ProducerId: proto.Uint64(p.id), SequenceId: proto.Uint64(req.GetSequenceId()),
			MessageId: id, HighestSequenceId: proto.Uint64(req.GetHighestSequenceId()),
		},
	})
}

func (c *conn) handleCloseProducer(req *pb.CommandCloseProducer) {
	if p := c.producer(req.GetProducerId()); p != nil {
		p.t.removeProducer(p)
	}
	c.sendSuccess(req.GetRequestId())
}

func (c *conn) recentlyClosed(producerID uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.closedProducers[producerID]
	return ok
}
