package main

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseBenchOutput(t *testing.T) {
	tests := []struct {
		name   string
		output string
		want   []Result
	}{
		{
			name: "standard metrics and headers",
			output: `goos: linux
goarch: amd64
pkg: github.com/subflow-dev/subflow/internal/testing/pulsartest
cpu: AMD EPYC 7B13
BenchmarkProduceConsume/batching=true-2         	  500000	      2150 ns/op	  465116 msgs/s	     812 B/op	      14 allocs/op
PASS
ok  	github.com/subflow-dev/subflow/internal/testing/pulsartest	12.3s
`,
			want: []Result{{Package: "github.com/subflow-dev/subflow/internal/testing/pulsartest", Name: "BenchmarkProduceConsume/batching=true", Procs: 2, Iterations: 500000,
				Metrics: []Metric{{2150, "ns/op"}, {465116, "msgs/s"}, {812, "B/op"}, {14, "allocs/op"}}}},
		},
		{
			name: "custom units, no procs suffix, log lines in between",
			output: `BenchmarkPausePropagation/agents=100
    bench_test.go:42: started 100 agents
BenchmarkPausePropagation/agents=100 	       3	 401234567 ns/op	        41.50 p50-ms	       180.2 p99-ms	       190.0 all-p99-ms
BenchmarkConsumeInterleaved-2   	      10	 123 ns/op	         0.9912 agent/raw
BenchmarkResumeToFirstMessage-2 	    1000	   55 ns/op	        35.00 p50-μs	        80.00 p99-µs
`,
			want: []Result{
				{Package: "default/pkg", Name: "BenchmarkPausePropagation/agents=100", Procs: 1, Iterations: 3,
					Metrics: []Metric{{401234567, "ns/op"}, {41.5, "p50-ms"}, {180.2, "p99-ms"}, {190, "all-p99-ms"}}},
				{Package: "default/pkg", Name: "BenchmarkConsumeInterleaved", Procs: 2, Iterations: 10,
					Metrics: []Metric{{123, "ns/op"}, {0.9912, "agent/raw"}}},
				{Package: "default/pkg", Name: "BenchmarkResumeToFirstMessage", Procs: 2, Iterations: 1000,
					Metrics: []Metric{{55, "ns/op"}, {35, "p50-\u00b5s"}, {80, "p99-\u00b5s"}}},
			},
		},
		{
			name: "not results",
			output: `BenchmarkBroken-2   	--- FAIL: BenchmarkBroken-2
BenchmarkOdd-2 	 10 	 5 ns/op 	 7
Benchmarks are fun 1 2 3
--- BENCH: BenchmarkX-2
FAIL	github.com/subflow-dev/subflow/agent	1.0s
`,
			want: nil,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseBenchOutput(strings.NewReader(tt.output), "default/pkg")
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.Results, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got.Results, tt.want)
			}
		})
	}
}

func TestSplitProcs(t *testing.T) {
	tests := []struct {
		in    string
		name  string
		procs int
	}{
		{"BenchmarkA-8", "BenchmarkA", 8},
		{"BenchmarkA", "BenchmarkA", 1},
		{"BenchmarkSeek/entries=10/binary-search-2", "BenchmarkSeek/entries=10/binary-search", 2},
		{"BenchmarkSeek/mode=a-b", "BenchmarkSeek/mode=a-b", 1},
	}
	for _, tt := range tests {
		if name, procs := splitProcs(tt.in); name != tt.name || procs != tt.procs {
			t.Errorf("splitProcs(%q) = %q, %d; want %q, %d", tt.in, name, procs, tt.name, tt.procs)
		}
	}
}
