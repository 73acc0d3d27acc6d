package control

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultMaxConnections caps the control server's open connections. The controller needs a
// few per agent, Prometheus and the kubelet one each; the rest is room for peers that the
// cap has to push out.
const DefaultMaxConnections = 128

// evictionGrace protects a new connection from eviction long enough to send its request
// headers: the controller writes its push right after connecting.
const evictionGrace = 100 * time.Millisecond

// limitListener caps open connections. When every slot is taken, the oldest connection that
// has not presented the bearer token is closed for the newcomer, once it has been open for
// evictionGrace; until then Accept waits (the newcomer stays in the kernel's accept queue).
// When every open connection has authenticated, the newcomer is closed at once.
//
// Why evict rather than only block or refuse: a slow client holds its slot until the header
// timeout, so blocking Accept alone queues the controller behind every slow peer, and refusing
// newcomers lets slow peers keep the slots. Why the grace: without it a burst of reconnecting
// slow peers could push out the controller's connection before its goroutine has read the
// headers that would authenticate it. Accept waits at most evictionGrace per slot, so a
// newcomer waits about (connections queued before it / cap) * evictionGrace.
type limitListener struct {
	net.Listener
	max int

	mu     sync.Mutex
	conns  []*limitedConn // open, oldest first
	freed  chan struct{}  // signalled when a slot frees
	closed chan struct{}
	once   sync.Once
}

func newLimitListener(l net.Listener, max int) *limitListener {
	return &limitListener{Listener: l, max: max, freed: make(chan struct{}, 1), closed: make(chan struct{})}
}

// Accept returns the next connection that gets a slot.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		lc := &limitedConn{Conn: c, owner: l, accepted: time.Now()}
		admitted, err := l.admit(lc)
		if admitted {
			return lc, nil
		}
		_ = c.Close()
		if err != nil {
			return nil, err
		}
	}
}

// admit gives c a slot, evicting the oldest unauthenticated connection if none is free. It
// reports false when every open connection has authenticated, or the listener closed.
func (l *limitListener) admit(c *limitedConn) (bool, error) {
	for {
		evicted, wait, ok := l.tryAdmit(c)
		if evicted != nil {
			_ = evicted.Close() // the server's goroutine for it fails its next read and ends
		}
		if ok || wait == 0 {
			return ok, nil
		}
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-l.freed:
			timer.Stop()
		case <-l.closed:
			timer.Stop()
			return false, net.ErrClosed
		}
	}
}

// tryAdmit admits c if it can now; otherwise it tells how long to wait (zero: refuse).
func (l *limitListener) tryAdmit(c *limitedConn) (evicted *limitedConn, wait time.Duration, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.conns) >= l.max {
		for _, old := range l.conns {
			if !old.trusted.Load() {
				evicted = old
				break
			}
		}
		if evicted == nil {
			return nil, 0, false
		}
		if age := time.Since(evicted.accepted); age < evictionGrace {
			return nil, evictionGrace - age, false
		}
		l.removeLocked(evicted)
	}
	l.conns = append(l.conns, c)
	return evicted, 0, true
}

func (l *limitListener) removeLocked(c *limitedConn) {
	for i, x := range l.conns {
		if x == c {
			l.conns = append(l.conns[:i], l.conns[i+1:]...)
			select {
			case l.freed <- struct{}{}:
			default:
			}
			return
		}
	}
}

// Close stops accepting, also a newcomer waiting for a slot.
func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// open is the number of connections holding a slot.
func (l *limitListener) open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// limitedConn is a connection holding a slot until it is closed.
type limitedConn struct {
	net.Conn
	owner    *limitListener
	accepted time.Time
	trusted  atomic.Bool // set once a request on it carried the right token
	once     sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.owner.mu.Lock()
		c.owner.removeLocked(c)
		c.owner.mu.Unlock()
	})
	return err
}

// connKey carries the request's connection in its context (http.Server.ConnContext).
type connKey struct{}

func withConn(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// trustConn marks the request's connection as authenticated, so that it is never evicted.
func trustConn(ctx context.Context) {
	c, _ := ctx.Value(connKey{}).(net.Conn)
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if lc, ok := c.(*limitedConn); ok {
		lc.trusted.Store(true)
	}
}
