package control

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"sync/atomic"
)

// DefaultMaxConnections caps the control server's open connections. The controller needs a
// few per agent, Prometheus and the kubelet one each.
const DefaultMaxConnections = 64

// limitListener caps open connections. When every slot is taken, a new connection evicts the
// oldest one that has not yet presented the bearer token; only when every open connection
// has authenticated is the newcomer closed at once.
//
// Why evict rather than block or refuse: a slow client holds its slot until the header
// timeout, so blocking Accept queues the controller behind every slow peer, and refusing
// newcomers lets slow peers keep the slots forever. A peer that sends its headers at once
// (the controller) authenticates within milliseconds of being accepted, long before the slow
// peers accepted after it push it out as the oldest unauthenticated connection.
type limitListener struct {
	net.Listener
	max int

	mu    sync.Mutex
	conns []*limitedConn // open, oldest first
}

func newLimitListener(l net.Listener, max int) *limitListener {
	return &limitListener{Listener: l, max: max}
}

// Accept returns the next connection that gets a slot.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		lc := &limitedConn{Conn: c, owner: l}
		if l.admit(lc) {
			return lc, nil
		}
		_ = c.Close()
	}
}

// admit gives c a slot, evicting the oldest unauthenticated connection if there is none free.
func (l *limitListener) admit(c *limitedConn) bool {
	l.mu.Lock()
	var evicted *limitedConn
	if len(l.conns) >= l.max {
		for _, old := range l.conns {
			if !old.trusted.Load() {
				evicted = old
				break
			}
		}
		if evicted == nil {
			l.mu.Unlock()
			return false
		}
		l.removeLocked(evicted)
	}
	l.conns = append(l.conns, c)
	l.mu.Unlock()
	if evicted != nil {
		_ = evicted.Close() // the server's goroutine for it fails its next read and ends
	}
	return true
}

func (l *limitListener) removeLocked(c *limitedConn) {
	for i, x := range l.conns {
		if x == c {
			l.conns = append(l.conns[:i], l.conns[i+1:]...)
			return
		}
	}
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
	owner   *limitListener
	trusted atomic.Bool // set once a request on it carried the right token
	once    sync.Once
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
