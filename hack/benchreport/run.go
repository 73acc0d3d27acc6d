package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"time"
)

// benchmarkFunc finds benchmark declarations in test files.
var benchmarkFunc = regexp.MustCompile(`(?m)^func Benchmark\w*\(`)

// benchmarkPackages lists the packages matching patterns whose test files declare benchmarks,
// so that go test does not build and run the test binaries of the others.
func benchmarkPackages(patterns []string) ([]string, error) {
	args := append([]string{"list", "-e", "-f", `{{.ImportPath}}{{"\t"}}{{.Dir}}{{"\t"}}{{join .TestGoFiles " "}} {{join .XTestGoFiles " "}}`}, patterns...)
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		return nil, fmt.Errorf("go list %s: %w", strings.Join(patterns, " "), stderrOf(err))
	}
	var pkgs []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.SplitN(line, "\t", 3)
		if len(fields) == 3 && declaresBenchmarks(fields[1], strings.Fields(fields[2])) {
			pkgs = append(pkgs, fields[0])
		}
	}
	return pkgs, nil
}

func declaresBenchmarks(dir string, testFiles []string) bool {
	for _, name := range testFiles {
		src, err := os.ReadFile(filepath.Join(dir, name))
		if err == nil && benchmarkFunc.Match(src) {
			return true
		}
	}
	return false
}

// benchArgs are the go test arguments shared by every package; -run '^$' skips the tests.
func benchArgs(o options) []string {
	args := []string{"test", "-run", "^$", "-bench", o.bench, "-benchmem", "-count=1", "-timeout", o.timeout.String()}
	if o.benchtime != "" {
		args = append(args, "-benchtime", o.benchtime)
	}
	return args
}

// isolated are benchmarks that measure a whole process (its memory, its CPU, the controller's
// full resync) or the controller's own requeues on the wall clock, and so run alone in a go test
// process of their own, not after others in the same one (whose flows would still reconcile).
var isolated = []string{"BenchmarkFullResync", "BenchmarkConditionPause", "BenchmarkConditionEvaluation"}

var isolatedPattern = "^(" + strings.Join(isolated, "|") + ")$"

// isolatedRuns gives the extra go test arguments for each isolated benchmark that -bench selects.
func isolatedRuns(bench string) [][]string {
	selected, err := regexp.Compile(bench)
	if err != nil {
		return nil
	}
	var runs [][]string
	for _, name := range isolated {
		if selected.MatchString(name) {
			runs = append(runs, []string{"-bench", "^" + name + "$"})
		}
	}
	return runs
}

// runPackage benchmarks one package, with extra go test arguments, streaming go test's output
// to progress while keeping it for parsing. A failing package is reported, not fatal: the
// others still run.
func runPackage(o options, pkg string, extra []string, progress io.Writer) (BenchOutput, PackageRun, []byte) {
	fmt.Fprintf(progress, "benchreport: benchmarking %s %s\n", pkg, strings.Join(extra, " "))
	start := time.Now()
	// What go test compiles is the tree as it is now, before the run: a change made while the
	// benchmarks run is not part of them.
	measured := start.UTC().Format(dateLayout) + " at " + commit()
	var captured bytes.Buffer
	cmd := exec.Command("go", append(append(benchArgs(o), extra...), pkg)...)
	cmd.Stdout = io.MultiWriter(progress, &captured)
	cmd.Stderr = progress
	err := cmd.Run()
	fmt.Fprintf(progress, "benchreport: %s done in %s\n", pkg, time.Since(start).Round(time.Second))
	// Parsed from a reader over the bytes, so that the failure line below still sees them.
	raw := captured.Bytes()
	out, parseErr := parseBenchOutput(bytes.NewReader(raw), pkg)
	run := PackageRun{Package: pkg, Measured: measured}
	switch {
	case err != nil:
		run.Failure = fmt.Sprintf("go test: %v%s", err, lastFailureLine(captured.String()))
	case parseErr != nil:
		run.Failure = fmt.Sprintf("reading output: %v", parseErr)
	}
	return out, run, raw
}

// lastFailureLine picks the most telling line of a failed run for the report.
func lastFailureLine(output string) string {
	lines := strings.Split(strings.TrimSpace(output), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		line := strings.TrimSpace(lines[i])
		if strings.Contains(line, "_test.go:") || strings.HasPrefix(line, "panic:") {
			return " (" + line + ")"
		}
	}
	return ""
}

const dateLayout = "2006-01-02 15:04 MST"

func describeMachine() Machine {
	return Machine{
		GoVersion: goEnv("GOVERSION"),
		GOOS:      goEnv("GOOS"),
		GOARCH:    goEnv("GOARCH"),
		CPUs:      nproc(),
		CPUModel:  cpuModel(),
		Commit:    commit(),
		Date:      time.Now().UTC().Format(dateLayout),
	}
}

func goEnv(name string) string {
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

func nproc() string {
	if out, err := exec.Command("nproc").Output(); err == nil {
		return strings.TrimSpace(string(out))
	}
	return fmt.Sprint(runtime.NumCPU())
}

// cpuModel reads the first "model name" of /proc/cpuinfo; empty elsewhere, where go test's
// own "cpu:" header is used instead.
func cpuModel() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		if key, value, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(key) == "model name" {
			return strings.TrimSpace(value)
		}
	}
	return ""
}

// commit names the measured source; uncommitted changes are flagged since they are part of it.
func commit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return ""
	}
	c := strings.TrimSpace(string(out))
	if treeIsDirty() {
		return c + " with uncommitted changes"
	}
	return c + " (clean tree: the figures are this commit's)"
}

// treeIsDirty reports uncommitted changes to tracked or new files (the report and its parts
// aside: an earlier sitting's parts are not a change to what is measured).
func treeIsDirty() bool {
	status, err := exec.Command("git", "status", "--porcelain", "--", ".", ":!BENCHMARKS.md", ":!bench-runs").Output()
	return err == nil && len(bytes.TrimSpace(status)) > 0
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return "", fmt.Errorf("finding the module root: %w", stderrOf(err))
	}
	return strings.TrimSpace(string(out)), nil
}

// stderrOf adds a failed command's stderr to its error.
func stderrOf(err error) error {
	if exitErr, ok := err.(*exec.ExitError); ok && len(exitErr.Stderr) > 0 {
		return fmt.Errorf("%w: %s", err, bytes.TrimSpace(exitErr.Stderr))
	}
	return err
}
