package chaos

import (
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// agentProxy is a pod's stable agent address (the port in its Pod object). It forwards TCP to
// the current agent process, so that an agent can restart behind it, and injects HTTP faults:
// while down, connections are accepted and closed at once.
type agentProxy struct {
	ln     net.Listener
	target atomic.Value // string host:port of the agent process
	down   atomic.Bool
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func newAgentProxy() (*agentProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &agentProxy{ln: ln, conns: map[net.Conn]struct{}{}}
	p.target.Store("")
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *agentProxy) port() int { return p.ln.Addr().(*net.TCPAddr).Port }

func (p *agentProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		target := p.target.Load().(string)
		if p.down.Load() || target == "" {
			_ = c.Close()
			continue
		}
		p.wg.Add(1)
		go p.forward(c, target)
	}
}

func (p *agentProxy) forward(c net.Conn, target string) {
	defer p.wg.Done()
	up, err := net.DialTimeout("tcp", target, time.Second)
	if err != nil {
		_ = c.Close()
		return
	}
	p.track(c, up, true)
	defer p.track(c, up, false)
	done := make(chan struct{})
	go func() { _, _ = io.Copy(up, c); _ = up.(*net.TCPConn).CloseWrite(); close(done) }()
	_, _ = io.Copy(c, up)
	_ = c.Close()
	<-done
	_ = up.Close()
}

func (p *agentProxy) track(a, b net.Conn, add bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if add {
		p.conns[a], p.conns[b] = struct{}{}, struct{}{}
	} else {
		delete(p.conns, a)
		delete(p.conns, b)
	}
}

// setDown makes the agent unreachable (connections closed, open ones cut) or reachable again.
func (p *agentProxy) setDown(down bool) {
	p.down.Store(down)
	if down {
		p.cutAll()
	}
}

func (p *agentProxy) cutAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}

func (p *agentProxy) close() {
	_ = p.ln.Close()
	p.cutAll()
	p.wg.Wait()
}

// adminFaults are the admin API faults in force, shared by every agent's admin proxy.
type adminFaults struct {
	latency atomic.Int64 // nanoseconds before each call
	failing atomic.Bool  // answer 503 to every call
}

// resetRecord is one reset-cursor call an agent process made.
type resetRecord struct {
	Instance     int
	Subscription string
	Path         string
	At           time.Time
}

// adminProxy sits between one agent process and the brokers' admin APIs, one listener per
// broker: it injects the faults in force and records every reset-cursor call a broker carried
// out, which is how a seek moves a cursor. A broker that does not own a topic answers 307 to
// the owner's admin URL; the proxy points that Location at its own listener for the owner, so
// that the agent follows the redirect itself and the call is still seen.
type adminProxy struct {
	servers []*http.Server
	lns     []net.Listener
}

func newAdminProxy(brokerAdmins []string, instance int, faults *adminFaults, record func(resetRecord), redirects *atomic.Int64) (*adminProxy, error) {
	targets := make([]*url.URL, len(brokerAdmins))
	for i, admin := range brokerAdmins {
		var err error
		if targets[i], err = url.Parse(admin); err != nil {
			return nil, err
		}
	}
	p := &adminProxy{}
	for range targets {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			p.close()
			return nil, err
		}
		p.lns = append(p.lns, ln)
	}
	// Location host of broker i -> this proxy's listener i.
	rewrite := map[string]string{}
	for i, t := range targets {
		rewrite[t.Host] = p.lns[i].Addr().String()
	}
	for i, target := range targets {
		rp := httputil.NewSingleHostReverseProxy(target)
		rp.ErrorLog = log.New(io.Discard, "", 0) // a cut request is the fault itself, not news
		rp.ModifyResponse = func(resp *http.Response) error {
			if loc, err := url.Parse(resp.Header.Get("Location")); err == nil && rewrite[loc.Host] != "" {
				loc.Host = rewrite[loc.Host]
				resp.Header.Set("Location", loc.String())
				redirects.Add(1)
			}
			// A reset the broker carried out; a redirected one is seen again at the owner.
			if at, ok := resp.Request.Context().Value(resetStarted{}).(time.Time); ok && resp.StatusCode < 300 {
				record(resetRecord{Instance: instance, Subscription: subscriptionOfPath(resp.Request.URL.Path), Path: resp.Request.URL.Path, At: at})
			}
			return nil
		}
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if d := time.Duration(faults.latency.Load()); d > 0 {
				select {
				case <-time.After(d):
				case <-r.Context().Done():
					return
				}
			}
			if faults.failing.Load() {
				http.Error(w, `{"reason":"injected admin fault"}`, http.StatusServiceUnavailable)
				return
			}
			if r.Method == http.MethodPost && strings.Contains(r.URL.Path, "/resetcursor") {
				// Its consumers are disconnected while the call runs: the record keeps its start.
				r = r.WithContext(context.WithValue(r.Context(), resetStarted{}, time.Now()))
			}
			rp.ServeHTTP(w, r)
		})
		srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
		p.servers = append(p.servers, srv)
		go func() { _ = srv.Serve(p.lns[i]) }()
	}
	return p, nil
}

// resetStarted keys the start time of a reset-cursor call in its request's context.
type resetStarted struct{}

// url is the admin URL the agent is configured with: broker 0's, the leader's.
func (p *adminProxy) url() string { return "http://" + p.lns[0].Addr().String() }

func (p *adminProxy) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, srv := range p.servers {
		_ = srv.Shutdown(ctx)
		_ = srv.Close()
	}
	for _, ln := range p.lns[len(p.servers):] {
		_ = ln.Close() // not yet served
	}
}

// subscriptionOfPath takes the subscription out of .../subscription/{sub}/resetcursor[/...].
func subscriptionOfPath(path string) string {
	parts := strings.Split(path, "/")
	for i := 0; i+1 < len(parts); i++ {
		if parts[i] == "subscription" {
			return parts[i+1]
		}
	}
	return ""
}
