package sidecar

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/semaphore"

	"github.com/subflow-dev/subflow/agent/internal/startgate"
	"github.com/subflow-dev/subflow/agent/protocol"
)

// DefaultListenAddr is where applications find the sidecar: Pulsar's default service port on
// loopback, so that pulsar://localhost:6650 reaches it.
const DefaultListenAddr = "127.0.0.1:6650"

// Defaults of Options.
const (
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultDialTimeout      = 10 * time.Second
	DefaultMaxConnections   = 256
	DefaultFrameTimeout     = 30 * time.Second
	DefaultFrameMemory      = 64 << 20
)

// Options configure a sidecar.
type Options struct {
	// BrokerURL is the cluster's service URL, pulsar://host:port or pulsar+ssl://host:port:
	// lookups go there, and so does every connection whose CONNECT names no broker. Required.
	// With pulsar+ssl every broker connection is TLS, verified against TLSCAFile (else the
	// system's roots) and the broker's host name.
	BrokerURL string
	// TLSCAFile is a PEM file of the CAs that sign the brokers' certificates, for
	// pulsar+ssl.
	TLSCAFile string
	// ListenAddr is the data listener; empty means DefaultListenAddr. It must be a loopback
	// address unless AllowNonLoopback is set: client to sidecar is plaintext.
	ListenAddr string
	// AllowNonLoopback permits a ListenAddr that is not loopback. Ask for it explicitly.
	AllowNonLoopback bool
	// MaxFrameSize bounds a frame's size field in both directions; zero means
	// DefaultMaxFrameSize. A connection that sends a larger frame is closed. Raise it with the
	// broker's maxMessageSize.
	MaxFrameSize int
	// HandshakeTimeout bounds the wait for a new connection's CONNECT; zero means
	// DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// MaxConnections bounds the client connections open at once; zero means
	// DefaultMaxConnections. One more is closed as soon as it is accepted, with the reason
	// logged.
	MaxConnections int
	// FrameTimeout bounds how long a client may take to send a frame once it has begun it;
	// zero means DefaultFrameTimeout. A client that takes longer has its connection closed.
	// Between frames a connection may stay idle as long as the client likes.
	FrameTimeout time.Duration
	// FrameMemory bounds the bytes of client frames being read at once, beyond the first
	// 64 KiB of each: a frame that does not fit waits for the others (within FrameTimeout).
	// Zero means DefaultFrameMemory; it is at least one frame of MaxFrameSize.
	FrameMemory int64
	// DialTimeout bounds connecting to a broker; zero means DefaultDialTimeout.
	DialTimeout time.Duration
	// StrictPause makes a pause take back what the client had buffered: the sidecar closes
	// the client's consumer (a CLOSE_CONSUMER, as a broker sends on an unload) without closing
	// it on the broker, the client drops its receiver queue and subscribes again, and the
	// sidecar answers that SUBSCRIBE itself. SetState(Paused) returns once the client has
	// subscribed again; on Running the broker is asked to redeliver the consumer's
	// unacknowledged messages. See docs/sidecar.md for what each client still hands over.
	StrictPause bool
	// StartGated makes consumers start Paused until MarkSynced (the controller's first push)
	// or SyncTimeout, after which FallbackState applies until MarkSynced: a pod started
	// during a pause consumes nothing before the controller has told it so. As the agent's
	// option of the same name (agent.Options).
	StartGated bool
	// SyncTimeout bounds the StartGated wait; zero means agent.DefaultSyncTimeout.
	SyncTimeout time.Duration
	// FallbackState applies when SyncTimeout passes unsynced; empty means Running.
	FallbackState protocol.State
	// Name is what the sidecar reports for itself (the pod name).
	Name string
	// Logger receives structured logs.
	Logger logr.Logger
}

// Sidecar is a running protocol proxy between the applications of a pod and the brokers.
type Sidecar struct {
	opts     Options
	log      logr.Logger
	upstream string      // host:port of BrokerURL
	tls      *tls.Config // for pulsar+ssl; nil for plaintext brokers
	// frameMemory holds Options.FrameMemory, shared by the client frames being read.
	frameMemory *semaphore.Weighted

	mu          sync.Mutex
	conns       map[uint64]*conn
	nextConn    uint64
	consumers   map[*Consumer]bool
	onSubscribe []func(*Consumer)
	routes      map[string]route        // brokers named by lookups, which a CONNECT may ask for
	detaching   map[chan struct{}]*conn // consumer closes passed on that the client has not processed yet
	startGate   *startgate.Gate

	wg sync.WaitGroup
}

// route says how to reach a broker a lookup named.
type route int

const (
	// direct: the upstream answered as a broker; the sidecar dials the named broker.
	direct route = iota + 1
	// viaUpstream: the upstream is itself a Pulsar proxy (its lookup answers route through
	// it); the sidecar dials the upstream and forwards the CONNECT that names the broker.
	viaUpstream
)

// New checks opts and returns a sidecar; Serve or ListenAndServe runs it.
func New(opts Options) (*Sidecar, error) {
	upstream, secure, err := brokerHostPort(opts.BrokerURL)
	if err != nil {
		return nil, fmt.Errorf("sidecar: broker URL: %w", err)
	}
	var tlsConfig *tls.Config
	if secure {
		if tlsConfig, err = brokerTLS(opts.TLSCAFile); err != nil {
			return nil, fmt.Errorf("sidecar: %w", err)
		}
	} else if opts.TLSCAFile != "" {
		return nil, fmt.Errorf("sidecar: a TLS CA file is given but the broker URL %q is not pulsar+ssl://", opts.BrokerURL)
	}
	if opts.ListenAddr == "" {
		opts.ListenAddr = DefaultListenAddr
	}
	if !opts.AllowNonLoopback && !isLoopbackAddr(opts.ListenAddr) {
		return nil, fmt.Errorf("sidecar: listen address %q is not loopback: clients talk plaintext to the sidecar, so a wider listener must be asked for explicitly", opts.ListenAddr)
	}
	if opts.MaxFrameSize <= 0 {
		opts.MaxFrameSize = DefaultMaxFrameSize
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = DefaultDialTimeout
	}
	if opts.MaxConnections <= 0 {
		opts.MaxConnections = DefaultMaxConnections
	}
	if opts.FrameTimeout <= 0 {
		opts.FrameTimeout = DefaultFrameTimeout
	}
	if opts.FrameMemory <= 0 {
		opts.FrameMemory = DefaultFrameMemory
	}
	opts.FrameMemory = max(opts.FrameMemory, 4+int64(opts.MaxFrameSize))
	s := &Sidecar{opts: opts, log: opts.Logger, upstream: upstream, tls: tlsConfig, conns: map[uint64]*conn{},
		frameMemory: semaphore.NewWeighted(opts.FrameMemory),
		consumers:   map[*Consumer]bool{}, routes: map[string]route{}, detaching: map[chan struct{}]*conn{}}
	if err := s.newStartGate(); err != nil {
		return nil, err
	}
	return s, nil
}

// brokerHostPort accepts pulsar://host:port and pulsar+ssl://host:port.
func brokerHostPort(raw string) (hostPort string, secure bool, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", false, err
	}
	switch u.Scheme {
	case "pulsar":
	case "pulsar+ssl":
		secure = true
	default:
		return "", false, fmt.Errorf("%q: want pulsar://host:port or pulsar+ssl://host:port", raw)
	}
	if _, _, err := net.SplitHostPort(u.Host); err != nil {
		return "", false, fmt.Errorf("%q: %w", raw, err)
	}
	return u.Host, secure, nil
}

// brokerTLS verifies brokers against the CAs in caFile, or the system's roots without one.
// The host name is set per connection, from the broker dialed.
func brokerTLS(caFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile == "" {
		return cfg, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("TLS CA file: %w", err)
	}
	cfg.RootCAs = x509.NewCertPool()
	if !cfg.RootCAs.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("TLS CA file %s holds no PEM certificate", caFile)
	}
	return cfg, nil
}

// dial connects to a broker, with TLS and host name verification for pulsar+ssl.
func (s *Sidecar) dial(addr string) (net.Conn, error) {
	dialer := &net.Dialer{Timeout: s.opts.DialTimeout}
	if s.tls == nil {
		return dialer.Dial("tcp", addr)
	}
	host, _, _ := net.SplitHostPort(addr)
	cfg := s.tls.Clone()
	cfg.ServerName = host
	return (&tls.Dialer{NetDialer: dialer, Config: cfg}).Dial("tcp", addr)
}

// hostPortOf reads a broker address as clients and brokers write it: host:port, or a
// pulsar:// URL.
func hostPortOf(addr string) (string, error) {
	if strings.Contains(addr, "://") {
		u, err := url.Parse(addr)
		if err != nil {
			return "", err
		}
		addr = u.Host
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return "", err
	}
	return addr, nil
}

func isLoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Name is the name the sidecar reports for itself.
func (s *Sidecar) Name() string { return s.opts.Name }

// ListenAndServe serves on Options.ListenAddr until ctx ends.
func (s *Sidecar) ListenAndServe(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.opts.ListenAddr)
	if err != nil {
		return err
	}
	return s.Serve(ctx, ln)
}

// Serve accepts clients on ln until ctx ends; then it closes ln and every connection, and
// returns once they are all gone. Applications see their connections drop and reconnect to
// the next sidecar process, like after a broker restart.
func (s *Sidecar) Serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	s.log.Info("Serving Pulsar clients", "listen", ln.Addr().String(), "broker", s.opts.BrokerURL)
	var err error
	for {
		var nc net.Conn
		if nc, err = ln.Accept(); err != nil {
			break
		}
		c := s.register(nc)
		if c == nil {
			s.log.Info("Connection refused", "client", nc.RemoteAddr().String(),
				"reason", fmt.Sprintf("%d connections open, the most allowed", s.opts.MaxConnections))
			_ = nc.Close()
			continue
		}
		s.wg.Add(1)
		go func() { defer s.wg.Done(); c.serve() }()
	}
	s.closeAll()
	s.wg.Wait()
	if ctx.Err() != nil && errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// register tracks a new connection, or returns nil when MaxConnections are open.
func (s *Sidecar) register(nc net.Conn) *conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.conns) >= s.opts.MaxConnections {
		return nil
	}
	s.nextConn++
	c := newConn(s, s.nextConn, nc)
	s.conns[c.id] = c
	return c
}

func (s *Sidecar) unregister(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c.id)
}

func (s *Sidecar) closeAll() {
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.shutdown("the sidecar stops")
	}
}

// OnSubscribe registers fn to run for every consumer the sidecar sees subscribe, before its
// SUBSCRIBE goes on to the broker: a state set from fn (the rules in force) applies from the
// consumer's first permit on.
func (s *Sidecar) OnSubscribe(fn func(*Consumer)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onSubscribe = append(s.onSubscribe, fn)
}

// Consumers returns the consumers of every open client connection, ordered by name.
func (s *Sidecar) Consumers() []*Consumer {
	s.mu.Lock()
	out := make([]*Consumer, 0, len(s.consumers))
	for c := range s.consumers {
		out = append(out, c)
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b *Consumer) int {
		return strings.Compare(a.name+"\x00"+a.topic, b.name+"\x00"+b.topic)
	})
	return out
}

// added registers a new consumer, gives it the start-up gate's state and runs the
// OnSubscribe hooks (the rules in force may set another).
func (s *Sidecar) added(c *Consumer) {
	s.mu.Lock()
	s.consumers[c] = true
	hooks := slices.Clone(s.onSubscribe)
	s.mu.Unlock()
	c.startIn()
	for _, fn := range hooks {
		fn(c)
	}
}

func (s *Sidecar) removed(c *Consumer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.consumers, c)
}

// learnRoute remembers a broker a lookup answer or a close named.
func (s *Sidecar) learnRoute(broker string, r route) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.routes[broker] = r
}

// target picks where to dial for a CONNECT: the upstream when it names no broker or the
// upstream itself, else a broker a lookup through this sidecar named. Any other broker is
// refused, so that the sidecar cannot be used to reach arbitrary hosts.
func (s *Sidecar) target(proxyTo string) (string, error) {
	if proxyTo == "" {
		return s.upstream, nil
	}
	broker, err := hostPortOf(proxyTo)
	if err != nil {
		return "", fmt.Errorf("CONNECT names broker %q: %w", proxyTo, err)
	}
	if broker == s.upstream {
		return s.upstream, nil
	}
	s.mu.Lock()
	r := s.routes[broker]
	s.mu.Unlock()
	switch r {
	case direct:
		return broker, nil
	case viaUpstream:
		return s.upstream, nil
	}
	return "", fmt.Errorf("CONNECT names broker %q, which no lookup through this sidecar named; refused", proxyTo)
}

// detachTimeout bounds how long a lookup answer waits for clients to process the consumer
// closes passed on to them.
const detachTimeout = time.Second

// detached records a consumer close passed on to a client (a strict pause's, the broker's, or
// a refused re-subscribe's) that the client has not processed yet: pong closes once it has
// (the answer to a PING sent after the close).
func (s *Sidecar) detached(pong chan struct{}, c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.detaching[pong] = c
}

// forgetDetach drops a record once the client answered, or when its connection ends.
func (s *Sidecar) forgetDetach(pong chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.detaching, pong)
}

func (s *Sidecar) forgetDetachesOf(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for pong, owner := range s.detaching {
		if owner == c {
			delete(s.detaching, pong)
		}
	}
}

// awaitDetaches holds a lookup answer until every client told its consumer was closed has
// processed that close. pulsar-client-go v0.21 removes a closed consumer's handler from its
// connection only after notifying the consumer (connection.go, handleCloseConsumer), so a
// re-subscribe whose lookup came back in between (on the lookup connection, read by another
// goroutine) would register its new handler first and have it removed: the consumer then
// drops every message ("Got unexpected message") and never hears of a later connection loss,
// so it stops for good (apache/pulsar-client-go#1461). The lookup is the first step of every
// re-subscribe, and the client answers the PING after the close only once that close is
// handled. It waits at most detachTimeout in all, however many clients do not answer, so none
// holds anybody for long.
func (s *Sidecar) awaitDetaches() {
	s.mu.Lock()
	pending := make(map[chan struct{}]*conn, len(s.detaching))
	for pong, c := range s.detaching {
		pending[pong] = c
	}
	s.mu.Unlock()
	if len(pending) == 0 {
		return
	}
	// One deadline for all: its Done channel, once closed, stays closed.
	deadline, cancel := context.WithTimeout(context.Background(), detachTimeout)
	defer cancel()
	for pong, c := range pending {
		select {
		case <-pong:
		case <-c.life.Done():
		case <-deadline.Done():
		}
		s.mu.Lock()
		delete(s.detaching, pong)
		s.mu.Unlock()
	}
}
