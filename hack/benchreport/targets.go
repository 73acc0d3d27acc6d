package main

import (
	"fmt"
	"math"
	"regexp"
)

// Target maps one docs/design.md section 6 target to a figure a benchmark reports. Edit the table
// below when a benchmark or a unit is renamed; a target whose benchmark did not run is shown
// as "not measured" rather than failing the report.
type Target struct {
	Text      string  // the target as docs/design.md section 6 states it
	Benchmark string  // regexp on the benchmark name, sub-benchmarks included, without -GOMAXPROCS
	Unit      string  // unit as reported: "ns/op", or a b.ReportMetric unit such as "p99-ms"
	Over      string  // optional regexp of a second benchmark: the figure is Benchmark/Over in Unit
	Cmp       string  // ">=", "<=", ">" or "<"; empty for context without a target
	Threshold float64 // in Unit
}

// probeBound is docs/design.md's limit (section 6) on admin API probes to resolve one seek index.
func probeBound(entries float64) float64 { return 2*math.Log2(entries) + 8 }

var targets = []Target{
	{Text: "Gate overhead: agent / raw consumer throughput, median of interleaved rounds", Benchmark: `^BenchmarkConsumeInterleaved$`, Unit: "agent/raw", Cmp: ">=", Threshold: 0.98},
	{Text: "Gate overhead: agent / raw consumer throughput, total of interleaved rounds (context)", Benchmark: `^BenchmarkConsumeInterleaved$`, Unit: "agent/raw-total"},
	// Separate runs are too noisy here to judge a 2% target; the interleaved rounds decide.
	{Text: "Gate overhead: agent / raw consumer throughput, separate runs (context)", Benchmark: `^BenchmarkConsume/agent$`, Over: `^BenchmarkConsume/raw$`, Unit: "msgs/s"},
	{Text: "Pause propagation, 100 pods: per-agent p99", Benchmark: `^BenchmarkPausePropagation/agents=100$`, Unit: "p99-ms", Cmp: "<=", Threshold: 250},
	{Text: "Pause propagation, 100 pods: every agent Paused, p99", Benchmark: `^BenchmarkPausePropagation/agents=100$`, Unit: "all-p99-ms", Cmp: "<=", Threshold: 250},
	{Text: "Pause propagation, 1000 agents: per-agent p99", Benchmark: `^BenchmarkPausePropagation/agents=1000$`, Unit: "p99-ms", Cmp: "<=", Threshold: 1000},
	{Text: "Pause propagation, 1000 agents: every agent Paused, p99", Benchmark: `^BenchmarkPausePropagation/agents=1000$`, Unit: "all-p99-ms", Cmp: "<=", Threshold: 1000},
	// A real cluster (make e2e-bench): kubelet-run pods of the example consumer, the chart's controller.
	{Text: "Real cluster, 10 pods: kubectl patch to every pod Paused, p99", Benchmark: `^BenchmarkPatchToEveryPodPaused$`, Unit: "all-p99-ms", Cmp: "<=", Threshold: 250},
	{Text: "Real cluster, 10 pods: kubectl patch to a pod Paused, p50 (context)", Benchmark: `^BenchmarkPatchToEveryPodPaused$`, Unit: "p50-ms"},
	{Text: "Real cluster: the cluster's start, images imported and the node Ready, one sample (context)", Benchmark: `^BenchmarkSuiteSetup$`, Unit: "cluster-start-s"},
	{Text: "Real cluster: the broker's start on the host, one sample (context)", Benchmark: `^BenchmarkSuiteSetup$`, Unit: "broker-start-s"},
	{Text: "Real cluster: helm install --wait of the chart, 2 replicas, one sample (context)", Benchmark: `^BenchmarkSuiteSetup$`, Unit: "chart-install-s"},
	{Text: "Pause propagation, 10 agents (context)", Benchmark: `^BenchmarkPausePropagation/agents=10$`, Unit: "p99-ms"},
	{Text: "Pause propagation, 10 agents and one hanging: the others' per-agent p99 / without it", Benchmark: `^BenchmarkPausePropagation/agents=10,hanging=1$`, Over: `^BenchmarkPausePropagation/agents=10$`, Unit: "p99-ms", Cmp: "<=", Threshold: 1.2},
	{Text: "Pause propagation, 100 agents and one hanging: the others' per-agent p99 / without it", Benchmark: `^BenchmarkPausePropagation/agents=100,hanging=1$`, Over: `^BenchmarkPausePropagation/agents=100$`, Unit: "p99-ms", Cmp: "<=", Threshold: 1.2},
	{Text: "Resume: first buffered message to the app, p99 <= 5 ms", Benchmark: `^BenchmarkResumeToFirstMessage$`, Unit: "p99-\u00b5s", Cmp: "<=", Threshold: 5000},
	{Text: "Seek by index, 10^6 entries: probes <= 2*log2(entries)+8", Benchmark: `^BenchmarkSeekProbes/entries=1000000/`, Unit: "probes/op", Cmp: "<=", Threshold: probeBound(1e6)},
	{Text: "Seek by index, 10^7 entries: probes <= 2*log2(entries)+8", Benchmark: `^BenchmarkSeekProbes/entries=10000000/`, Unit: "probes/op", Cmp: "<=", Threshold: probeBound(1e7)},
	{Text: "Seek by index, 10^6 entries: under 1 s", Benchmark: `^BenchmarkSeekProbes/entries=1000000/`, Unit: "ns/op", Cmp: "<", Threshold: 1e9},
	{Text: "Seek by index, 10^7 entries: under 1 s", Benchmark: `^BenchmarkSeekProbes/entries=10000000/`, Unit: "ns/op", Cmp: "<", Threshold: 1e9},
	{Text: "Controller: full resync of 1000 flows x 10 pods under 10 s", Benchmark: `^BenchmarkFullResync$`, Unit: "resync-ms", Cmp: "<", Threshold: 10_000},
	{Text: "Controller: RSS under 200 MiB (its own process, which also holds the test broker and 10 agents)", Benchmark: `^BenchmarkFullResync$`, Unit: "rss-MiB", Cmp: "<", Threshold: 200},
	// Fleet scale (issue 23): the controller in its own process, fake agents (internal/testing/fleetbench).
	{Text: "Fleet: 100 flows x 10 pods patched together, every agent Paused, p99 <= 1 s", Benchmark: `^BenchmarkFleetPause/flows=100,pods=10$`, Unit: "all-p99-ms", Cmp: "<=", Threshold: 1000},
	{Text: "Fleet: 100 flows x 10 pods through the fleet switch (kubectl subflow pause -l -A), every agent Paused, p99 <= 1 s", Benchmark: `^BenchmarkFleetPause/flows=100,pods=10,switch$`, Unit: "all-p99-ms", Cmp: "<=", Threshold: 1000},
	{Text: "Fleet: 100 x 10, the input alone: the API server answered the 100 patches, p99 (context: the floor under the row above on this machine)", Benchmark: `^BenchmarkFleetPause/flows=100,pods=10$`, Unit: "patched-p99-ms"},
	{Text: "Fleet: 100 x 10, the controller's share: a flow's patch answered to its last agent told, p99 (context)", Benchmark: `^BenchmarkFleetPause/flows=100,pods=10$`, Unit: "flow-lag-p99-ms"},
	{Text: "Fleet: 100 x 10, every flow's status reported Paused, p99 (context)", Benchmark: `^BenchmarkFleetPause/flows=100,pods=10(,switch)?$`, Unit: "reported-p99-ms"},
	{Text: "Fleet: 1 flow x 100 pods, every agent Paused, p99 <= 100 ms", Benchmark: `^BenchmarkFleetPause/flows=1,pods=100$`, Unit: "all-p99-ms", Cmp: "<=", Threshold: 100},
	{Text: "Fleet: 1 flow x 1000 pods, every agent Paused, p99 <= 250 ms", Benchmark: `^BenchmarkFleetPause/flows=1,pods=1000$`, Unit: "all-p99-ms", Cmp: "<=", Threshold: 250},
	{Text: "Fleet: 1 flow x 10 000 agents, every agent Paused, p99 <= 2 s", Benchmark: `^BenchmarkFleetPause/flows=1,pods=10000$`, Unit: "all-p99-ms", Cmp: "<=", Threshold: 2000},
	{Text: "Fleet: 1 flow x 10 000 agents, controller peak RSS (VmHWM) <= 200 MiB", Benchmark: `^BenchmarkFleetPause/flows=1,pods=10000$`, Unit: "hwm-MiB", Cmp: "<=", Threshold: 200},
	{Text: "Fleet: full resync of 1000 flows x 10 pods (a controller start), first push to last, p99 <= 2 s", Benchmark: `^BenchmarkFleetResync/flows=1000,pods=10$`, Unit: "all-p99-ms", Cmp: "<=", Threshold: 2000},
	{Text: "Fleet: full resync of 1000 flows x 10 pods, from the process start (context)", Benchmark: `^BenchmarkFleetResync/flows=1000,pods=10$`, Unit: "from-start-p99-ms"},
	{Text: "Fleet, one hanging pod per flow: 100 x 10, the others' p99 / without it", Benchmark: `^BenchmarkFleetPause/flows=100,pods=10,hanging=1$`, Over: `^BenchmarkFleetPause/flows=100,pods=10$`, Unit: "all-p99-ms", Cmp: "<=", Threshold: 1.2},
	{Text: "Fleet, one hanging pod per flow: 1 x 100, the others' p99 / without it", Benchmark: `^BenchmarkFleetPause/flows=1,pods=100,hanging=1$`, Over: `^BenchmarkFleetPause/flows=1,pods=100$`, Unit: "all-p99-ms", Cmp: "<=", Threshold: 1.2},
	{Text: "Fleet, one hanging pod per flow: 1 x 1000, the others' p99 / without it", Benchmark: `^BenchmarkFleetPause/flows=1,pods=1000,hanging=1$`, Over: `^BenchmarkFleetPause/flows=1,pods=1000$`, Unit: "all-p99-ms", Cmp: "<=", Threshold: 1.2},
	{Text: "Fleet, one hanging pod per flow: 1 x 10 000, the others' p99 / without it", Benchmark: `^BenchmarkFleetPause/flows=1,pods=10000,hanging=1$`, Over: `^BenchmarkFleetPause/flows=1,pods=10000$`, Unit: "all-p99-ms", Cmp: "<=", Threshold: 1.2},
	{Text: "Fleet, one hanging pod shared by the 1000 flows: full resync / without it", Benchmark: `^BenchmarkFleetResync/flows=1000,pods=10,hanging=1$`, Over: `^BenchmarkFleetResync/flows=1000,pods=10$`, Unit: "all-p99-ms", Cmp: "<=", Threshold: 1.2},
	{Text: "Fleet, one hanging pod per flow: absolute figures (context; the ratio rows above judge them)", Benchmark: `^BenchmarkFleet\w+/.*hanging=1$`, Unit: "all-p99-ms"},
	// The protocol sidecar (issue 24): its binary in front of the broker, pulsar-client-go.
	{Text: "Sidecar: sidecar / direct consume throughput, pulsar-client-go, median of interleaved rounds", Benchmark: `^BenchmarkSidecarThroughput$`, Unit: "sidecar/direct", Cmp: ">=", Threshold: 0.9},
	{Text: "Sidecar: sidecar / direct consume throughput, the Java consumer app (it prints every message), median of rounds", Benchmark: `^BenchmarkSidecarThroughputJava$`, Unit: "sidecar/direct", Cmp: ">=", Threshold: 0.9},
	{Text: "Sidecar: the sidecar process's CPU per message (context)", Benchmark: `^BenchmarkSidecarThroughput$`, Unit: "sidecar-cpu-\u00b5s/msg"},
	{Text: "Sidecar: RSS of the sidecar process idle (its binary's pages included)", Benchmark: `^BenchmarkSidecarThroughput$`, Unit: "sidecar-idle-rss-MiB", Cmp: "<=", Threshold: 16},
	{Text: "Sidecar: peak RSS of the sidecar process at that rate (its binary's pages included)", Benchmark: `^BenchmarkSidecarThroughput$`, Unit: "sidecar-hwm-MiB", Cmp: "<=", Threshold: 16},
	{Text: "Sidecar: peak anonymous memory (heap, stacks) of the sidecar process at that rate, sampled every 5 ms (context)", Benchmark: `^BenchmarkSidecarThroughput$`, Unit: "sidecar-anon-MiB"},
	{Text: "Sidecar: heap in use with 250 clients each announcing a 5 MiB frame and sending one byte of it", Benchmark: `^BenchmarkSidecarAnnouncedFrames$`, Unit: "heap-MiB", Cmp: "<=", Threshold: 64},
	{Text: "Sidecar: added latency from send to the application's Receive, p50 (context)", Benchmark: `^BenchmarkSidecarLatency$`, Unit: "added-p50-\u00b5s"},
	{Text: "Sidecar: added latency from send to the application's Receive, p99 (context)", Benchmark: `^BenchmarkSidecarLatency$`, Unit: "added-p99-\u00b5s"},
	{Text: "Pause propagation through sidecars, 100 pods: per-pod p99 (the agents' target)", Benchmark: `^BenchmarkPausePropagation/sidecars=100$`, Unit: "p99-ms", Cmp: "<=", Threshold: 250},
	{Text: "Pause propagation through sidecars, 100 pods: every sidecar Paused, p99 (the agents' target)", Benchmark: `^BenchmarkPausePropagation/sidecars=100$`, Unit: "all-p99-ms", Cmp: "<=", Threshold: 250},
	{Text: "Pause propagation through sidecars, 1000 pods: per-pod p99 (the agents' target)", Benchmark: `^BenchmarkPausePropagation/sidecars=1000$`, Unit: "p99-ms", Cmp: "<=", Threshold: 1000},
	{Text: "Pause propagation through sidecars, 1000 pods: every sidecar Paused, p99 (the agents' target)", Benchmark: `^BenchmarkPausePropagation/sidecars=1000$`, Unit: "all-p99-ms", Cmp: "<=", Threshold: 1000},
	{Text: "Pause propagation through sidecars, 10 pods (context)", Benchmark: `^BenchmarkPausePropagation/sidecars=10$`, Unit: "p99-ms"},
	{Text: "Release: a relabelled pod's agent released, p99 <= 1 s", Benchmark: `^BenchmarkReleaseAfterRelabel$`, Unit: "p99-ms", Cmp: "<=", Threshold: 1000},
	{Text: "New matched pod reached by the controller, p99 (context)", Benchmark: `^BenchmarkNewPodReached$`, Unit: "p99-ms"},
	// Pause by condition (issue 41).
	{Text: "Pause by condition: dependency unavailable -> every one of 10 agents Paused, read every 1 s: p99 <= interval + 1 s", Benchmark: `^BenchmarkConditionPause$`, Unit: "all-p99-ms", Cmp: "<=", Threshold: 2000},
	{Text: "Pause by condition: the same per agent, p50 (context)", Benchmark: `^BenchmarkConditionPause$`, Unit: "p50-ms"},
	{Text: "Conditions, 1000 flows x 1 condition every 10 s on 10 objects: object reads per interval <= 2 per object read", Benchmark: `^BenchmarkConditionEvaluation$`, Unit: "object-gets/interval", Cmp: "<=", Threshold: 20},
	{Text: "Conditions, 1000 flows x 1 condition every 10 s: API requests per interval, all (context)", Benchmark: `^BenchmarkConditionEvaluation$`, Unit: "api-requests/interval"},
	{Text: "Conditions, 1000 flows x 1 condition every 10 s: controller CPU per interval (context)", Benchmark: `^BenchmarkConditionEvaluation$`, Unit: "cpu-ms/interval"},
	{Text: "Schedule math: worst accepted spec per evaluation, p99 <= 5 ms", Benchmark: `^BenchmarkWorstAcceptedSchedule$`, Unit: "p99-ms", Cmp: "<=", Threshold: 5},
	{Text: "Hostile clients: authenticated push with 500 slow-body connections open, p99 <= 1 s", Benchmark: `^BenchmarkPushUnderSlowClients`, Unit: "p99-ms", Cmp: "<=", Threshold: 1000},
	{Text: "Chaos, long run: >= 1000 random operations", Benchmark: `^BenchmarkLongRun$`, Unit: "operations", Cmp: ">=", Threshold: 1000},
	{Text: "Chaos, long run: >= 100k messages", Benchmark: `^BenchmarkLongRun$`, Unit: "messages", Cmp: ">=", Threshold: 100_000},
	{Text: "Chaos, long run: 0 invariant violations", Benchmark: `^BenchmarkLongRun$`, Unit: "violations", Cmp: "<=", Threshold: 0},
	{Text: "Chaos, long run: convergence after the last operation (context)", Benchmark: `^BenchmarkLongRun$`, Unit: "converge-ms"},
	{Text: "Chaos, long run on a real Pulsar: >= 1000 random operations", Benchmark: `^BenchmarkLongRunPulsar$`, Unit: "operations", Cmp: ">=", Threshold: 1000},
	{Text: "Chaos, long run on a real Pulsar: >= 100k messages", Benchmark: `^BenchmarkLongRunPulsar$`, Unit: "messages", Cmp: ">=", Threshold: 100_000},
	{Text: "Chaos, long run on a real Pulsar: 0 invariant violations", Benchmark: `^BenchmarkLongRunPulsar$`, Unit: "violations", Cmp: "<=", Threshold: 0},
	{Text: "Seek by index on a real Pulsar, 10^6 entries: probes <= 2*log2(entries)+8", Benchmark: `^BenchmarkWholeSeekPulsar$`, Unit: "probes/op", Cmp: "<=", Threshold: probeBound(1e6)},
	{Text: "Seek by index on a real Pulsar, 10^6 entries: whole seek under 1 s", Benchmark: `^BenchmarkWholeSeekPulsar$`, Unit: "ms/seek", Cmp: "<", Threshold: 1000},
	{Text: "Test broker produce+consume throughput (context; the consume benchmarks drain a pre-produced backlog instead)", Benchmark: `^BenchmarkProduceConsume/`, Unit: "msgs/s"},
}

// Verdict is a target checked against one benchmark (or "not measured" without one).
type Verdict struct {
	Target    Target
	Benchmark string // empty when not measured
	Value     float64
	Status    string // "met", "missed", "not measured" or "context"
}

const (
	statusMet         = "met"
	statusMissed      = "missed"
	statusNotMeasured = "not measured"
	statusContext     = "context"
)

// evaluateTargets checks every target against every benchmark it matches.
func evaluateTargets(targets []Target, results []Result) ([]Verdict, error) {
	var verdicts []Verdict
	for _, t := range targets {
		vs, err := evaluateTarget(t, results)
		if err != nil {
			return nil, err
		}
		verdicts = append(verdicts, vs...)
	}
	return verdicts, nil
}

func evaluateTarget(t Target, results []Result) ([]Verdict, error) {
	match, err := regexp.Compile(t.Benchmark)
	if err != nil {
		return nil, fmt.Errorf("target %q: %w", t.Text, err)
	}
	var verdicts []Verdict
	for _, r := range results {
		if !match.MatchString(r.Name) {
			continue
		}
		value, ok, err := measure(t, r, results)
		if err != nil {
			return nil, err
		}
		if ok {
			verdicts = append(verdicts, Verdict{Target: t, Benchmark: r.Name, Value: value, Status: judge(t, value)})
		}
	}
	if len(verdicts) == 0 {
		verdicts = append(verdicts, Verdict{Target: t, Status: statusNotMeasured})
	}
	return verdicts, nil
}

// measure returns the target's figure for r: its metric, or its ratio to the Over benchmark.
func measure(t Target, r Result, results []Result) (float64, bool, error) {
	value, ok := r.Metric(t.Unit)
	if !ok || t.Over == "" {
		return value, ok, nil
	}
	over, err := regexp.Compile(t.Over)
	if err != nil {
		return 0, false, fmt.Errorf("target %q: %w", t.Text, err)
	}
	for _, d := range results {
		if denominator, ok := d.Metric(t.Unit); ok && over.MatchString(d.Name) && denominator != 0 {
			return value / denominator, true, nil
		}
	}
	return 0, false, nil
}

func judge(t Target, value float64) string {
	var met bool
	switch t.Cmp {
	case ">=":
		met = value >= t.Threshold
	case "<=":
		met = value <= t.Threshold
	case ">":
		met = value > t.Threshold
	case "<":
		met = value < t.Threshold
	default:
		return statusContext
	}
	if met {
		return statusMet
	}
	return statusMissed
}
