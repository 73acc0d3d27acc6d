package control_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/subflow-dev/subflow/agent"
	"github.com/subflow-dev/subflow/agent/control"
	"github.com/subflow-dev/subflow/agent/protocol"
	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
)

// putAt pushes req for flow ns/{flow} to the agent at addr.
func putAt(t *testing.T, addr, flow string, req protocol.FlowRequest) (int, protocol.FlowStatus) {
	t.Helper()
	body, _ := json.Marshal(req)
	code, out := call(t, http.MethodPut, "http://"+addr+protocol.PathPrefix+"/flows/ns/"+flow, token, string(body))
	var status protocol.FlowStatus
	if code == http.StatusOK {
		if err := json.Unmarshal([]byte(out), &status); err != nil {
			t.Fatalf("decoding %s: %v", out, err)
		}
	}
	return code, status
}

// waitSeek pushes req again, as the controller does, until its seek is no longer running.
func waitSeek(t *testing.T, addr, flow string, req protocol.FlowRequest) protocol.FlowStatus {
	t.Helper()
	var st protocol.FlowStatus
	eventually(t, "the seek to finish", func() bool {
		var code int
		code, st = putAt(t, addr, flow, req)
		return code == http.StatusOK && st.Seek != nil && st.Seek.State != protocol.SeekRunning
	})
	return st
}

// testPod is an agent with one Shared consumer and its control server, built with options
// the simulated pods do not offer. Its application receives only while receiving is on.
type testPod struct {
	addr     string
	agent    *agent.Agent
	consumer *agent.Consumer
	registry *prometheus.Registry

	mu        sync.Mutex
	payloads  []string
	receiving bool
	wake      chan struct{}
}

func startTestPod(t testing.TB, b *pulsartest.Broker, name, topic, adminURL string, receiving bool, opts control.Options) *testPod {
	t.Helper()
	return startTestPodWith(t, b, agent.Options{Name: name, AdminURL: adminURL}, topic, receiving, opts)
}

// startTestPodWith is startTestPod with the agent's options given.
func startTestPodWith(t testing.TB, b *pulsartest.Broker, agentOpts agent.Options, topic string, receiving bool, opts control.Options) *testPod {
	t.Helper()
	p := &testPod{registry: prometheus.NewRegistry(), receiving: receiving, wake: make(chan struct{}, 1)}
	name := agentOpts.Name
	agentOpts.Registerer = p.registry
	var err error
	p.agent, err = agent.New(agentOpts)
	if err != nil {
		t.Fatal(err)
	}
	opts.Token = token
	srv, err := control.New(p.agent, opts)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = l.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = srv.Serve(ctx, l) }()
	client, err := pulsar.NewClient(pulsar.ClientOptions{URL: b.ServiceURL(), Logger: log.DefaultNopLogger()})
	if err != nil {
		t.Fatal(err)
	}
	p.consumer, err = p.agent.Subscribe(client, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub",
		Type: pulsar.Shared, Name: name, ReceiverQueueSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); p.consume(ctx) }()
	t.Cleanup(func() {
		cancel()
		p.consumer.Close()
		wg.Wait()
		client.Close()
		p.agent.Close()
	})
	return p
}

func (p *testPod) consume(ctx context.Context) {
	for {
		p.mu.Lock()
		on := p.receiving
		p.mu.Unlock()
		if !on {
			select {
			case <-p.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		msg, err := p.consumer.Receive(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		p.mu.Lock()
		p.payloads = append(p.payloads, string(msg.Payload()))
		p.mu.Unlock()
		_ = p.consumer.Ack(msg)
	}
}

// startReceiving lets the application receive from now on.
func (p *testPod) startReceiving() {
	p.mu.Lock()
	p.receiving = true
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *testPod) received() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.payloads...)
}

// adminGate is a reverse proxy to the broker's admin API that holds requests (those whose
// path contains hold; all when empty) until opened, so that a test controls how long a seek
// takes and in which phase it waits. It counts the requests by path.
type adminGate struct {
	url    string
	hold   string
	opened chan struct{}
	once   sync.Once

	mu    sync.Mutex
	paths []string
}

func newAdminGate(t *testing.T, adminURL, hold string) *adminGate {
	t.Helper()
	target, err := url.Parse(adminURL)
	if err != nil {
		t.Fatal(err)
	}
	g := &adminGate{hold: hold, opened: make(chan struct{})}
	proxy := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		g.paths = append(g.paths, r.URL.Path)
		g.mu.Unlock()
		if strings.Contains(r.URL.Path, g.hold) {
			select {
			case <-g.opened:
			case <-r.Context().Done():
				return
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(g.open) // before srv.Close: release held requests
	g.url = srv.URL
	return g
}

func (g *adminGate) open() { g.once.Do(func() { close(g.opened) }) }

// requests counts the requests whose path contains part.
func (g *adminGate) requests(part string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, p := range g.paths {
		if strings.Contains(p, part) {
			n++
		}
	}
	return n
}

// waitAcked waits until the broker saw n acknowledgements on topic's subscription "sub":
// a seek must not race the client's grouped acks.
func waitAcked(t *testing.T, b *pulsartest.Broker, topic string, n int64) {
	t.Helper()
	eventually(t, "acks to reach the broker", func() bool { return b.Subscription(topic, "sub").Acked >= n })
}

// timedPut is putAt that fails the test when the answer takes longer than limit.
func timedPut(t *testing.T, addr, flow string, req protocol.FlowRequest, limit time.Duration) (int, protocol.FlowStatus, time.Duration) {
	t.Helper()
	body, _ := json.Marshal(req)
	httpReq, err := http.NewRequest(http.MethodPut, "http://"+addr+protocol.PathPrefix+"/flows/ns/"+flow, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	httpReq.Header.Set("Authorization", "Bearer "+token)
	httpReq.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := (&http.Client{Timeout: limit}).Do(httpReq)
	if err != nil {
		t.Fatalf("push not answered within %s: %v", limit, err)
	}
	defer resp.Body.Close()
	took := time.Since(start)
	var status protocol.FlowStatus
	if resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(&status); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode, status, took
}

// newBareServer is the control server, built with opts, of an agent without consumers.
func newBareServer(t *testing.T, opts control.Options) *control.Server {
	t.Helper()
	a, err := agent.New(agent.Options{Name: "pod-a"})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := control.New(a, opts)
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// serveOnLoopback serves an agent without consumers through Server.Serve (timeouts and the
// connection cap apply, unlike with httptest) and returns its address.
func serveOnLoopback(t *testing.T, opts control.Options) string {
	t.Helper()
	srv := newBareServer(t, opts)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ctx, l) }()
	t.Cleanup(func() { cancel(); <-done })
	return l.Addr().String()
}
