package main

import (
	"bytes"
	"strings"
	"testing"
)

func result(name string, metrics ...Metric) Result {
	return Result{Package: "example.com/p", Name: name, Iterations: 1, Metrics: metrics}
}

func TestEvaluateTargets(t *testing.T) {
	results := []Result{
		result("BenchmarkPausePropagation/agents=100", Metric{120, "p99-ms"}),
		result("BenchmarkPausePropagation/agents=1000", Metric{1500, "p99-ms"}),
		result("BenchmarkConsume/raw", Metric{100_000, "msgs/s"}),
		result("BenchmarkConsume/agent", Metric{99_000, "msgs/s"}),
		result("BenchmarkProduceConsume/batching=true", Metric{5e5, "msgs/s"}),
	}
	tests := []struct {
		target Target
		want   []string // status per matched benchmark
		value  float64  // of the first verdict
	}{
		{Target{Benchmark: `^BenchmarkPausePropagation/agents=100$`, Unit: "p99-ms", Cmp: "<=", Threshold: 250}, []string{statusMet}, 120},
		{Target{Benchmark: `^BenchmarkPausePropagation/agents=1000$`, Unit: "p99-ms", Cmp: "<=", Threshold: 1000}, []string{statusMissed}, 1500},
		{Target{Benchmark: `^BenchmarkPausePropagation/`, Unit: "p99-ms", Cmp: "<", Threshold: 1000}, []string{statusMet, statusMissed}, 120},
		{Target{Benchmark: `^BenchmarkPausePropagation/agents=100$`, Unit: "all-p99-ms", Cmp: "<=", Threshold: 250}, []string{statusNotMeasured}, 0},
		{Target{Benchmark: `^BenchmarkFullResync$`, Unit: "rss-MiB", Cmp: "<", Threshold: 200}, []string{statusNotMeasured}, 0},
		{Target{Benchmark: `^BenchmarkConsume/agent$`, Over: `^BenchmarkConsume/raw$`, Unit: "msgs/s", Cmp: ">=", Threshold: 0.98}, []string{statusMet}, 0.99},
		{Target{Benchmark: `^BenchmarkProduceConsume/`, Unit: "msgs/s"}, []string{statusContext}, 5e5},
	}
	for _, tt := range tests {
		verdicts, err := evaluateTargets([]Target{tt.target}, results)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, v := range verdicts {
			got = append(got, v.Status)
		}
		if strings.Join(got, ",") != strings.Join(tt.want, ",") || verdicts[0].Value != tt.value {
			t.Errorf("%s %s: got %v value %v, want %v value %v", tt.target.Benchmark, tt.target.Unit, got, verdicts[0].Value, tt.want, tt.value)
		}
	}
}

func TestWithUnit(t *testing.T) {
	tests := map[float64]string{2993144: "2.99ms/op", 635595: "636µs/op", 1e9: "1s/op", 55: "55ns/op"}
	for ns, want := range tests {
		if got := withUnit(ns, "ns/op"); got != want {
			t.Errorf("withUnit(%v, ns/op) = %q, want %q", ns, got, want)
		}
	}
	if got := withUnit(0.9048, "agent/raw"); got != "0.9048 agent/raw" {
		t.Errorf("withUnit(0.9048, agent/raw) = %q", got)
	}
}

func TestTargetTableCompiles(t *testing.T) {
	if _, err := evaluateTargets(targets, nil); err != nil {
		t.Fatal(err)
	}
}

func TestWriteReport(t *testing.T) {
	results := []Result{
		result("BenchmarkResumeToFirstMessage", Metric{55, "ns/op"}, Metric{80, "p99-\u00b5s"}),
		result("BenchmarkSeekProbes/entries=1000000/pip415", Metric{2e6, "ns/op"}, Metric{30, "probes/op"}),
	}
	verdicts, err := evaluateTargets(targets, results)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	writeReport(&buf, Report{Command: "`go test -bench .`", Machine: Machine{GoVersion: "go1.26.8", GOOS: "linux", GOARCH: "amd64", CPUs: "2"},
		Runs: []PackageRun{{Package: "example.com/q", Failure: "exit status 1"}}, Results: results, Verdicts: verdicts})
	report := buf.String()
	for _, want := range []string{
		"| GOOS/GOARCH | linux/amd64 |",
		"| Resume: first buffered message to the app, p99 <= 5 ms | `BenchmarkResumeToFirstMessage` | 80 p99-\u00b5s | <= 5000 p99-\u00b5s | met |",
		"| `BenchmarkSeekProbes/entries=1000000/pip415` | 1 | 2000000 |  | 30 |",
		"| Controller: RSS under 200 MiB (its own process, which also holds the test broker and 10 agents) | - | - | < 200 rss-MiB | not measured |",
		"- `example.com/q`: exit status 1",
		"| Benchmark | Iterations | ns/op | p99-\u00b5s |",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
}
