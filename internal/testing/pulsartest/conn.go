package pulsartest

import (
	"bufio"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// conn is one client connection. Frames are queued by any goroutine and
// written by writeLoop in batches, one write per batch.
type conn struct {
	id uint64
	b  *Broker
	nc net.Conn

	writeMu sync.Mutex // leaf lock
	out     []byte
	spare   []byte
	closed  bool
	wake    chan struct{}
	done    chan struct{}
	queued  uint64        // bytes ever queued
	written uint64        // bytes ever written to the socket
	flushes []flushWaiter // waiting for written to reach their mark

	mu        sync.Mutex // guards consumers and producers; taken after topic.mu
	consumers map[uint64]*consumer
	producers map[uint64]*producer
	// closedProducers are producers the broker closed (unload, move): SENDs
	// still in flight for them are ignored (ServerCnx.recentlyClosedProducers).
	closedProducers map[uint64]struct{}

	entryMetadata bool          // the client announced supports_broker_entry_metadata
	clientVersion string        // CONNECT client_version, shown in stats
	pongs         chan struct{} // a PONG arrived (for alive)
	gone          chan struct{} // closed once close removed the consumers and producers
}

func (b *Broker) newConn(nc net.Conn) *conn {
	return &conn{
		id:        b.st.nextConnID.Add(1),
		b:         b,
		nc:        nc,
		wake:      make(chan struct{}, 1),
		done:      make(chan struct{}),
		pongs:     make(chan struct{}, 1),
		gone:      make(chan struct{}),
		consumers: map[uint64]*consumer{},
		producers: map[uint64]*producer{},

		closedProducers: map[uint64]struct{}{},
	}
}

// send queues a frame; it never blocks on the network.
func (c *conn) send(cmd *pb.BaseCommand, payload ...[]byte) {
	c.writeMu.Lock()
	if c.closed {
		c.writeMu.Unlock()
		return
	}
	before := len(c.out)
	c.out = pb.AppendFrame(c.out, cmd, payload...)
	c.queued += uint64(len(c.out) - before)
	c.writeMu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *conn) writeLoop() {
	for {
		select {
		case <-c.done:
			return
		case <-c.wake:
		}
		c.writeMu.Lock()
		batch := c.out
		c.out, c.spare = c.spare[:0], nil // the two buffers never alias
		c.writeMu.Unlock()
		if len(batch) == 0 {
			continue
		}
		if _, err := c.nc.Write(batch); err != nil {
			c.close()
			return
		}
		c.writeMu.Lock()
		c.written += uint64(len(batch))
		c.releaseFlushes(false)
		if cap(batch) <= 1<<20 { // keep the buffer unless a burst made it huge
			c.spare = batch[:0]
		}
		c.writeMu.Unlock()
	}
}

// flushWaiter is a caller of flushed waiting for the bytes queued before it.
type flushWaiter struct {
	mark uint64
	done chan struct{}
}

// flushed returns a channel closed once every frame queued so far has been
// written to the socket (or the connection closed), so that a broker-side
// action can answer only after its frames left, as the Java broker's
// writes do before an admin call's answer.
func (c *conn) flushed() <-chan struct{} {
	ch := make(chan struct{})
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if c.closed || c.written >= c.queued {
		close(ch)
		return ch
	}
	c.flushes = append(c.flushes, flushWaiter{mark: c.queued, done: ch})
	return ch
}

// releaseFlushes wakes the waiters whose bytes are written, or all of them;
// writeMu is held.
func (c *conn) releaseFlushes(all bool) {
	kept := c.flushes[:0]
	for _, w := range c.flushes {
		if all || c.written >= w.mark {
			close(w.done)
		} else {
			kept = append(kept, w)
		}
	}
	c.flushes = kept
}

// awaitFlushed waits, up to a bound, until the connections have written
// what was queued on them so far.
func awaitFlushed(conns []*conn) {
	timeout := time.After(5 * time.Second)
	for _, c := range conns {
		select {
		case <-c.flushed():
		case <-timeout:
			return
		}
	}
}

// connectionLivenessCheckTimeout is the broker's connectionLivenessCheckTimeoutMillis.
const connectionLivenessCheckTimeout = 5 * time.Second

// alive is ServerCnx.checkConnectionLiveness: a PING, and the connection is alive if a PONG
// comes back in time; a closed connection is not.
func (c *conn) alive() bool {
	select {
	case <-c.pongs: // an old one
	default:
	}
	c.send(&pb.BaseCommand{Type: pb.BaseCommand_PING.Enum(), Ping: &pb.CommandPing{}})
	select {
	case <-c.pongs:
		return true
	case <-c.done:
		return false
	case <-time.After(connectionLivenessCheckTimeout):
		return false
	}
}

// close ends the connection and removes its consumers and producers.
func (c *conn) close() {
	c.writeMu.Lock()
	if c.closed {
		c.writeMu.Unlock()
		return
	}
	c.closed = true
	close(c.done)
	c.releaseFlushes(true)
	c.writeMu.Unlock()
	_ = c.nc.Close()
	c.b.forgetConn(c)

	c.mu.Lock()
	consumers := make([]*consumer, 0, len(c.consumers))
	for _, cons := range c.consumers {
		consumers = append(consumers, cons)
	}
	producers := make([]*producer, 0, len(c.producers))
	for _, p := range c.producers {
		producers = append(producers, p)
	}
	c.mu.Unlock()
	for _, cons := range consumers {
		cons.sub.t.removeConsumer(cons)
	}
	for _, p := range producers {
		p.t.removeProducer(p)
	}
	close(c.gone)
}

func (c *conn) isClosed() bool {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	return c.closed
}

func (c *conn) readLoop(r *bufio.Reader) {
	defer c.close()
	if !c.handshake(r) {
		return
	}
	for {
		cmd, payload, err := readFrame(r, maxFrameField(c.b.opts.MaxMessageSize))
		if err != nil {
			return
		}
		if d := time.Duration(c.b.latency.Load()); d > 0 {
			time.Sleep(d) // injected fault: the broker is slow to handle commands
		}
		c.handle(cmd, payload)
	}
}

func (c *conn) handshake(r *bufio.Reader) bool {
	_ = c.nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	cmd, _, err := readFrame(r, maxFrameField(c.b.opts.MaxMessageSize))
	_ = c.nc.SetReadDeadline(time.Time{})
	if err != nil || cmd.GetType() != pb.BaseCommand_CONNECT {
		return false
	}
	c.entryMetadata = cmd.GetConnect().GetFeatureFlags().GetSupportsBrokerEntryMetadata()
	c.clientVersion = cmd.GetConnect().GetClientVersion()
	version := cmd.GetConnect().GetProtocolVersion()
	if version > 21 {
		version = 21
	}
	c.send(&pb.BaseCommand{
		Type: pb.BaseCommand_CONNECTED.Enum(),
		Connected: &pb.CommandConnected{
			ServerVersion:   proto.String("subflow-pulsartest"),
			ProtocolVersion: proto.Int32(version),
			MaxMessageSize:  proto.Int32(int32(c.b.opts.MaxMessageSize)),
		},
	})
	return true
}

func (c *conn) handle(cmd *pb.BaseCommand, payload []byte) {
	switch cmd.GetType() {
	case pb.BaseCommand_PING:
		c.send(&pb.BaseCommand{Type: pb.BaseCommand_PONG.Enum(), Pong: &pb.CommandPong{}})
	case pb.BaseCommand_PONG:
		select {
		case c.pongs <- struct{}{}:
		default:
		}
	case pb.BaseCommand_PARTITIONED_METADATA:
		c.handlePartitionedMetadata(cmd.GetPartitionMetadata())
	case pb.BaseCommand_LOOKUP:
		c.handleLookup(cmd.GetLookupTopic())
	case pb.BaseCommand_PRODUCER:
		c.handleProducer(cmd.GetProducer())
	case pb.BaseCommand_SEND:
		c.handleSend(cmd.GetSend(), payload)
	case pb.BaseCommand_CLOSE_PRODUCER:
		c.handleCloseProducer(cmd.GetCloseProducer())
	case pb.BaseCommand_SUBSCRIBE:
		c.handleSubscribe(cmd.GetSubscribe())
	case pb.BaseCommand_FLOW:
		c.handleFlow(cmd.GetFlow())
	case pb.BaseCommand_ACK:
		c.handleAck(cmd.GetAck())
	case pb.BaseCommand_REDELIVER_UNACKNOWLEDGED_MESSAGES:
		c.handleRedeliver(cmd.GetRedeliverUnacknowledgedMessages())
	case pb.BaseCommand_SEEK:
		c.handleSeek(cmd.GetSeek())
	case pb.BaseCommand_GET_LAST_MESSAGE_ID:
		c.handleGetLastMessageID(cmd.GetGetLastMessageId())
	case pb.BaseCommand_CLOSE_CONSUMER:
		c.handleCloseConsumer(cmd.GetCloseConsumer())
	case pb.BaseCommand_UNSUBSCRIBE:
		c.handleUnsubscribe(cmd.GetUnsubscribe())
	case pb.BaseCommand_GET_TOPICS_OF_NAMESPACE:
		c.handleTopicsOfNamespace(cmd.GetGetTopicsOfNamespace())
	case pb.BaseCommand_GET_SCHEMA:
		// No topic has a schema here: ServerCnx.handleGetSchema answers a topic without one so,
		// and clients take it as "no schema".
		req := cmd.GetGetSchema()
		c.send(&pb.BaseCommand{Type: pb.BaseCommand_GET_SCHEMA_RESPONSE.Enum(), GetSchemaResponse: &pb.CommandGetSchemaResponse{
			RequestId: proto.Uint64(req.GetRequestId()), ErrorCode: pb.ServerError_TopicNotFound.Enum(),
			ErrorMessage: proto.String("Topic not found or no-schema")}})
	default:
		c.unmodelled(cmd)
	}
}

// unmodelled answers a request this broker does not model (schemas, transactions, stats...)
// at once with an error naming it, and records it (Broker.Unmodelled): a client waiting out
// its operation timeout instead would make a test slow for a reason no real broker gives.
func (c *conn) unmodelled(cmd *pb.BaseCommand) {
	name := cmd.GetType().String()
	if cmd.GetType().Descriptor().Values().ByNumber(cmd.GetType().Number()) == nil {
		name = "command type " + name // newer than wire.proto: its number
	}
	c.b.noteUnmodelled(name)
	reqID, ok := requestIDOf(cmd)
	if !ok {
		return
	}
	msg := fmt.Sprintf("pulsartest does not model %s", name)
	if cmd.GetType() == pb.BaseCommand_GET_OR_CREATE_SCHEMA {
		c.send(&pb.BaseCommand{Type: pb.BaseCommand_GET_OR_CREATE_SCHEMA_RESPONSE.Enum(), GetOrCreateSchemaResponse: &pb.CommandGetOrCreateSchemaResponse{
			RequestId: proto.Uint64(reqID), ErrorCode: pb.ServerError_NotAllowedError.Enum(), ErrorMessage: proto.String(msg)}})
		return
	}
	c.sendError(reqID, pb.ServerError_NotAllowedError, msg)
}

// requestIDOf reads the request_id of the command a BaseCommand carries, if it has one. A
// command outside wire.proto's subset arrives as an unknown field; Pulsar numbers the
// request_id of every such request (transactions, stats, topic-list watches) 1.
func requestIDOf(cmd *pb.BaseCommand) (uint64, bool) {
	var id uint64
	var found bool
	cmd.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Kind() != protoreflect.MessageKind {
			return true
		}
		inner := v.Message()
		if f := inner.Descriptor().Fields().ByName("request_id"); f != nil && inner.Has(f) {
			id, found = inner.Get(f).Uint(), true
		}
		return !found
	})
	if found {
		return id, true
	}
	return firstFieldVarint(cmd.ProtoReflect().GetUnknown())
}

// firstFieldVarint finds, in the unknown fields of a BaseCommand, a sub-message whose field 1
// is a varint, and returns that.
func firstFieldVarint(unknown []byte) (uint64, bool) {
	for len(unknown) > 0 {
		num, typ, n := protowire.ConsumeTag(unknown)
		if n < 0 {
			return 0, false
		}
		unknown = unknown[n:]
		if typ != protowire.BytesType || num <= 1 {
			if n = protowire.ConsumeFieldValue(num, typ, unknown); n < 0 {
				return 0, false
			}
			unknown = unknown[n:]
			continue
		}
		inner, n := protowire.ConsumeBytes(unknown)
		if n < 0 {
			return 0, false
		}
		unknown = unknown[n:]
		for len(inner) > 0 {
			fnum, ftyp, m := protowire.ConsumeTag(inner)
			if m < 0 {
				break
			}
			inner = inner[m:]
			if fnum == 1 && ftyp == protowire.VarintType {
				v, m := protowire.ConsumeVarint(inner)
				return v, m >= 0
			}
			if m = protowire.ConsumeFieldValue(fnum, ftyp, inner); m < 0 {
				break
			}
			inner = inner[m:]
		}
	}
	return 0, false
}

func (c *conn) sendSuccess(requestID uint64) {
	c.send(&pb.BaseCommand{Type: pb.BaseCommand_SUCCESS.Enum(), Success: &pb.CommandSuccess{RequestId: proto.Uint64(requestID)}})
}

func (c *conn) sendError(requestID uint64, code pb.ServerError, msg string) {
	c.send(&pb.BaseCommand{
		Type:  pb.BaseCommand_ERROR.Enum(),
		Error: &pb.CommandError{RequestId: proto.Uint64(requestID), Error: code.Enum(), Message: proto.String(msg)},
	})
}

func (c *conn) handlePartitionedMetadata(req *pb.CommandPartitionedTopicMetadata) {
	resp := &pb.CommandPartitionedTopicMetadataResponse{RequestId: proto.Uint64(req.GetRequestId())}
	tn, err := parseTopic(req.GetTopic())
	if err != nil {
		resp.Response = pb.CommandPartitionedTopicMetadataResponse_Failed.Enum()
		resp.Error = pb.ServerError_InvalidTopicName.Enum()
		resp.Message = proto.String(err.Error())
	} else {
		resp.Response = pb.CommandPartitionedTopicMetadataResponse_Success.Enum()
		resp.Partitions = proto.Uint32(uint32(c.b.partitionsOf(tn.full)))
	}
	c.send(&pb.BaseCommand{Type: pb.BaseCommand_PARTITIONED_METADATA_RESPONSE.Enum(), PartitionMetadataResponse: resp})
}

func (c *conn) consumer(id uint64) *consumer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.consumers[id]
}

func (c *conn) producer(id uint64) *producer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.producers[id]
}

// consumerOrNotFound is the consumer id names on this connection; when there is none it
// answers reqID with ConsumerNotFound, as the broker does, and returns nil.
func (c *conn) consumerOrNotFound(reqID, id uint64) *consumer {
	cons := c.consumer(id)
	if cons == nil {
		c.sendError(reqID, pb.ServerError_ConsumerNotFound, "consumer not found")
	}
	return cons
}

// clientTopic parses the topic of a PRODUCER or SUBSCRIBE command and refuses a partitioned
// topic itself (clients use its partitions), answering reqID with the error that says what
// the client tried to do (verb, "produce to" or "subscribe to"); ok is false when it answered.
func (c *conn) clientTopic(reqID uint64, topic, verb string) (tn topicName, ok bool) {
	tn, err := parseTopic(topic)
	if err != nil {
		c.sendError(reqID, pb.ServerError_InvalidTopicName, err.Error())
		return topicName{}, false
	}
	if c.b.partitionsOf(tn.full) > 0 {
		c.sendError(reqID, pb.ServerError_InvalidTopicName, verb+" the partitions of a partitioned topic")
		return topicName{}, false
	}
	return tn, true
}

// handleTopicsOfNamespace lists the namespace's topics for regex consumers:
// non-partitioned topics and every partition of partitioned ones, unfiltered.
func (c *conn) handleTopicsOfNamespace(req *pb.CommandGetTopicsOfNamespace) {
	c.send(&pb.BaseCommand{
		Type: pb.BaseCommand_GET_TOPICS_OF_NAMESPACE_RESPONSE.Enum(),
		GetTopicsOfNamespaceResponse: &pb.CommandGetTopicsOfNamespaceResponse{
			RequestId: proto.Uint64(req.GetRequestId()),
			Topics:    c.b.topicsInNamespace(req.GetNamespace()),
			Filtered:  proto.Bool(false),
			Changed:   proto.Bool(true),
		},
	})
}
