package main

import (
	"bufio"
	"io"
	"strconv"
	"strings"
)

// Metric is one value of a benchmark line: ns/op, B/op, allocs/op or a b.ReportMetric unit.
type Metric struct {
	Value float64
	Unit  string
}

// Result is one benchmark line of `go test -bench` output.
type Result struct {
	Package    string
	Name       string // full name with sub-benchmarks, without the -GOMAXPROCS suffix
	Procs      int
	Iterations int64
	Metrics    []Metric
}

// Metric returns the value reported with unit.
func (r Result) Metric(unit string) (float64, bool) {
	for _, m := range r.Metrics {
		if m.Unit == unit {
			return m.Value, true
		}
	}
	return 0, false
}

// BenchOutput is what one or more `go test -bench` runs printed.
type BenchOutput struct {
	CPU     string // from the "cpu:" header go test prints
	Results []Result
}

// parseBenchOutput reads standard benchmark output; pkg names the package until a "pkg:" header
// says otherwise. Log lines, PASS/ok lines and anything else not shaped like a result are skipped.
func parseBenchOutput(r io.Reader, pkg string) (BenchOutput, error) {
	var out BenchOutput
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024) // benchmarks may log long lines
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "pkg: "):
			pkg = strings.TrimSpace(strings.TrimPrefix(line, "pkg: "))
		case strings.HasPrefix(line, "cpu: "):
			out.CPU = strings.TrimSpace(strings.TrimPrefix(line, "cpu: "))
		default:
			if res, ok := parseBenchLine(line); ok {
				res.Package = pkg
				out.Results = append(out.Results, res)
			}
		}
	}
	return out, sc.Err()
}

// parseBenchLine parses "BenchmarkName-4  1000  123 ns/op  1.5 msgs/s ...": a name, an
// iteration count, then value-unit pairs.
func parseBenchLine(line string) (Result, bool) {
	fields := strings.Fields(line)
	if len(fields) < 4 || len(fields)%2 != 0 || !strings.HasPrefix(fields[0], "Benchmark") {
		return Result{}, false
	}
	iterations, err := strconv.ParseInt(fields[1], 10, 64)
	if err != nil {
		return Result{}, false
	}
	name, procs := splitProcs(fields[0])
	res := Result{Name: name, Procs: procs, Iterations: iterations}
	for i := 2; i < len(fields); i += 2 {
		value, err := strconv.ParseFloat(fields[i], 64)
		if err != nil {
			return Result{}, false
		}
		res.Metrics = append(res.Metrics, Metric{Value: value, Unit: normalizeUnit(fields[i+1])})
	}
	return res, true
}

// splitProcs removes the -GOMAXPROCS suffix go test appends when GOMAXPROCS > 1.
func splitProcs(name string) (string, int) {
	i := strings.LastIndexByte(name, '-')
	if i < 0 {
		return name, 1
	}
	procs, err := strconv.Atoi(name[i+1:])
	if err != nil || procs <= 0 {
		return name, 1
	}
	return name[:i], procs
}

// normalizeUnit folds the Greek mu into the micro sign so "p99-μs" and "p99-µs" are one unit.
func normalizeUnit(unit string) string {
	return strings.ReplaceAll(unit, "\u03bc", "\u00b5")
}
