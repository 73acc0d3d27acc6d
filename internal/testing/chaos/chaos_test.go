package chaos

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// TestShortRun is the CI run: a fixed seed (CHAOS_SEED overrides it), at least 10k messages
// and 100 operations over every consumer kind and fault, every invariant checked. With
// PULSAR_URL and PULSAR_ADMIN_URL set (hack/pulsar/pulsar.sh exec does) it runs on that
// broker, otherwise on the in-process test cluster.
func TestShortRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane and runs for minutes")
	}
	seed := seedFromEnv(t)
	var out strings.Builder
	cfg := Config{Seed: seed, Ops: 120, Messages: 10000, Pods: 10, Duration: 80 * time.Second, Out: &out}
	brokerFromEnv(t, &cfg)
	// The operation trace, with what the sidecars and the consumers' clients logged, goes to
	// the output at once with -v and otherwise with a failure only: a CI run that fails
	// carries what led to it.
	trace := &testkit.LockedBuffer{}
	cfg.Verbose = trace
	if testing.Verbose() {
		cfg.Verbose = os.Stdout
	}
	defer func() {
		if t.Failed() && !testing.Verbose() {
			t.Log("operation trace:\n" + trace.String())
		}
	}()
	rep, err := Run(context.Background(), cfg)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Produced < 10000 || sum(rep.Ops) < 100 {
		t.Fatalf("run too small: %d messages, %d operations", rep.Produced, sum(rep.Ops))
	}
	if rep.FlowsChecked == 0 {
		t.Fatal("no FLOW on the wire was checked: the consumers went around the recorder")
	}
	if rep.Failed() {
		t.Fatalf("invariants violated with seed %d: %v", seed, rep.ViolationCounts)
	}
	if rep.SidecarPods == 0 || rep.SidecarDeliveries == 0 || rep.SidecarGated == 0 || rep.SidecarResumed == 0 || rep.SidecarFlowsChecked == 0 {
		t.Fatalf("the sidecar pods were not exercised: %d pods, %d deliveries, paused or stopped %d times, resumed %d times, %d FLOWs checked",
			rep.SidecarPods, rep.SidecarDeliveries, rep.SidecarGated, rep.SidecarResumed, rep.SidecarFlowsChecked)
	}
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// brokerFromEnv names the real broker of PULSAR_URL and PULSAR_ADMIN_URL, when both are set.
func brokerFromEnv(tb testing.TB, cfg *Config) {
	service, admin := os.Getenv("PULSAR_URL"), os.Getenv("PULSAR_ADMIN_URL")
	if (service == "") != (admin == "") {
		tb.Fatalf("PULSAR_URL (%q) and PULSAR_ADMIN_URL (%q) go together", service, admin)
	}
	cfg.ServiceURL, cfg.AdminURL = service, admin
}

// seedFromEnv is 1, or CHAOS_SEED when set.
func seedFromEnv(tb testing.TB) uint64 {
	s := os.Getenv("CHAOS_SEED")
	if s == "" {
		return 1
	}
	seed, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		tb.Fatal(err)
	}
	return seed
}

// BenchmarkLongRun is the long run docs/design.md section 6 sets the reliability goal on (1000
// operations, 100k messages, 10 minutes; seed 1 unless CHAOS_SEED), for make bench to record,
// on the in-process test cluster. It runs once whatever b.N asks: the figures are the run's,
// not per operation. Violations are reported as a figure (the report marks the target missed)
// and listed in the log.
func BenchmarkLongRun(b *testing.B) { longRun(b, Config{}) }

// BenchmarkLongRunPulsar is the same run on the real broker of PULSAR_URL and
// PULSAR_ADMIN_URL (make bench starts one).
func BenchmarkLongRunPulsar(b *testing.B) {
	var cfg Config
	if brokerFromEnv(b, &cfg); cfg.ServiceURL == "" {
		b.Skip("needs a real broker: set PULSAR_URL and PULSAR_ADMIN_URL (make bench starts one)")
	}
	longRun(b, cfg)
}

func longRun(b *testing.B, broker Config) {
	seed := seedFromEnv(b)
	var out strings.Builder
	cfg := Config{Seed: seed, Ops: 1000, Messages: 100000, Pods: 10, Duration: 10 * time.Minute, Out: &out,
		ServiceURL: broker.ServiceURL, AdminURL: broker.AdminURL}
	var rep *Report
	for b.Loop() {
		if rep != nil {
			continue
		}
		var err error
		if rep, err = Run(context.Background(), cfg); err != nil {
			b.Log("\n" + out.String())
			b.Fatal(err)
		}
	}
	b.Log("\n" + out.String())
	violations := 0
	for _, n := range rep.ViolationCounts {
		violations += n
	}
	b.ReportMetric(float64(seed), "seed")
	b.ReportMetric(float64(sum(rep.Ops)), "operations")
	b.ReportMetric(float64(rep.Produced), "messages")
	b.ReportMetric(float64(rep.Deliveries), "deliveries")
	b.ReportMetric(float64(violations), "violations")
	b.ReportMetric(float64(rep.FlowsChecked), "wire-FLOWs")
	b.ReportMetric(float64(rep.Converge.Milliseconds()), "converge-ms")
	b.ReportMetric(float64(rep.Drain.Milliseconds()), "drain-ms")
	b.ReportMetric(float64(rep.GoroutinesEnd-rep.GoroutinesStart), "goroutine-growth")
	b.ReportMetric(rep.HeapEndMiB-rep.HeapStartMiB, "heap-growth-MiB")
}
