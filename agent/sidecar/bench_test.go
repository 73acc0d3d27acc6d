package sidecar

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/internal/pulsartest"
	"github.com/subflow-dev/subflow/internal/testkit"
)

// benchEnv is a broker (the real Pulsar at PULSAR_URL, else pulsartest) with the sidecar
// binary in front of it, as a pod runs it: consumers reach the broker directly or through
// the sidecar, side by side in the same run.
type benchEnv struct {
	direct, sidecar string // service URLs
	pid             int    // the sidecar's process
}

func newBenchEnv(b *testing.B) *benchEnv {
	b.Helper()
	e := &benchEnv{direct: os.Getenv("PULSAR_URL")}
	if e.direct == "" {
		e.direct = pulsartest.Start(b).ServiceURL()
	}
	bin := filepath.Join(b.TempDir(), "subflow-sidecar")
	build := exec.Command("go", "build", "-o", bin, "./cmd/subflow-sidecar")
	build.Dir = repoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build the sidecar: %v: %s", err, out)
	}
	token := filepath.Join(b.TempDir(), "token")
	if err := os.WriteFile(token, []byte("bench"), 0o600); err != nil {
		b.Fatal(err)
	}
	listen := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(b))
	cmd := exec.Command(bin, "--broker-url", e.direct, "--listen", listen, "--control-addr", "127.0.0.1:0", "--token-file", token)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(stderr)
	for lines.Scan() && !strings.Contains(lines.Text(), "Serving Pulsar clients") {
	}
	go func() {
		for lines.Scan() {
		}
	}()
	e.sidecar, e.pid = "pulsar://"+listen, cmd.Process.Pid
	return e
}

// memoryMiB reads a VmHWM or VmRSS line of a process, in MiB.
func memoryMiB(tb testing.TB, pid int, field string) float64 {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				tb.Fatal(err)
			}
			return kb / 1024
		}
	}
	tb.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
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
	cpuBefore := cpuSeconds(b, e.pid)
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
	// Everything the sidecar process did in the run (the direct rounds too, when it idles).
	b.ReportMetric(1e6*(cpuSeconds(b, e.pid)-cpuBefore)/float64(perRound*rounds), "sidecar-cpu-µs/msg")
	b.ReportMetric(median(ratios), "sidecar/direct")
	b.ReportMetric(float64(perRound*rounds)/took[1].Seconds(), "sidecar-msgs/s")
	b.ReportMetric(float64(perRound*rounds)/took[0].Seconds(), "direct-msgs/s")
	b.ReportMetric(memoryMiB(b, e.pid, "VmHWM"), "sidecar-hwm-MiB")
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
