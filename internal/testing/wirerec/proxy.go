package wirerec

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// Options change how the proxy runs; the zero value forwards every byte
// unchanged to the upstream broker.
type Options struct {
	// Listener, when set, is where the proxy accepts clients. Bind it
	// before starting the broker when the broker must advertise the proxy's
	// address; otherwise the proxy listens on a random 127.0.0.1 port. Close
	// closes it.
	Listener net.Listener

	// RewriteLookups sets proxy_through_service_url on LOOKUP_RESPONSE
	// answers that send the client to a broker, so that the client keeps
	// dialing the proxy and names the broker in CONNECT.proxy_to_broker_url.
	// These answers are the only bytes the proxy ever changes. Use it with a
	// broker that advertises its own address; prefer a broker that
	// advertises the proxy's address, which needs no change at all.
	RewriteLookups bool

	// MaxEvents bounds the record; 0 means 1<<20. Check reports an overflow.
	MaxEvents int

	// Keep, when set, keeps only events of these types in the record, so
	// that a long run can hold what it checks (its FLOWs, say) without every
	// MESSAGE and ACK. Every frame is still decoded: consumers are tracked
	// and problems reported as without it. GET_LAST_MESSAGE_ID is always
	// kept, for Barrier.
	Keep []pb.BaseCommand_Type

	// DialTimeout bounds connecting to a broker; 0 means 10 s.
	DialTimeout time.Duration
}

// Proxy is a running recorder.
type Proxy struct {
	opts     Options
	ln       net.Listener // guarded by mu once started (Outage replaces it)
	addr     string
	upstream string // host:port

	mu       sync.Mutex
	seq      Mark
	events   []Event
	dropped  int
	sessions []*Consumer
	current  map[ConsumerKey]*Consumer
	closedCs map[*Consumer]bool // subscriptions a CLOSE_CONSUMER ended
	problems []problem
	brokers  map[string]bool       // host:port named by lookups, which CONNECT may ask for
	conns    map[uint64]*proxyConn // open
	ended    []Connection
	nextConn uint64
	closed   bool
	down     bool // an outage: the listener is closed (Outage)

	wg sync.WaitGroup
}

// Start starts a proxy in front of the broker at upstream ("host:port" or
// "pulsar://host:port").
func Start(upstream string, opts ...Options) (*Proxy, error) {
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.MaxEvents <= 0 {
		o.MaxEvents = 1 << 20
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 10 * time.Second
	}
	host, err := hostPort(upstream)
	if err != nil {
		return nil, err
	}
	ln := o.Listener
	if ln == nil {
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return nil, err
		}
	}
	p := &Proxy{
		opts:     o,
		ln:       ln,
		upstream: host,
		current:  map[ConsumerKey]*Consumer{},
		closedCs: map[*Consumer]bool{},
		brokers:  map[string]bool{host: true},
		conns:    map[uint64]*proxyConn{},
	}
	p.addr = ln.Addr().String()
	p.wg.Add(1)
	go func() { defer p.wg.Done(); p.acceptLoop(ln) }()
	return p, nil
}

// StartT starts a proxy for a test: it closes the proxy when the test ends
// and fails the test if Check reports a problem.
func StartT(tb testing.TB, upstream string, opts ...Options) *Proxy {
	tb.Helper()
	p, err := Start(upstream, opts...)
	if err != nil {
		tb.Fatalf("start wire recorder: %v", err)
	}
	tb.Cleanup(func() {
		_ = p.Close()
		if err := p.Check(); err != nil {
			tb.Errorf("wire recorder: %v", err)
		}
	})
	return p
}

// hostPort accepts "host:port" or a pulsar:// URL.
func hostPort(addr string) (string, error) {
	if strings.Contains(addr, "://") {
		u, err := url.Parse(addr)
		if err != nil {
			return "", fmt.Errorf("upstream %q: %w", addr, err)
		}
		if u.Scheme != "pulsar" {
			return "", fmt.Errorf("upstream %q: only pulsar:// is supported (no TLS)", addr)
		}
		addr = u.Host
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return "", fmt.Errorf("upstream %q: %w", addr, err)
	}
	return addr, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.addr }

// ServiceURL is the URL to give pulsar.ClientOptions.URL.
func (p *Proxy) ServiceURL() string { return "pulsar://" + p.Addr() }

// Close stops accepting, drops every connection and waits for them to end.
// The record stays readable.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	conns := make([]*proxyConn, 0, len(p.conns))
	for _, c := range p.conns {
		conns = append(conns, c)
	}
	ln := p.ln
	p.mu.Unlock()
	err := ln.Close()
	if errors.Is(err, net.ErrClosed) {
		err = nil // closed by an outage
	}
	for _, c := range conns {
		c.close()
	}
	p.wg.Wait()
	return err
}

// DropConnections closes every proxied connection, as a network failure
// would; clients reconnect through the proxy.
func (p *Proxy) DropConnections() {
	p.mu.Lock()
	conns := make([]*proxyConn, 0, len(p.conns))
	for _, c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
}

// Outage makes the broker unreachable through the proxy, as a broker that is down: while on,
// the proxy's port refuses connections and the open ones are dropped; off, it listens again on
// the same address.
func (p *Proxy) Outage(on bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.down == on {
		return nil
	}
	if on {
		p.down = true
		err := p.ln.Close()
		for _, c := range p.conns {
			go c.close()
		}
		return err
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return err
	}
	p.ln, p.down = ln, false
	p.wg.Add(1)
	go func() { defer p.wg.Done(); p.acceptLoop(ln) }()
	return nil
}

// Connection describes one proxied client connection.
type Connection struct {
	ID         uint64
	Client     string // client's address
	Broker     string // broker dialed, host:port
	ProxiedTo  string // CONNECT.proxy_to_broker_url, when the client routes through the proxy
	Opened     time.Time
	Closed     time.Time // zero while open
	ClosedFrom Direction // the side whose stream ended first
}

// Connections returns every connection accepted so far, in order.
func (p *Proxy) Connections() []Connection {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Connection, 0, len(p.conns)+len(p.ended))
	out = append(out, p.ended...)
	for _, c := range p.conns {
		out = append(out, c.info)
	}
	slices.SortFunc(out, func(a, b Connection) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

func (p *Proxy) acceptLoop(ln net.Listener) {
	for {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		c := p.register(nc)
		if c == nil {
			_ = nc.Close()
			return
		}
		p.wg.Add(1)
		go func() { defer p.wg.Done(); p.serve(c) }()
	}
}

func (p *Proxy) register(nc net.Conn) *proxyConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.nextConn++
	c := &proxyConn{client: nc, info: Connection{ID: p.nextConn, Client: nc.RemoteAddr().String(), Opened: time.Now()}}
	p.conns[c.info.ID] = c
	return c
}

// serve reads the client's CONNECT, dials the broker it is meant for and
// pumps both directions until either side ends.
func (p *Proxy) serve(c *proxyConn) {
	defer p.finish(c)
	in := bufio.NewReaderSize(c.client, 64<<10)
	_ = c.client.SetReadDeadline(time.Now().Add(30 * time.Second))
	first, err := readFrame(in, nil)
	_ = c.client.SetReadDeadline(time.Time{})
	if errors.Is(err, net.ErrClosed) {
		return // the recorder closed while the client was still silent: no fault of the client
	}
	if err != nil {
		p.report(c.info.ID, "no CONNECT from the client: %v", err)
		return
	}
	target, err := p.target(c, first)
	if err != nil {
		p.report(c.info.ID, "%v", err)
		return
	}
	up, err := net.DialTimeout("tcp", target, p.opts.DialTimeout)
	if err != nil {
		p.report(c.info.ID, "dial broker %s: %v", target, err)
		return
	}
	if !c.attach(up) {
		_ = up.Close()
		return
	}
	p.setBroker(c, target)

	done := make(chan Direction, 2)
	go func() { done <- p.pump(c, in, first, up, FromClient) }()
	go func() { done <- p.pump(c, bufio.NewReaderSize(up, 64<<10), nil, c.client, FromBroker) }()
	ended := <-done
	c.close()
	<-done
	p.mu.Lock()
	c.info.ClosedFrom = ended
	p.mu.Unlock()
}

// target picks the broker for a new connection: the upstream, or the broker
// a client routing through the proxy names in its CONNECT. Only brokers the
// proxy saw in a lookup answer are dialed, so a client cannot use the proxy
// to reach arbitrary hosts.
func (p *Proxy) target(c *proxyConn, first []byte) (string, error) {
	cmd, _, err := pb.SplitFrame(first)
	if err != nil {
		return p.upstream, nil // forwarded as is; the broker will judge it
	}
	if t, err := pb.CommandType(cmd); err != nil || t != pb.BaseCommand_CONNECT {
		return p.upstream, nil
	}
	var base pb.BaseCommand
	if decodeOptions.Unmarshal(cmd, &base) != nil {
		return p.upstream, nil
	}
	proxied := base.GetConnect().GetProxyToBrokerUrl()
	if proxied == "" {
		return p.upstream, nil
	}
	p.mu.Lock()
	c.info.ProxiedTo = proxied
	known := p.brokers[proxied]
	p.mu.Unlock()
	if !known {
		return "", fmt.Errorf("CONNECT asks for broker %q, which no lookup through this proxy named; refused", proxied)
	}
	return proxied, nil
}

func (p *Proxy) setBroker(c *proxyConn, target string) {
	p.mu.Lock()
	c.info.Broker = target
	p.mu.Unlock()
}

func (p *Proxy) finish(c *proxyConn) {
	c.close()
	p.mu.Lock()
	defer p.mu.Unlock()
	c.info.Closed = time.Now()
	delete(p.conns, c.info.ID)
	p.ended = append(p.ended, c.info)
}

// pump forwards frames from src to dst, recording each before it is
// written: whatever the receiver acts on has been recorded. It writes what
// it has whenever src has nothing more buffered, so latency is unchanged
// and bursts go out in few writes. A stream that stops looking like frames
// is forwarded raw. It returns its direction when src ends.
func (p *Proxy) pump(c *proxyConn, src *bufio.Reader, first []byte, dst net.Conn, dir Direction) Direction {
	out := bufio.NewWriterSize(dst, 64<<10)
	defer func() { _ = out.Flush() }()
	frame := first
	if frame == nil {
		var err error
		if frame, err = readFrame(src, nil); err != nil {
			p.forwardTail(c, src, out, dst, frame, err, dir)
			return dir
		}
	}
	for {
		if _, err := out.Write(p.inspect(c, dir, frame)); err != nil {
			return dir
		}
		if src.Buffered() == 0 {
			if out.Flush() != nil {
				return dir
			}
		}
		var err error
		if frame, err = readFrame(src, frame); err != nil {
			p.forwardTail(c, src, out, dst, frame, err, dir)
			return dir
		}
	}
}

// forwardTail handles the end of a stream: a truncated frame is passed on as
// it came, and a stream that is not Pulsar framing is copied undecoded.
func (p *Proxy) forwardTail(c *proxyConn, src *bufio.Reader, out *bufio.Writer, dst net.Conn, partial []byte, err error, dir Direction) {
	if _, werr := out.Write(partial); werr != nil || out.Flush() != nil {
		return
	}
	switch {
	case errors.Is(err, pb.ErrFrameSize):
		p.report(c.info.ID, "%v: %v; forwarding the rest undecoded", dir, err)
		_, _ = io.Copy(dst, src)
	case errors.Is(err, io.ErrUnexpectedEOF):
		p.report(c.info.ID, "%v: stream ended inside a frame (%d bytes of it forwarded)", dir, len(partial))
	}
}

// proxyConn is one client connection and the broker connection paired
// with it.
type proxyConn struct {
	info Connection // guarded by Proxy.mu

	mu       sync.Mutex
	client   net.Conn
	upstream net.Conn
	closed   bool
}

// attach pairs the broker connection unless the pair was closed meanwhile.
func (c *proxyConn) attach(up net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.upstream = up
	return true
}

func (c *proxyConn) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.closed = true
	_ = c.client.Close()
	if c.upstream != nil {
		_ = c.upstream.Close()
	}
}
