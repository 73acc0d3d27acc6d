package sidecar

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/go-logr/logr/testr"

	"github.com/subflow-dev/subflow/agent/protocol"
	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
)

const waitFor = 60 * time.Second

// world is a broker, the wire recorder in front of it and a sidecar in front of that:
// client -> sidecar -> recorder -> broker. The broker is the real Pulsar at PULSAR_URL and
// PULSAR_ADMIN_URL when they are set, else an in-process pulsartest. The recorder sets
// proxy_through_service_url in lookup answers, so the sidecar meets an upstream that behaves
// as a Pulsar proxy and goes on through it: every sidecar->broker frame is recorded.
type world struct {
	real     bool
	admin    string
	rec      *wirerec.Proxy
	sidecar  *Sidecar
	url      string // the sidecar's service URL, for applications
	brokerTU string // the broker's own service URL, for clients that bypass the sidecar
}

func newWorld(t *testing.T, opts ...Options) *world {
	t.Helper()
	w := &world{}
	if url := os.Getenv("PULSAR_URL"); url != "" {
		w.real, w.brokerTU, w.admin = true, url, os.Getenv("PULSAR_ADMIN_URL")
	} else {
		b := pulsartest.Start(t)
		w.brokerTU, w.admin = b.ServiceURL(), b.AdminURL()
	}
	w.rec = wirerec.StartT(t, w.brokerTU, wirerec.Options{RewriteLookups: true})
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	o.BrokerURL = w.rec.ServiceURL()
	w.sidecar, w.url = startSidecar(t, o)
	return w
}

func needRealBroker(t *testing.T) {
	t.Helper()
	if os.Getenv("PULSAR_URL") == "" {
		t.Skip("needs a real Pulsar: run under hack/pulsar/pulsar.sh exec -- (sets PULSAR_URL and PULSAR_ADMIN_URL)")
	}
}

// startSidecar serves a sidecar on a random loopback port until the test ends.
func startSidecar(t *testing.T, o Options) (*Sidecar, string) {
	t.Helper()
	o.Logger = testr.NewWithOptions(t, testr.Options{Verbosity: 1})
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return s, "pulsar://" + serveOnLoopback(t, "sidecar", s.Serve)
}

// serveOnLoopback runs serve on a random loopback port until the test ends, fails the test if
// it then returns an error, and returns the address.
func serveOnLoopback(t *testing.T, what string, serve func(context.Context, net.Listener) error) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("%s: %v", what, err)
		}
	})
	return ln.Addr().String()
}

var topicSeq atomic.Int64

func uniqueTopic(t testing.TB) string {
	name := strings.NewReplacer("/", "-", " ", "-").Replace(strings.ToLower(t.Name()))
	return fmt.Sprintf("persistent://public/default/%s-%d-%d", name, time.Now().UnixNano(), topicSeq.Add(1))
}

// unload unloads a topic through the admin API: the broker closes its consumers.
func (w *world) unload(t *testing.T, topic string) {
	t.Helper()
	w.adminPut(t, "/admin/v2/persistent/"+strings.TrimPrefix(topic, "persistent://")+"/unload", "")
}

// adminPut makes a PUT to the admin API with a JSON body (none when empty) and fails t unless
// it succeeds.
func (w *world) adminPut(t *testing.T, path, body string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPut, w.admin+path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("PUT %s: %s", path, resp.Status)
	}
}

// createPartitioned creates a partitioned topic through the admin API.
func (w *world) createPartitioned(t *testing.T, topic string, partitions int) {
	t.Helper()
	w.adminPut(t, "/admin/v2/persistent/"+strings.TrimPrefix(topic, "persistent://")+"/partitions", fmt.Sprint(partitions))
}

func newClient(t testing.TB, url string) pulsar.Client {
	t.Helper()
	c, err := pulsar.NewClient(pulsar.ClientOptions{URL: url, OperationTimeout: 30 * time.Second,
		ConnectionTimeout: 10 * time.Second, Logger: log.DefaultNopLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func subscribe(t testing.TB, c pulsar.Client, opts pulsar.ConsumerOptions) pulsar.Consumer {
	t.Helper()
	if opts.SubscriptionInitialPosition == pulsar.SubscriptionPositionLatest {
		opts.SubscriptionInitialPosition = pulsar.SubscriptionPositionEarliest
	}
	cons, err := c.Subscribe(opts)
	if err != nil {
		t.Fatalf("subscribe %s/%s: %v", opts.Topic, opts.SubscriptionName, err)
	}
	t.Cleanup(cons.Close)
	return cons
}

// produce sends "<prefix>-<i>" for i in [from, to) and waits for every receipt; SendAsync
// lets a batching producer group them.
func produce(t testing.TB, c pulsar.Client, topic, prefix string, from, to int) []string {
	t.Helper()
	return produceWith(t, c, pulsar.ProducerOptions{Topic: topic}, prefix, from, to)
}

// produceUnbatched sends one entry per message, so that the broker's dispatch follows the
// permits message by message.
func produceUnbatched(t *testing.T, c pulsar.Client, topic, prefix string, from, to int) []string {
	t.Helper()
	return produceWith(t, c, pulsar.ProducerOptions{Topic: topic, DisableBatching: true}, prefix, from, to)
}

func produceWith(t testing.TB, c pulsar.Client, opts pulsar.ProducerOptions, prefix string, from, to int) []string {
	t.Helper()
	topic := opts.Topic
	p, err := c.CreateProducer(opts)
	if err != nil {
		t.Fatalf("create producer on %s: %v", topic, err)
	}
	defer p.Close()
	errs := make(chan error, to-from)
	var values []string
	for i := from; i < to; i++ {
		v := fmt.Sprintf("%s-%d", prefix, i)
		values = append(values, v)
		p.SendAsync(context.Background(), &pulsar.ProducerMessage{Payload: []byte(v)},
			func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) { errs <- err })
	}
	if err := p.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	for range to - from {
		if err := <-errs; err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	return values
}

func receiveN(t *testing.T, c pulsar.Consumer, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	var out []string
	for len(out) < n {
		m, err := c.Receive(ctx)
		if err != nil {
			t.Fatalf("received %d of %d: %v", len(out), n, err)
		}
		_ = c.Ack(m)
		out = append(out, string(m.Payload()))
	}
	return out
}

// common returns the values of want that are in got.
func common(want, got []string) []string {
	seen := map[string]bool{}
	for _, v := range got {
		seen[v] = true
	}
	var out []string
	for _, v := range want {
		if seen[v] {
			out = append(out, v)
		}
	}
	return out
}

// drain takes, and acknowledges, what the consumer has ready now.
func drain(c pulsar.Consumer) []string {
	var out []string
	for {
		select {
		case m := <-c.Chan():
			_ = c.Ack(m.Message)
			out = append(out, string(m.Payload()))
		default:
			return out
		}
	}
}

// eventually polls cond until it holds, failing the test after waitFor.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testkit.Poll{Within: waitFor, Every: 20 * time.Millisecond}.Eventually(t, what, cond)
}

// consumerNamed waits until the sidecar tracks a consumer of that name on the subscription.
func consumerNamed(t *testing.T, s *Sidecar, subscription, name string) *Consumer {
	t.Helper()
	var found *Consumer
	eventually(t, "the sidecar to see consumer "+name+" subscribe", func() bool {
		for _, c := range s.Consumers() {
			if c.Subscription() == subscription && c.Name() == name && c.Status().Connected {
				found = c
				return true
			}
		}
		return false
	})
	return found
}

var generation atomic.Int64

// setState applies a state as the control server will, with a fresh generation.
func setState(t *testing.T, c *Consumer, state protocol.State) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if err := c.SetState(ctx, state, generation.Add(1)); err != nil {
		t.Fatalf("SetState(%s) on %s: %v", state, c.Name(), err)
	}
}

// pauseOnSubscribe makes every consumer of that name start Paused, as the rules in force do
// for a consumer that subscribes during a pause.
func pauseOnSubscribe(s *Sidecar, name string) {
	s.OnSubscribe(func(c *Consumer) {
		if c.Name() == name {
			_ = c.SetState(context.Background(), protocol.Paused, generation.Add(1))
		}
	})
}

func missing(want, got []string) []string {
	seen := map[string]bool{}
	for _, v := range got {
		seen[v] = true
	}
	var out []string
	for _, v := range want {
		if !seen[v] {
			out = append(out, v)
		}
	}
	return out
}

// peer is a consumer application running as a process of its own (hack/clients): the Go,
// Java or Python client, unmodified, reporting each message its application received.
type peer struct {
	lang  string
	cmd   *exec.Cmd
	stdin io.WriteCloser

	mu       sync.Mutex
	received []string
	// receivedAt is when the application got each message (the peer's clock, this machine's).
	receivedAt []time.Time
	ready      bool
	failure    string
	exited     chan struct{}
	// droppedFrames is set when the Go client logs that a MESSAGE arrived for a consumer it
	// has no handler for: pulsar-client-go v0.21.0 loses a consumer's handler when its
	// re-subscribe beats the reader's removal of the closed one, unless the sidecar holds the
	// lookup answer until the close is handled (Sidecar.awaitDetaches).
	droppedFrames bool
}

// clientDroppedFrames reports whether the peer's client library dropped frames for a
// consumer it had lost track of (see droppedFrames).
func (p *peer) clientDroppedFrames() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.droppedFrames
}

// awaitReplay waits for cond, the application receiving what follows a seek or a strict
// pause (both close the client's consumer, which subscribes again), and fails at
// once, naming the cause, if the client dropped frames: the sidecar did not shield it.
func (p *peer) awaitReplay(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventually(t, what, func() bool {
		if cond() {
			return true
		}
		if p.clientDroppedFrames() {
			t.Fatalf("%s: the %s client dropped MESSAGE frames for a consumer whose handler it lost on "+
				"re-subscribing; the sidecar's lookup hold did not shield it", what, p.lang)
		}
		return false
	})
}

type peerOptions struct {
	topic, subscription, name, subType string
	queue, delayMs                     int
	chunkExpiryMs                      int // the Java peer's incomplete-chunk expiry; 0: its default
}

var (
	goPeerOnce sync.Once
	goPeerPath string
	goPeerErr  error
)

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// peerCommand returns the command line of a peer, or skips the test when its tools are absent.
func peerCommand(t testing.TB, lang string) []string {
	t.Helper()
	root := repoRoot()
	switch lang {
	case "go":
		goPeerOnce.Do(func() {
			dir, err := os.MkdirTemp("", "subflow-gopeer")
			if err != nil {
				goPeerErr = err
				return
			}
			goPeerPath = filepath.Join(dir, "gopeer")
			build := exec.Command("go", "build", "-o", goPeerPath, "./hack/clients/gopeer")
			build.Dir = root
			out, err := build.CombinedOutput()
			if err != nil {
				goPeerErr = fmt.Errorf("%v: %s", err, out)
			}
		})
		if goPeerErr != nil {
			t.Fatalf("build the Go peer: %v", goPeerErr)
		}
		return []string{goPeerPath}
	case "java":
		for _, tool := range []string{"java", "javac", "mvn"} {
			if _, err := exec.LookPath(tool); err != nil {
				t.Skipf("the Java peer needs %s (a JDK 17 and Maven)", tool)
			}
		}
		return []string{filepath.Join(root, "hack/clients/java/peer.sh")}
	case "python":
		if _, err := exec.LookPath("python3"); err != nil {
			t.Skip("the Python peer needs python3")
		}
		return []string{filepath.Join(root, "hack/clients/python/peer.sh")}
	}
	t.Fatalf("unknown peer %q", lang)
	return nil
}

// startPeer starts a peer on the sidecar and waits until it has subscribed. It is ended when
// the test ends: its standard input is closed, then it is killed if it is still there.
func startPeer(t testing.TB, lang, url string, o peerOptions) *peer {
	t.Helper()
	if o.subType == "" {
		o.subType = "Shared"
	}
	if o.queue == 0 {
		o.queue = 1000
	}
	argv := append(peerCommand(t, lang), "--url", url, "--topic", o.topic, "--subscription", o.subscription,
		"--type", o.subType, "--name", o.name, "--queue", fmt.Sprint(o.queue), "--delay-ms", fmt.Sprint(o.delayMs))
	if o.chunkExpiryMs > 0 {
		argv = append(argv, "--chunk-expiry-ms", fmt.Sprint(o.chunkExpiryMs))
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = repoRoot()
	p := &peer{lang: lang, cmd: cmd, exited: make(chan struct{})}
	cmd.Stderr = &prefixWriter{t: t, prefix: lang + " peer: ", onLine: p.noteLog}
	stdin, stdout := testkit.StartPiped(t, cmd)
	p.stdin = stdin
	go p.read(stdout)
	t.Cleanup(p.stop)
	eventually(t, lang+" peer "+o.name+" to subscribe", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.failure != "" {
			t.Fatalf("%s peer: %s", lang, p.failure)
		}
		return p.ready
	})
	return p
}

func (p *peer) read(stdout io.Reader) {
	defer close(p.exited)
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		var ev struct {
			Event, Value, ID string
			AtMicros         int64
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			continue // a line the client library printed
		}
		p.mu.Lock()
		switch ev.Event {
		case "ready":
			p.ready = true
		case "message":
			p.received = append(p.received, ev.Value)
			p.receivedAt = append(p.receivedAt, time.UnixMicro(ev.AtMicros))
		}
		p.mu.Unlock()
	}
	err := p.cmd.Wait()
	p.mu.Lock()
	if !p.ready {
		p.failure = fmt.Sprintf("exited before subscribing: %v", err)
	}
	p.mu.Unlock()
}

// stop closes the peer's standard input, which ends it, and kills it if it is still there
// after a while; only this process is signalled.
func (p *peer) stop() {
	_ = p.stdin.Close()
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// noteLog looks at a line the peer's client library logged.
func (p *peer) noteLog(line string) {
	if p.lang == "go" && strings.Contains(line, "Got unexpected message") {
		p.mu.Lock()
		p.droppedFrames = true
		p.mu.Unlock()
	}
}

func (p *peer) messages() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.received...)
}

// receivedAfter counts the messages the application got after t, by its own clock: a line it
// printed before t may still be on its way through the pipe.
func (p *peer) receivedAfter(t time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, at := range p.receivedAt {
		if at.After(t) {
			n++
		}
	}
	return n
}

func (p *peer) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.received)
}

// prefixWriter sends a process's stderr to the test log, line by line.
type prefixWriter struct {
	t      testing.TB
	prefix string
	onLine func(string) // optional
	mu     sync.Mutex
	buf    []byte
}

func (w *prefixWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, b...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			break
		}
		line := string(w.buf[:i])
		w.buf = w.buf[i+1:]
		w.t.Log(w.prefix + line)
		if w.onLine != nil {
			w.onLine(line)
		}
	}
	return len(b), nil
}
