package fleetbench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// Environment knobs, for finding where the time goes; make bench sets none of them.
//
//	FLEETBENCH_ROUNDS        samples per figure (default 100)
//	FLEETBENCH_VARIANTS      extra controller settings run side by side with the defaults, e.g.
//	                         "par256=--push-parallelism=256;patched@/tmp/subflow=" (name[@binary]=flags;
//	                         a flag ENV:K=V sets the controller's environment instead, e.g. ENV:GOMEMLIMIT=150MiB)
//	FLEETBENCH_PROFILE_DIR   save a CPU profile of each variant's first block and a heap profile
//	FLEETBENCH_PROFILE_SECONDS  length of the CPU profile (default 20)
//	FLEETBENCH_LOG_DIR       keep the controllers' logs there
//	FLEETBENCH_SCALE         divide pod counts by this, for quick runs while developing
//	FLEETBENCH_PLUGIN        another kubectl-subflow binary for the fleet switch
//	FLEETBENCH_SWITCH_BUDGET_SECONDS  time for the fleet switch's rounds per variant (default 300)
//	FLEETBENCH_CRD_DIR       another CRD directory for the API server

var binaries struct {
	once               sync.Once
	dir                string
	controller, plugin string
	err                error
}

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard()) // envtest logs through controller-runtime
	code := m.Run()
	if binaries.dir != "" {
		os.RemoveAll(binaries.dir)
	}
	os.Exit(code)
}

func build(b *testing.B) (controller, plugin string) {
	binaries.once.Do(func() {
		if binaries.dir, binaries.err = os.MkdirTemp("", "fleetbench-bin-"); binaries.err == nil {
			binaries.controller, binaries.plugin, binaries.err = Build(binaries.dir)
		}
	})
	if binaries.err != nil {
		b.Fatal(binaries.err)
	}
	if p := os.Getenv("FLEETBENCH_PLUGIN"); p != "" {
		return binaries.controller, p
	}
	return binaries.controller, binaries.plugin
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// variant is one controller setting: a binary and its flags.
type variant struct {
	name  string
	bin   string
	flags []string
}

func variants(b *testing.B, extra ...string) []variant {
	bin, _ := build(b)
	vs := []variant{{name: "", bin: bin, flags: extra}}
	for _, spec := range strings.Split(os.Getenv("FLEETBENCH_VARIANTS"), ";") {
		head, flags, ok := strings.Cut(strings.TrimSpace(spec), "=")
		if !ok {
			continue
		}
		v := variant{name: head, bin: bin, flags: append(append([]string(nil), extra...), strings.Fields(flags)...)}
		if name, path, ok := strings.Cut(head, "@"); ok {
			v.name, v.bin = name, path
		}
		vs = append(vs, v)
	}
	return vs
}

// unit prefixes a metric's unit with the variant's name, so that variants share one result line.
func (v variant) unit(u string) string {
	if v.name == "" {
		return u
	}
	return v.name + "-" + u
}

// samples collects one variant's figures over its blocks.
type samples struct {
	all, per []time.Duration
	patched  []time.Duration // until the last flow's patch was answered (the plugin exited)
	lags     []time.Duration // per flow, its patch answered to its last agent told
	reported []time.Duration // until every flow's status showed the state
	delta    Metrics
	rounds   int
	rss, hwm float64
	maxHWM   float64
}

func (s *samples) addDelta(d Metrics) {
	if s.delta == nil {
		s.delta = Metrics{}
	}
	for k, v := range d {
		s.delta[k] += v
	}
}

// roundFunc runs one measured round against a running controller and returns its samples.
type roundFunc func(b *testing.B, w *world) (per []time.Duration, all time.Duration)

// measure runs rounds for each variant, in blocks that alternate between variants (A B A B)
// so that the machine's drift hits all of them alike; each block starts a fresh controller.
//
// A positive budget ends each variant's rounds once they took that long (after one round at
// least), for shapes whose rounds take far longer than their target: the report says how
// many ran.
func measure(b *testing.B, w *world, s shape, vs []variant, rounds int, budget time.Duration, round roundFunc) map[string]*samples {
	blocks := 1
	if len(vs) > 1 {
		blocks = 2
	}
	out := map[string]*samples{}
	for blk := range blocks {
		for _, v := range vs {
			got := out[v.name]
			if got == nil {
				got = &samples{}
				out[v.name] = got
			}
			n := rounds / blocks
			if blk == blocks-1 {
				n = rounds - n*(blocks-1)
			}
			runBlock(b, w, s, v, blk, n, budget/time.Duration(blocks), got, round)
		}
	}
	return out
}

func runBlock(b *testing.B, w *world, s shape, v variant, blk, n int, budget time.Duration, got *samples, round roundFunc) {
	ctrl, err := StartController(v.bin, w.kubeconfig, w.controllerLog(fmt.Sprintf("%s-%s-%d", safe(b.Name()), v.name, blk)), v.flags)
	must(b, err)
	defer ctrl.Stop()
	settle := 5*time.Minute + time.Duration(s.flows*(s.pods+s.hanging))*time.Millisecond
	w.awaitSettled(b, s.state, s.hanging > 0, settle)
	// Warm-up round: keep-alive connections to every agent, caches, the first status writes.
	round(b, w)
	before, err := ctrl.Scrape()
	must(b, err)
	stopProfile := profile(b, w, ctrl, v, blk)
	w.ctrlPid, w.cpuTimed, w.patched, w.lags, w.reported = ctrl.Pid(), Metrics{}, nil, nil, nil
	start := time.Now()
	for i := range n {
		if budget > 0 && i > 0 && time.Since(start) > budget {
			break
		}
		per, all := round(b, w)
		got.per, got.all = append(got.per, per...), append(got.all, all)
		got.rounds++
	}
	got.addDelta(w.cpuTimed)
	got.patched, got.lags = append(got.patched, w.patched...), append(got.lags, w.lags...)
	got.reported = append(got.reported, w.reported...)
	after, err := ctrl.Scrape()
	must(b, err)
	got.addDelta(Delta(before, after))

	got.rss, got.hwm = ctrl.Memory()
	got.maxHWM = max(got.maxHWM, got.hwm)
	stopProfile()
}

// profile starts CPU profiles of the controller and the API server in the first block when
// FLEETBENCH_PROFILE_DIR is set; the returned function waits for them and saves the controller's
// heap profile.
func profile(b *testing.B, w *world, ctrl *Controller, v variant, blk int) func() {
	dir := os.Getenv("FLEETBENCH_PROFILE_DIR")
	if dir == "" || blk > 0 {
		return func() {}
	}
	base := filepath.Join(dir, safe(b.Name())+"-"+v.name)
	seconds := envInt("FLEETBENCH_PROFILE_SECONDS", 20)
	done := make(chan error, 2)
	go func() {
		done <- ctrl.Profile(context.Background(), fmt.Sprintf("profile?seconds=%d", seconds), base+".cpu.pprof")
	}()
	go func() { done <- w.apiServerProfile(seconds, base+".apiserver.cpu.pprof") }()
	return func() {
		for range 2 {
			if err := <-done; err != nil {
				b.Logf("cpu profile: %v", err)
			}
		}
		if err := ctrl.Profile(context.Background(), "heap", base+".heap.pprof"); err != nil {
			b.Logf("heap profile: %v", err)
		}
	}
}

func safe(name string) string {
	return strings.NewReplacer("/", "_", "=", "", ",", "_").Replace(name)
}

// report publishes each variant's figures: latencies and where the controller spent its time,
// from the metrics scraped before and after the measured rounds (per round: both the measured
// change and the untimed change back).
func report(b *testing.B, vs []variant, got map[string]*samples, withPer bool) {
	for _, v := range vs {
		s := got[v.name]
		b.ReportMetric(testkit.Millis(testkit.Percentile(s.all, 50)), v.unit("all-p50-ms"))
		b.ReportMetric(testkit.Millis(testkit.Percentile(s.all, 99)), v.unit("all-p99-ms"))
		b.ReportMetric(float64(len(s.all)), v.unit("rounds"))
		if len(s.patched) > 0 {
			b.ReportMetric(testkit.Millis(testkit.Percentile(s.patched, 50)), v.unit("patched-p50-ms"))
			b.ReportMetric(testkit.Millis(testkit.Percentile(s.patched, 99)), v.unit("patched-p99-ms"))
		}
		if len(s.reported) > 0 {
			b.ReportMetric(testkit.Millis(testkit.Percentile(s.reported, 50)), v.unit("reported-p50-ms"))
			b.ReportMetric(testkit.Millis(testkit.Percentile(s.reported, 99)), v.unit("reported-p99-ms"))
		}
		if len(s.lags) > 0 {
			b.ReportMetric(testkit.Millis(testkit.Percentile(s.lags, 50)), v.unit("flow-lag-p50-ms"))
			b.ReportMetric(testkit.Millis(testkit.Percentile(s.lags, 99)), v.unit("flow-lag-p99-ms"))
			b.ReportMetric(float64(len(s.lags)), v.unit("flow-lag-samples"))
		}
		if withPer {
			b.ReportMetric(testkit.Millis(testkit.Percentile(s.per, 50)), v.unit("agent-p50-ms"))
			b.ReportMetric(testkit.Millis(testkit.Percentile(s.per, 99)), v.unit("agent-p99-ms"))
			b.ReportMetric(float64(len(s.per)), v.unit("agent-samples"))
		}
		reportTime(b, v, s)
	}
}

// reportTime reports the controller-side breakdown: mean work-queue wait, reconcile, push and
// API round trip per call, and how many of each a round took.
func reportTime(b *testing.B, v variant, s *samples) {
	d, rounds := s.delta, float64(max(s.rounds, 1))
	queue, _ := d.Mean("workqueue_queue_duration_seconds", `name="subscriptionflow"`)
	work, reconciles := d.Mean("controller_runtime_reconcile_time_seconds", `controller="subscriptionflow"`)
	push, pushes := d.Mean("subflow_agent_push_duration_seconds")
	// The binary counts its API calls; durations only where a variant's binary registers
	// client-go's latency histogram, or the per-phase histogram of an instrumented build.
	patch, _ := d.Mean("rest_client_request_duration_seconds", `verb="PATCH"`)
	get, _ := d.Mean("rest_client_request_duration_seconds", `verb="GET"`)
	patches := d.Sum("rest_client_requests_total", `method="PATCH"`)
	gets := d.Sum("rest_client_requests_total", `method="GET"`)
	posts := d.Sum("rest_client_requests_total", `method="POST"`)
	for _, m := range []struct {
		unit  string
		value float64
	}{
		{"queue-ms", queue}, {"reconcile-ms", work}, {"reconciles/round", reconciles / rounds},
		{"push-ms", push}, {"pushes/round", pushes / rounds}, {"patch-ms", patch}, {"patches/round", patches / rounds},
		{"get-ms", get}, {"gets/round", gets / rounds}, {"posts/round", posts / rounds},
		{"rss-MiB", s.rss}, {"hwm-MiB", s.maxHWM},
	} {
		b.ReportMetric(m.value, v.unit(m.unit))
	}
	reportPhases(b, v, d)
	// CPU seconds of each process in the timed part of a round (the change measured, not the
	// change back), beside its wall time: whether 2 cores were the bound, and whose.
	for _, name := range []string{"wall", "controller", "apiserver", "etcd", "bench"} {
		b.ReportMetric(d["cpu:"+name]/rounds, v.unit("cpu-"+name+"-s/round"))
	}
}

// reportPhases reports the mean of each phase of an instrumented build's subflow_phase_seconds.
func reportPhases(b *testing.B, v variant, d Metrics) {
	const name = "subflow_phase_seconds"
	for key := range d {
		rest, ok := strings.CutPrefix(key, name+`_count{phase="`)
		if !ok {
			continue
		}
		phase, _, _ := strings.Cut(rest, `"`)
		mean, _ := d.Mean(name, `phase="`+phase+`"`)
		b.ReportMetric(mean, v.unit("phase-"+phase+"-ms"))
	}
}

// patchRound pauses every flow by patching spec.state, measures until every healthy agent was
// told Paused, then resumes (untimed) and waits for the controller to settle, so that every
// round starts with the controller idle.
func patchRound(s shape) roundFunc {
	return func(b *testing.B, w *world) ([]time.Duration, time.Duration) {
		var per []time.Duration
		var all time.Duration
		reported := w.watchReported(b, subflowv1.StatePaused, s.hanging > 0)
		w.timed(func(start time.Time) {
			defer func() { w.reported = append(w.reported, reported(2*time.Minute).Sub(start)) }()
			w.patchAll(b, `{"spec":{"state":"Paused"}}`)
			w.patched = append(w.patched, time.Since(start))
			per, all = w.awaitTold(b, protocol.Paused, start, 2*time.Minute)
		})
		start := time.Now()
		w.patchAll(b, `{"spec":{"state":"Running"}}`)
		w.awaitTold(b, protocol.Running, start, 2*time.Minute)
		w.awaitSettled(b, subflowv1.StateRunning, s.hanging > 0, 2*time.Minute)
		return per, all
	}
}

// switchRound pauses through the fleet switch, kubectl subflow pause -l db=orders -A, as a
// process; the clock starts before the plugin does. The override is then removed (untimed).
func switchRound(s shape, plugin string) roundFunc {
	return func(b *testing.B, w *world) ([]time.Duration, time.Duration) {
		var per []time.Duration
		var all time.Duration
		w.answered = nil // the plugin's own
		reported := w.watchReported(b, subflowv1.StatePaused, s.hanging > 0)
		w.timed(func(start time.Time) {
			defer func() { w.reported = append(w.reported, reported(2*time.Minute).Sub(start)) }()
			cmd := exec.Command(plugin, "pause", "-l", "db=orders", "-A", "--reason", "fleetbench")
			cmd.Env = append(os.Environ(), "KUBECONFIG="+w.kubeconfig)
			if out, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("kubectl subflow pause: %v\n%s", err, out)
			}
			w.patched = append(w.patched, time.Since(start))
			per, all = w.awaitTold(b, protocol.Paused, start, 2*time.Minute)
		})
		start := time.Now()
		w.patchAll(b, fmt.Sprintf(`{"metadata":{"annotations":{%q:null,%q:null}}}`, subflowv1.OverrideStateAnnotation, subflowv1.OverrideReasonAnnotation))
		w.awaitTold(b, protocol.Running, start, 2*time.Minute)
		w.awaitSettled(b, subflowv1.StateRunning, s.hanging > 0, 2*time.Minute)
		return per, all
	}
}

func scaled(n int) int { return max(n/envInt("FLEETBENCH_SCALE", 1), 1) }

// BenchmarkFleetPause measures a pause of many flows at once - patch (or the fleet switch) to
// every simulated agent told Paused - with the controller in its own process. One sample per
// round for "all" (the last agent), one per agent per round for "agent". The hanging=1 shapes
// add to each flow one pod that accepts connections and never answers; their figures are the
// healthy agents'.
func BenchmarkFleetPause(b *testing.B) {
	_, plugin := build(b)
	for _, tc := range []struct {
		name      string
		s         shape
		viaSwitch bool
	}{
		{"flows=100,pods=10", shape{flows: 100, pods: 10, namespaces: 10}, false},
		{"flows=100,pods=10,hanging=1", shape{flows: 100, pods: 10, hanging: 1, namespaces: 10}, false},
		// The plugin's rounds took 40 s each (client-go's default rate limit): a budget, not 100.
		{"flows=100,pods=10,switch", shape{flows: 100, pods: 10, namespaces: 10}, true},
		{"flows=1,pods=100", shape{flows: 1, pods: 100}, false},
		{"flows=1,pods=100,hanging=1", shape{flows: 1, pods: 100, hanging: 1}, false},
		{"flows=1,pods=1000", shape{flows: 1, pods: 1000}, false},
		{"flows=1,pods=1000,hanging=1", shape{flows: 1, pods: 1000, hanging: 1}, false},
		{"flows=1,pods=10000", shape{flows: 1, pods: 10000}, false},
		// 9999 + 1: one flow drives at most subflowv1.MaxHolders (10 000) pods, else it stalls.
		{"flows=1,pods=10000,hanging=1", shape{flows: 1, pods: subflowv1.MaxHolders - 1, hanging: 1}, false},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s := tc.s
			s.pods, s.state = scaled(s.pods), subflowv1.StateRunning
			w := newWorld(b, s)
			vs := variants(b)
			round := patchRound(s)
			if tc.viaSwitch {
				round = switchRound(s, plugin)
			}
			b.ResetTimer()
			var budget time.Duration
			if tc.viaSwitch {
				budget = time.Duration(envInt("FLEETBENCH_SWITCH_BUDGET_SECONDS", 300)) * time.Second
			}
			got := measure(b, w, s, vs, max(b.N, envInt("FLEETBENCH_ROUNDS", 100)), budget, round)
			b.StopTimer()
			report(b, vs, got, true)
		})
	}
}

// BenchmarkFleetResync measures a full resync that changes nothing - every flow reconciled and
// pushed to its pods - of 1000 flows selecting the same 10 pods (as BenchmarkFullResync in
// controllers/), with the controller in its own process. Each pass is a controller start:
// the informers' initial list enqueues every flow at once, as after a restart or a leader
// change. "all" is the first push of the pass to its last; "from-start" adds the process
// start and the cache sync; "flow" is each flow's last pod pushed, from the pass's first push.
func BenchmarkFleetResync(b *testing.B) {
	for _, hanging := range []int{0, 1} {
		name := "flows=1000,pods=10"
		if hanging > 0 {
			name += ",hanging=1"
		}
		b.Run(name, func(b *testing.B) {
			s := shape{flows: scaled(1000), pods: 10, hanging: hanging, shared: true, state: subflowv1.StatePaused}
			w := newWorld(b, s)
			vs := variants(b)
			b.ResetTimer()
			passes := max(b.N, envInt("FLEETBENCH_ROUNDS", 100))
			got := map[string]*samples{}
			fromStart := map[string][]time.Duration{}
			for _, v := range vs {
				got[v.name] = &samples{}
			}
			blocks := min(len(vs), 2)
			for blk := range blocks {
				for _, v := range vs {
					n := passes / blocks
					if blk == blocks-1 {
						n = passes - n*(blocks-1)
					}
					for i := range n {
						first, all, start := resyncPass(b, w, s, v, fmt.Sprintf("%d-%d", blk, i), got[v.name])
						got[v.name].all = append(got[v.name].all, all)
						got[v.name].per = append(got[v.name].per, first...)
						fromStart[v.name] = append(fromStart[v.name], start)
					}
				}
			}
			b.StopTimer()
			report(b, vs, got, true)
			for _, v := range vs {
				b.ReportMetric(testkit.Millis(testkit.Percentile(fromStart[v.name], 50)), v.unit("from-start-p50-ms"))
				b.ReportMetric(testkit.Millis(testkit.Percentile(fromStart[v.name], 99)), v.unit("from-start-p99-ms"))
			}
		})
	}
}

// resyncPass starts a controller on settled flows and waits until it pushed every flow to
// every healthy pod; it returns each flow's delay from the pass's first push, the pass's
// length, and the time from the process start to the last push.
func resyncPass(b *testing.B, w *world, s shape, v variant, tag string, got *samples) (flows []time.Duration, pass, fromStart time.Duration) {
	if tag == "0-0" {
		// First start: the flows get their finalizer, holders and first status.
		ctrl, err := StartController(v.bin, w.kubeconfig, w.controllerLog(safe(b.Name())+"-"+v.name+"-setup"), v.flags)
		must(b, err)
		w.awaitSettled(b, s.state, s.hanging > 0, 10*time.Minute)
		ctrl.Stop()
	}
	for _, a := range w.fleet.Agents {
		a.ResetFirstPuts()
	}

	ctrl, err := StartController(v.bin, w.kubeconfig, w.controllerLog(safe(b.Name())+"-"+v.name+"-"+tag), v.flags)
	must(b, err)
	defer ctrl.Stop()
	w.ctrlPid, w.cpuTimed = ctrl.Pid(), Metrics{}
	cpuBefore, passStart := sampleCPU(ctrl.Pid()), time.Now()
	stopProfile := func() {}
	if tag == "0-0" {
		stopProfile = profile(b, w, ctrl, v, 0)
	}
	deadline := time.Now().Add(5 * time.Minute)
	var firstAny, last time.Time
	lastOf := make([]time.Time, len(w.flows))
	for i, f := range w.flows {
		for _, a := range f.agents {
			for {
				t := a.FirstPut(f.rule)
				if !t.IsZero() {
					lastOf[i] = later(lastOf[i], t)
					if firstAny.IsZero() || t.Before(firstAny) {
						firstAny = t
					}
					break
				}
				if time.Now().After(deadline) {
					b.Fatalf("%s got no push for %s in a resync", a.Name, f.rule)
				}
				time.Sleep(time.Millisecond)
			}
		}
		last = later(last, lastOf[i])
	}
	for _, t := range lastOf {
		flows = append(flows, t.Sub(firstAny))
	}
	w.awaitSettled(b, s.state, s.hanging > 0, 2*time.Minute)
	w.addCPU(cpuBefore, sampleCPU(ctrl.Pid()), time.Since(passStart))
	got.addDelta(w.cpuTimed)
	m, err := ctrl.Scrape()
	must(b, err)
	got.addDelta(m)

	got.rounds++
	got.rss, got.hwm = ctrl.Memory()
	got.maxHWM = max(got.maxHWM, got.hwm)
	stopProfile()
	return flows, last.Sub(firstAny), last.Sub(ctrl.Started)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
