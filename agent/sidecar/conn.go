package sidecar

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// firstOwnRequestID starts the request ids the sidecar uses on a broker connection for its
// own SUBSCRIBE and CLOSE_CONSUMER. Clients count theirs up from 0, so the ranges never meet,
// and the answers to the sidecar's requests are recognised and kept from the client.
const firstOwnRequestID = 1 << 62

// bufferSize is each connection's read and write buffer toward each peer: four per client,
// so 128 KiB of a connection's memory (250 clients: 32 MiB). 64 KiB bought no throughput in
// BenchmarkSidecarThroughput and doubled the heap of BenchmarkSidecarAnnouncedFrames.
const bufferSize = 32 << 10

// writeTimeout bounds a write to either peer. Pulsar clients and brokers read their socket
// all the time (flow control is by permits, not by TCP), so a peer that takes no bytes for
// this long is gone or stuck; its connection is closed rather than holding up the gates
// (SetState) that write to it.
const writeTimeout = 30 * time.Second

// conn is one client connection and the broker connection paired with it. Two pumps forward
// frames, one per direction; the frame gate of each consumer decides on FLOW and MESSAGE.
type conn struct {
	s      *Sidecar
	id     uint64
	log    logr.Logger
	client net.Conn

	toClient *frameWriter
	toBroker *frameWriter // nil until the broker is dialed
	// cutting: a consumer of this connection cuts a seek target's batch entry, so the client's
	// ACKs are read (seekCut); until then they pass unread.
	cutting atomic.Bool
	// maxMessageSize is what the broker's CONNECTED told the client; 0 until then.
	maxMessageSize atomic.Int32

	mu        sync.Mutex
	broker    net.Conn
	viaUp     bool                 // the broker connection goes through an upstream Pulsar proxy
	consumers map[uint64]*Consumer // by the client's consumer id
	pending   map[uint64]func(ok bool) (forward bool)
	nextOwn   uint64
	pings     []chan struct{} // PINGs sent to the broker, in order; nil entries are the client's
	toldPings []chan struct{} // PINGs sent to the client, in order; nil entries are the broker's
	closed    bool
	life      context.Context // ends with the connection
	end       context.CancelFunc
}

func newConn(s *Sidecar, id uint64, nc net.Conn) *conn {
	life, end := context.WithCancel(context.Background())
	return &conn{s: s, id: id, client: nc, log: s.log.WithValues("conn", id, "client", nc.RemoteAddr().String()),
		toClient: newFrameWriter(nc), consumers: map[uint64]*Consumer{},
		pending: map[uint64]func(bool) bool{}, nextOwn: firstOwnRequestID, life: life, end: end}
}

// frameWriter serialises the writers of one direction: the pump forwarding frames and the
// gates writing their own (held messages on resume, FLOW, CLOSE_CONSUMER, PING).
type frameWriter struct {
	mu sync.Mutex
	nc net.Conn
	w  *bufio.Writer
}

func newFrameWriter(nc net.Conn) *frameWriter {
	return &frameWriter{nc: nc, w: bufio.NewWriterSize(nc, bufferSize)}
}

// write writes frames, flushing unless more are about to follow.
func (fw *frameWriter) write(flush bool, frames ...[]byte) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	return fw.writeLocked(flush, frames...)
}

// flush writes out what the pump left buffered.
func (fw *frameWriter) flush() error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if fw.w.Buffered() == 0 {
		return nil
	}
	_ = fw.nc.SetWriteDeadline(time.Now().Add(writeTimeout))
	return fw.w.Flush()
}

// wholeFrameBuffered tells whether the reader holds the next frame entirely, so that a pump
// can write the frame it has without flushing: bursts go out in few writes, and nothing
// waits in the buffer while the pump blocks on a read.
func wholeFrameBuffered(r *bufio.Reader) bool {
	if r.Buffered() < 4 {
		return false
	}
	header, err := r.Peek(4)
	return err == nil && uint64(r.Buffered()) >= 4+uint64(binary.BigEndian.Uint32(header))
}

func (fw *frameWriter) writeLocked(flush bool, frames ...[]byte) error {
	_ = fw.nc.SetWriteDeadline(time.Now().Add(writeTimeout))
	for _, f := range frames {
		if _, err := fw.w.Write(f); err != nil {
			return err
		}
	}
	if flush {
		return fw.w.Flush()
	}
	return nil
}

// serve reads the client's CONNECT, dials the broker it is meant for and pumps both
// directions until either side ends. Bad input ends this connection only.
func (c *conn) serve() {
	defer c.s.unregister(c)
	fromClient := frameReader{r: bufio.NewReaderSize(c.client, bufferSize), max: c.s.opts.MaxFrameSize,
		budget: c.s.frameMemory, life: c.life}
	first, release, err := c.handshake(fromClient)
	if err != nil {
		c.shutdown(err.Error())
		return
	}
	fromBroker := bufio.NewReaderSize(c.broker, bufferSize)
	ended := make(chan error, 2)
	go func() { ended <- c.pumpClient(fromClient, first, release) }()
	go func() { ended <- c.pumpBroker(fromBroker) }()
	reason := <-ended
	c.shutdown(describeEnd(reason))
	<-ended
}

func describeEnd(err error) string {
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		return ""
	}
	return err.Error()
}

// handshake reads the first frame, which must be a CONNECT, within the handshake timeout,
// and dials the broker it names (or the upstream). release gives back the frame's memory.
func (c *conn) handshake(fr frameReader) (frame, func(), error) {
	deadline := time.Now().Add(c.s.opts.HandshakeTimeout)
	_ = c.client.SetReadDeadline(deadline)
	f, release, err := fr.read(deadline)
	_ = c.client.SetReadDeadline(time.Time{})
	if err != nil {
		return frame{}, nil, fmt.Errorf("no CONNECT from the client: %w", err)
	}
	if err := c.dialFor(f); err != nil {
		release()
		return frame{}, nil, err
	}
	return f, release, nil
}

// dialFor dials the broker a CONNECT names.
func (c *conn) dialFor(f frame) error {
	if f.typ != pb.BaseCommand_CONNECT {
		return fmt.Errorf("the client's first command is %v, not CONNECT", f.typ)
	}
	cmd, err := f.decode()
	if err != nil {
		return err
	}
	proxyTo := cmd.GetConnect().GetProxyToBrokerUrl()
	addr, err := c.s.target(proxyTo)
	if err != nil {
		return err
	}
	nc, err := c.s.dial(addr)
	if err != nil {
		return fmt.Errorf("dial broker %s: %w", addr, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		_ = nc.Close()
		return errors.New("closed during the handshake")
	}
	// Through an upstream Pulsar proxy when the CONNECT names another broker than the one dialed.
	named, _ := hostPortOf(proxyTo)
	c.broker, c.toBroker, c.viaUp = nc, newFrameWriter(nc), proxyTo != "" && named != addr
	c.log = c.log.WithValues("broker", addr)
	c.log.V(1).Info("Client connected", "proxyToBroker", proxyTo)
	return nil
}

// shutdown closes both connections and ends their consumers. A reason is logged: bad input,
// a broker that went away.
func (c *conn) shutdown(reason string) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.end()
	consumers := make([]*Consumer, 0, len(c.consumers))
	for _, cons := range c.consumers {
		consumers = append(consumers, cons)
	}
	broker := c.broker
	c.mu.Unlock()
	_ = c.client.Close()
	if broker != nil {
		_ = broker.Close()
	}
	for _, cons := range consumers {
		cons.end()
	}
	c.s.forgetDetachesOf(c)
	if reason != "" {
		c.log.Info("Connection closed", "reason", reason)
	}
}

// pumpClient forwards the client's frames to the broker through the gates.
func (c *conn) pumpClient(fr frameReader, first frame, release func()) error {
	err := c.toBroker.write(true, first.raw)
	release()
	for err == nil {
		var f frame
		if f, release, err = c.readClientFrame(fr); err != nil {
			return clientError(err)
		}
		err = c.fromClient(f)
		release()
		if err == nil && !wholeFrameBuffered(fr.r) {
			err = c.toBroker.flush()
		}
	}
	return err
}

// readClientFrame waits for the client's next frame as long as it takes (clients keep idle
// connections with PINGs), then gives the frame FrameTimeout to arrive whole, so that a client
// that begins a frame and stalls gives back what it took.
func (c *conn) readClientFrame(fr frameReader) (frame, func(), error) {
	if !wholeFrameBuffered(fr.r) {
		if _, err := fr.r.Peek(1); err != nil {
			return frame{}, nil, err
		}
	}
	if wholeFrameBuffered(fr.r) { // usually, once a small frame has begun
		return fr.read(time.Time{})
	}
	deadline := time.Now().Add(c.s.opts.FrameTimeout)
	_ = c.client.SetReadDeadline(deadline)
	f, release, err := fr.read(deadline)
	_ = c.client.SetReadDeadline(time.Time{})
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
		return frame{}, nil, fmt.Errorf("a frame begun was not complete within %v: %w", c.s.opts.FrameTimeout, err)
	}
	return f, release, err
}

func clientError(err error) error {
	if errors.Is(err, errBadFrame) {
		return fmt.Errorf("client sent bad input: %w", err)
	}
	return err
}

// fromClient handles one client frame; the pump flushes after it.
func (c *conn) fromClient(f frame) error {
	switch f.typ {
	case pb.BaseCommand_SUBSCRIBE, pb.BaseCommand_FLOW, pb.BaseCommand_CLOSE_CONSUMER, pb.BaseCommand_UNSUBSCRIBE:
		cmd, err := f.decode()
		if err != nil {
			return clientError(err)
		}
		return c.consumerCommand(f, cmd)
	case pb.BaseCommand_ACK:
		if c.cutting.Load() {
			return c.clientAck(f)
		}
	case pb.BaseCommand_PING:
		return c.ping(f.raw, nil)
	case pb.BaseCommand_PONG:
		return c.clientPong(f.raw)
	}
	return c.toBroker.write(false, f.raw)
}

// clientAck forwards an ACK, translated when it acknowledges messages of a cut batch entry.
func (c *conn) clientAck(f frame) error {
	cmd, err := f.decode()
	if err != nil {
		return clientError(err)
	}
	cons := c.consumer(cmd.GetAck().GetConsumerId())
	if cons == nil {
		return c.toBroker.write(false, f.raw)
	}
	changed, err := cons.translateAck(cmd.GetAck(), c.s.opts.MaxFrameSize)
	if err != nil {
		return clientError(fmt.Errorf("%w: %w", errBadFrame, err))
	}
	if changed {
		return c.toBroker.write(false, encodeCommand(cmd))
	}
	return c.toBroker.write(false, f.raw)
}

// consumerCommand routes a client's consumer command to its gate.
func (c *conn) consumerCommand(f frame, cmd *pb.BaseCommand) error {
	switch f.typ {
	case pb.BaseCommand_SUBSCRIBE:
		return c.subscribe(f, cmd.GetSubscribe())
	case pb.BaseCommand_FLOW:
		if cons := c.consumer(cmd.GetFlow().GetConsumerId()); cons != nil {
			return cons.clientFlow(f.raw, cmd.GetFlow().GetMessagePermits())
		}
		// A FLOW racing the consumer's close: the broker would ignore it too.
		c.log.V(1).Info("FLOW for an unknown consumer dropped", "consumerId", cmd.GetFlow().GetConsumerId())
		return nil
	case pb.BaseCommand_CLOSE_CONSUMER:
		if cons := c.consumer(cmd.GetCloseConsumer().GetConsumerId()); cons != nil {
			return cons.clientClose(f.raw, cmd.GetCloseConsumer().GetRequestId())
		}
	case pb.BaseCommand_UNSUBSCRIBE:
		if cons := c.consumer(cmd.GetUnsubscribe().GetConsumerId()); cons != nil {
			return cons.clientUnsubscribe(f.raw, cmd.GetUnsubscribe().GetRequestId())
		}
	}
	return c.toBroker.write(false, f.raw)
}

func (c *conn) consumer(id uint64) *Consumer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.consumers[id]
}

// subscribe starts tracking a consumer, or starts a new session of one the broker closed
// (same connection, same id), and lets the hooks set its state before the SUBSCRIBE goes on.
func (c *conn) subscribe(f frame, sub *pb.CommandSubscribe) error {
	c.mu.Lock()
	cons, known := c.consumers[sub.GetConsumerId()]
	if !known {
		cons = newConsumer(c, sub)
		c.consumers[sub.GetConsumerId()] = cons
	}
	c.mu.Unlock()
	if !known {
		c.s.added(cons)
	}
	return cons.clientSubscribe(f.raw, sub)
}

// forget stops tracking a consumer that the client closed.
func (c *conn) forget(cons *Consumer) {
	c.mu.Lock()
	if c.consumers[cons.id] == cons {
		delete(c.consumers, cons.id)
	}
	c.mu.Unlock()
	cons.end()
}

// expect registers what to do with the answer (SUCCESS or ERROR) to a request.
func (c *conn) expect(requestID uint64, fn func(ok bool) (forward bool)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pending[requestID] = fn
}

// ownRequestID returns a request id for the sidecar's own command.
func (c *conn) ownRequestID() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nextOwn++
	return c.nextOwn
}

// ping sends a PING to the broker, recording who waits for its PONG: the broker answers PINGs
// in order, so the n-th PONG answers the n-th PING.
func (c *conn) ping(raw []byte, waiter chan struct{}) error {
	c.toBroker.mu.Lock()
	defer c.toBroker.mu.Unlock()
	c.mu.Lock()
	c.pings = append(c.pings, waiter)
	c.mu.Unlock()
	return c.toBroker.writeLocked(true, raw)
}

// barrier returns once the broker has answered a PING sent after everything the sidecar
// wrote to it so far: every FLOW sent before has then reached the broker (and any recorder in
// between). It returns early when ctx ends or the connection closes; no FLOW can follow then
// either way, as the callers have already closed their gate.
func (c *conn) barrier(ctx context.Context) error {
	if c.toBroker == nil {
		return nil
	}
	pong := make(chan struct{})
	if err := c.ping(pingFrame, pong); err != nil {
		return nil // the connection is going: nothing more reaches the broker
	}
	select {
	case <-pong:
		return nil
	case <-c.life.Done():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// pumpBroker forwards the broker's frames to the client through the gates.
func (c *conn) pumpBroker(r *bufio.Reader) error {
	for {
		f, err := readFrame(r, c.s.opts.MaxFrameSize)
		if err != nil {
			if errors.Is(err, errBadFrame) {
				return fmt.Errorf("broker sent bad input: %w", err)
			}
			if errors.Is(err, io.EOF) {
				return errors.New("the broker closed the connection")
			}
			return err
		}
		if err := c.fromBroker(f); err != nil {
			return err
		}
		if !wholeFrameBuffered(r) {
			if err := c.toClient.flush(); err != nil {
				return err
			}
		}
	}
}

// fromBroker handles one broker frame; the pump flushes after it.
func (c *conn) fromBroker(f frame) error {
	switch f.typ {
	case pb.BaseCommand_MESSAGE, pb.BaseCommand_SUCCESS, pb.BaseCommand_ERROR,
		pb.BaseCommand_CLOSE_CONSUMER, pb.BaseCommand_LOOKUP_RESPONSE, pb.BaseCommand_CONNECTED:
		cmd, err := f.decode()
		if err != nil {
			return fmt.Errorf("broker: %w", err)
		}
		return c.brokerCommand(f, cmd)
	case pb.BaseCommand_PONG:
		return c.pong(f.raw)
	case pb.BaseCommand_PING:
		return c.pingClient(f.raw, nil)
	}
	return c.toClient.write(false, f.raw)
}

func (c *conn) brokerCommand(f frame, cmd *pb.BaseCommand) error {
	switch f.typ {
	case pb.BaseCommand_MESSAGE:
		if cons := c.consumer(cmd.GetMessage().GetConsumerId()); cons != nil {
			e, err := readEntry(f.payload)
			if err != nil {
				c.log.V(1).Info("MESSAGE metadata unreadable; counted as one message", "error", err.Error())
			}
			return cons.brokerMessage(f, cmd.GetMessage(), e)
		}
	case pb.BaseCommand_SUCCESS:
		if !c.answered(cmd.GetSuccess().GetRequestId(), true) {
			return nil
		}
	case pb.BaseCommand_ERROR:
		if !c.answered(cmd.GetError().GetRequestId(), false) {
			return nil
		}
	case pb.BaseCommand_CLOSE_CONSUMER:
		c.assignedBroker(cmd.GetCloseConsumer().GetAssignedBrokerServiceUrl())
		if cons := c.consumer(cmd.GetCloseConsumer().GetConsumerId()); cons != nil && !cons.brokerClosed() {
			return nil
		}
		return c.closeClientConsumer(f.raw)
	case pb.BaseCommand_LOOKUP_RESPONSE:
		c.s.awaitDetaches()
		return c.toClient.write(false, c.routeLookup(f.raw, cmd))
	case pb.BaseCommand_CONNECTED:
		c.maxMessageSize.Store(cmd.GetConnected().GetMaxMessageSize())
	}
	return c.toClient.write(false, f.raw)
}

// answered runs what a request's answer was expected to do and tells whether the client
// gets the answer (not when it answers the sidecar's own request).
func (c *conn) answered(requestID uint64, ok bool) (forward bool) {
	c.mu.Lock()
	fn := c.pending[requestID]
	delete(c.pending, requestID)
	c.mu.Unlock()
	if fn == nil {
		return requestID < firstOwnRequestID
	}
	return fn(ok)
}

func (c *conn) pong(raw []byte) error {
	c.mu.Lock()
	var waiter chan struct{}
	ours := false
	if len(c.pings) > 0 {
		waiter, ours = c.pings[0], c.pings[0] != nil
		c.pings = c.pings[1:]
	}
	c.mu.Unlock()
	if ours {
		close(waiter)
		return nil
	}
	return c.toClient.write(false, raw)
}

// pingClient sends a PING to the client, recording who waits for its PONG (the broker's own
// PINGs pass through too): a client answers in order, after every frame before.
func (c *conn) pingClient(raw []byte, waiter chan struct{}) error {
	c.toClient.mu.Lock()
	defer c.toClient.mu.Unlock()
	c.mu.Lock()
	c.toldPings = append(c.toldPings, waiter)
	c.mu.Unlock()
	return c.toClient.writeLocked(true, raw)
}

// closeClientConsumer writes a CLOSE_CONSUMER to the client, which subscribes again, then a
// PING whose answer shows the client has handled the close: until then, or detachTimeout,
// lookup answers wait (Sidecar.awaitDetaches). The close is recorded before it is written:
// the client's lookup may come back on another connection before this goroutine runs again.
func (c *conn) closeClientConsumer(raw []byte) error {
	pong := make(chan struct{})
	c.s.detached(pong, c)
	if err := c.toClient.write(true, raw); err != nil {
		c.s.forgetDetach(pong)
		return err
	}
	return c.pingClient(pingFrame, pong)
}

func (c *conn) clientPong(raw []byte) error {
	c.mu.Lock()
	var waiter chan struct{}
	if len(c.toldPings) > 0 {
		waiter = c.toldPings[0]
		c.toldPings = c.toldPings[1:]
	}
	c.mu.Unlock()
	if waiter != nil {
		close(waiter)
		c.s.forgetDetach(waiter)
		return nil
	}
	return c.toBroker.write(false, raw)
}

// clientMaxFrame is the largest frame the client takes: the broker's max_message_size, which
// CONNECTED tells it, plus the padding clients allow for the command and metadata; without
// one, the default.
func (c *conn) clientMaxFrame() int {
	if n := c.maxMessageSize.Load(); n > 0 {
		return int(n) + pb.FramePadding
	}
	return DefaultMaxFrameSize
}

// routeLookup keeps the client on the sidecar: a lookup answer that sends it to a broker is
// changed to proxy_through_service_url, so that the client connects to the sidecar and names
// the broker in CONNECT (what a Pulsar proxy does). An answer that already routes through the
// upstream's service URL means the upstream is a Pulsar proxy: the sidecar goes on through it.
func (c *conn) routeLookup(raw []byte, cmd *pb.BaseCommand) []byte {
	resp := cmd.GetLookupTopicResponse()
	switch resp.GetResponse() {
	case pb.CommandLookupTopicResponse_Connect, pb.CommandLookupTopicResponse_Redirect:
	default:
		return raw
	}
	named := resp.GetBrokerServiceUrl()
	if c.s.tls != nil && resp.GetBrokerServiceUrlTls() != "" {
		named = resp.GetBrokerServiceUrlTls()
	}
	broker, err := hostPortOf(named)
	if err != nil {
		c.log.Info("Lookup answer names no usable broker URL; passed on as is", "url", named, "error", err.Error())
		return raw
	}
	if resp.GetProxyThroughServiceUrl() {
		c.s.learnRoute(broker, viaUpstream)
	} else {
		c.s.learnRoute(broker, direct)
	}
	changed := !resp.GetProxyThroughServiceUrl() || named != resp.GetBrokerServiceUrl()
	if !changed {
		return raw
	}
	// The client talks plaintext to the sidecar, so it reads brokerServiceUrl: with TLS to
	// the brokers that names the broker's TLS address, which the sidecar dials with TLS.
	resp.ProxyThroughServiceUrl = proto.Bool(true)
	resp.BrokerServiceUrl = proto.String("pulsar://" + broker)
	return encodeCommand(cmd)
}

// assignedBroker learns the broker a CLOSE_CONSUMER sends the consumer to (PIP-307): the
// client reconnects there through the sidecar, reached the way this connection's broker is.
func (c *conn) assignedBroker(url string) {
	if url == "" {
		return
	}
	broker, err := hostPortOf(url)
	if err != nil {
		return
	}
	r := direct
	c.mu.Lock()
	if c.viaUp {
		r = viaUpstream
	}
	c.mu.Unlock()
	c.s.learnRoute(broker, r)
}
