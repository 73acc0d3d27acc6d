package sidecar

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// benchEnv is a broker (the real Pulsar at PULSAR_URL, else pulsartest) with the sidecar
// binary in front of it, as a pod runs it: consumers reach the broker directly or through
// the sidecar, side by side in the same run.
type benchEnv struct {
	direct, sidecar string // service URLs
	control         string // the sidecar's control API, http://host:port
	pid             int    // the sidecar's process
	stop            func() // kills it
}

func newBenchEnv(b *testing.B) *benchEnv {
	b.Helper()
	broker := os.Getenv("PULSAR_URL")
	if broker == "" {
		broker = pulsartest.Start(b).ServiceURL()
	}
	return startSidecarProcess(b, buildSidecar(b), broker)
}

// buildSidecar builds the sidecar binary as the image does (hack/images): the binary's pages
// are part of the process's RSS.
func buildSidecar(b *testing.B) string {
	b.Helper()
	bin := filepath.Join(b.TempDir(), "subflow-sidecar")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "./cmd/subflow-sidecar")
	build.Dir = repoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build the sidecar: %v: %s", err, out)
	}
	return bin
}

// startSidecarProcess runs the sidecar binary in front of broker until stop is called or the
// benchmark ends, and returns once it serves.
func startSidecarProcess(b *testing.B, bin, broker string) *benchEnv {
	b.Helper()
	token := filepath.Join(b.TempDir(), "token")
	if err := os.WriteFile(token, []byte("bench"), 0o600); err != nil {
		b.Fatal(err)
	}
	listen := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(b))
	control := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(b))
	cmd := exec.Command(bin, "--broker-url", broker, "--listen", listen, "--control-addr", control, "--token-file", token)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	var once sync.Once
	e := &benchEnv{direct: broker, sidecar: "pulsar://" + listen, control: "http://" + control, pid: cmd.Process.Pid,
		stop: func() { once.Do(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }) }}
	b.Cleanup(e.stop)
	// The control API opens after the data listener: once it answers, the sidecar serves.
	testkit.Poll{Within: waitFor, Every: 10 * time.Millisecond}.Eventually(b, "the sidecar to serve", func() bool {
		resp, err := http.Get(e.control + "/healthz")
		if err == nil {
			_ = resp.Body.Close()
		}
		return err == nil && resp.StatusCode == http.StatusOK
	})
	return e
}

// heapMiB reads the sidecar's heap in use from its /metrics (the Go runtime's figure).
func (e *benchEnv) heapMiB(b *testing.B) float64 {
	b.Helper()
	_, body := testkit.Request(b, http.MethodGet, e.control+"/metrics", "")
	for line := range strings.SplitSeq(body, "\n") {
		if rest, ok := strings.CutPrefix(line, "go_memstats_heap_inuse_bytes "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				b.Fatal(err)
			}
			return v / (1 << 20)
		}
	}
	b.Fatal("no go_memstats_heap_inuse_bytes in the sidecar's /metrics")
	return 0
}

// procMemory is what /proc/PID/status says of a process's memory, in MiB: VmRSS (resident
// now), VmHWM (the peak of VmRSS), RssAnon (its own pages: heap, stacks, runtime) and RssFile
// (pages of its binary, which every process running it shares).
type procMemory struct{ rss, hwm, anon, file float64 }

func readProcMemory(tb testing.TB, pid int) procMemory {
	m, err := procMemoryOf(pid)
	if err != nil {
		tb.Fatal(err)
	}
	return m
}

func procMemoryOf(pid int) (procMemory, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return procMemory{}, err
	}
	var m procMemory
	fields := map[string]*float64{"VmRSS": &m.rss, "VmHWM": &m.hwm, "RssAnon": &m.anon, "RssFile": &m.file}
	for line := range strings.SplitSeq(string(status), "\n") {
		name, rest, _ := strings.Cut(line, ":")
		if dst := fields[name]; dst != nil {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				return procMemory{}, fmt.Errorf("/proc/%d/status: %s: %w", pid, name, err)
			}
			*dst = kb / 1024
			delete(fields, name)
		}
	}
	if len(fields) > 0 {
		return procMemory{}, fmt.Errorf("/proc/%d/status lacks %d of VmRSS, VmHWM, RssAnon, RssFile", pid, len(fields))
	}
	return m, nil
}

// sampleAnon reads a process's RssAnon every few milliseconds until the returned function is
// called, which returns the largest value and the number of samples: the kernel keeps a peak
// (VmHWM) only of the whole RSS, whose file part is the binary.
func sampleAnon(pid int) (stop func() (peakMiB float64, samples int)) {
	done := make(chan struct{})
	var peak float64
	var samples int
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			if m, err := procMemoryOf(pid); err == nil {
				peak, samples = max(peak, m.anon), samples+1
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() (float64, int) {
		close(done)
		<-ended
		return peak, samples
	}
}

// cpuSeconds is the user and system CPU time a process has used (/proc/PID/stat).
func cpuSeconds(tb testing.TB, pid int) float64 {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// The fields after the command name, which is in parentheses and may hold spaces.
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return (utime + stime) / 100 // USER_HZ
}

// BenchmarkSidecarThroughput consumes the same backlog directly and through the sidecar, in
// interleaved rounds that rotate who goes first, with pulsar-client-go. sidecar/direct is the
// median over rounds of the throughput ratio; the sidecar's peak memory is read at the end.
//
// A round is long enough to be throughput: 200 batch entries, which the consumer must ask
// for permit by permit. With 20 entries (20 000 messages, about 25 ms) the broker sends the
// whole backlog in answer to the subscribe's first FLOW (it reads up to 100 entries at a time
// while it does not know their size yet), so a round timed how much of that one burst was
// still in flight when it began; through the sidecar, one hop more of it was (0.29 on
// Pulsar 4.0.7 and 0.3-0.54 on pulsartest for the same binary that reaches 1.04 here). The
// added latency of that hop is BenchmarkSidecarLatency's.
func BenchmarkSidecarThroughput(b *testing.B) {
	const perRound = 200_000
	e := newBenchEnv(b)
	producer := newClient(b, e.direct)
	clients := [2]pulsar.Client{newClient(b, e.direct), newClient(b, e.sidecar)}
	var ratios []float64
	var took [2]time.Duration
	rounds := max(b.N, 20)
	idle := readProcMemory(b, e.pid)
	cpuBefore := cpuSeconds(b, e.pid)
	stopSampling := sampleAnon(e.pid)
	b.ResetTimer()
	for round := range rounds {
		b.StopTimer()
		var consumers [2]pulsar.Consumer
		for i, c := range clients {
			topic := uniqueTopic(b)
			produce(b, producer, topic, "m", 0, perRound)
			consumers[i] = subscribe(b, c, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "bench"})
		}
		b.StartTimer()
		var this [2]time.Duration
		for j := range 2 {
			i := (round + j) % 2
			this[i] = consumeN(b, consumers[i], perRound)
			took[i] += this[i]
		}
		b.StopTimer()
		ratios = append(ratios, this[0].Seconds()/this[1].Seconds())
		for _, c := range consumers {
			c.Close()
		}
		b.StartTimer()
	}
	b.StopTimer()
	peakAnon, samples := stopSampling()
	// Everything the sidecar process did in the run (the direct rounds too, when it idles).
	b.ReportMetric(1e6*(cpuSeconds(b, e.pid)-cpuBefore)/float64(perRound*rounds), "sidecar-cpu-µs/msg")
	b.ReportMetric(median(ratios), "sidecar/direct")
	b.ReportMetric(float64(perRound*rounds)/took[1].Seconds(), "sidecar-msgs/s")
	b.ReportMetric(float64(perRound*rounds)/took[0].Seconds(), "direct-msgs/s")
	b.ReportMetric(idle.rss, "sidecar-idle-rss-MiB")
	b.ReportMetric(idle.anon, "sidecar-idle-anon-MiB")
	b.ReportMetric(readProcMemory(b, e.pid).hwm, "sidecar-hwm-MiB")
	b.ReportMetric(peakAnon, "sidecar-anon-MiB")
	b.ReportMetric(float64(samples), "anon-samples")
	b.ReportMetric(float64(rounds), "rounds")
}

// BenchmarkSidecarThroughputJava is BenchmarkSidecarThroughput with the Java consumer app
// (hack/clients/java, a process per round), on a real broker: the time from its subscribe
// to its application having printed every message of a backlog. The app prints and flushes a line per message
// on both paths, which bounds both alike.
func BenchmarkSidecarThroughputJava(b *testing.B) {
	if os.Getenv("PULSAR_URL") == "" {
		b.Skip("needs a real Pulsar: run under hack/pulsar/pulsar.sh exec --")
	}
	const perRound = 20_000
	e := newBenchEnv(b)
	producer := newClient(b, e.direct)
	urls := [2]string{e.direct, e.sidecar}
	var ratios []float64
	rounds := max(b.N, 8)
	b.ResetTimer()
	for round := range rounds {
		var this [2]time.Duration
		for j := range 2 {
			i := (round + j) % 2
			b.StopTimer()
			topic := uniqueTopic(b)
			produce(b, producer, topic, "m", 0, perRound)
			// Timed from the app's subscribe: the JVM's start is not the path's.
			app := startPeer(b, "java", urls[i], peerOptions{topic: topic, subscription: "bench", name: fmt.Sprintf("bench-%d-%d", round, i)})
			b.StartTimer()
			start := time.Now()
			testkit.Poll{Within: waitFor, Every: time.Millisecond}.Eventually(b, "the Java app to print every message", func() bool { return app.count() >= perRound })
			this[i] = time.Since(start)
			b.StopTimer()
			app.stop()
			b.StartTimer()
		}
		ratios = append(ratios, this[0].Seconds()/this[1].Seconds())
	}
	b.StopTimer()
	b.ReportMetric(median(ratios), "sidecar/direct")
	b.ReportMetric(float64(rounds), "rounds")
}

func consumeN(b *testing.B, c pulsar.Consumer, n int) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	start := time.Now()
	for range n {
		m, err := c.Receive(ctx)
		if err != nil {
			b.Fatal(err)
		}
		c.AckID(m.ID())
	}
	return time.Since(start)
}

// BenchmarkSidecarLatency sends one message at a time and times it from the send to the
// application's Receive, alternating a consumer that reads directly and one that reads through
// the sidecar; the producer always writes directly. added-p50/p99 are the sidecar's
// percentiles minus the direct ones.
func BenchmarkSidecarLatency(b *testing.B) {
	e := newBenchEnv(b)
	samples := max(b.N, 1000)
	producer := newClient(b, e.direct)
	var paths [2]struct {
		p   pulsar.Producer
		c   pulsar.Consumer
		lat []time.Duration
	}
	for i, url := range []string{e.direct, e.sidecar} {
		topic := uniqueTopic(b)
		paths[i].c = subscribe(b, newClient(b, url), pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "bench"})
		p, err := producer.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(p.Close)
		paths[i].p = p
	}
	ctx := context.Background()
	b.ResetTimer()
	for k := range 2 * samples {
		path := &paths[k%2]
		start := time.Now()
		if _, err := path.p.Send(ctx, &pulsar.ProducerMessage{Payload: []byte("x")}); err != nil {
			b.Fatal(err)
		}
		m, err := path.c.Receive(ctx)
		if err != nil {
			b.Fatal(err)
		}
		path.lat = append(path.lat, time.Since(start))
		path.c.AckID(m.ID())
	}
	b.StopTimer()
	for i, name := range []string{"direct", "sidecar"} {
		slices.Sort(paths[i].lat)
		b.ReportMetric(micros(testkit.Percentile(paths[i].lat, 50)), name+"-p50-µs")
		b.ReportMetric(micros(testkit.Percentile(paths[i].lat, 99)), name+"-p99-µs")
	}
	b.ReportMetric(micros(testkit.Percentile(paths[1].lat, 50)-testkit.Percentile(paths[0].lat, 50)), "added-p50-µs")
	b.ReportMetric(micros(testkit.Percentile(paths[1].lat, 99)-testkit.Percentile(paths[0].lat, 99)), "added-p99-µs")
	b.ReportMetric(float64(samples), "samples")
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkSidecarAnnouncedFrames: 250 clients connect to the sidecar process, and each sends a
// PING, then the first byte of a frame announcing the largest size, and stalls; the PONG shows
// that the sidecar has read up to that byte. Its heap in use (its own /metrics) and memory are
// read then. Every round is a new sidecar process, so that a round does not wait for the
// previous one's stalled frames to time out; the figures are the largest over rounds, beside
// the same process idle.
func BenchmarkSidecarAnnouncedFrames(b *testing.B) {
	const clients = 250
	broker := pulsartest.Start(b).ServiceURL()
	bin := buildSidecar(b)
	rounds := max(b.N, 5)
	var idleHeap, heap, anon, rss float64
	b.ResetTimer()
	for range rounds {
		b.StopTimer()
		e := startSidecarProcess(b, bin, broker)
		idleHeap = max(idleHeap, e.heapMiB(b))
		b.StartTimer()
		conns := make([]net.Conn, clients)
		for i := range conns {
			conns[i] = stallOneFrame(b, strings.TrimPrefix(e.sidecar, "pulsar://"))
		}
		heap = max(heap, e.heapMiB(b))
		m := readProcMemory(b, e.pid)
		anon, rss = max(anon, m.anon), max(rss, m.rss)
		b.StopTimer()
		for _, nc := range conns {
			_ = nc.Close()
		}
		e.stop()
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(idleHeap, "idle-heap-MiB")
	b.ReportMetric(heap, "heap-MiB")
	b.ReportMetric(anon, "anon-MiB")
	b.ReportMetric(rss, "rss-MiB")
	b.ReportMetric(clients, "clients")
	b.ReportMetric(float64(rounds), "rounds")
}

// stallOneFrame connects a client that sends CONNECT, a PING and one byte of a frame of the
// largest size, and returns once the PING is answered.
func stallOneFrame(b *testing.B, addr string) net.Conn {
	b.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(waitFor))
	r := bufio.NewReader(nc)
	await := func(typ pb.BaseCommand_Type) {
		for {
			f, err := readFrame(r, DefaultMaxFrameSize)
			if err != nil {
				b.Fatalf("waiting for %v: %v", typ, err)
			}
			if f.typ == typ {
				return
			}
		}
	}
	if _, err := nc.Write(connectFrame()); err != nil {
		b.Fatal(err)
	}
	await(pb.BaseCommand_CONNECTED)
	stall := binary.BigEndian.AppendUint32(slices.Clone(pingFrame), DefaultMaxFrameSize)
	if _, err := nc.Write(append(stall, 0)); err != nil {
		b.Fatal(err)
	}
	await(pb.BaseCommand_PONG)
	return nc
}
