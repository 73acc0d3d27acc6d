// Command benchreport runs the repository's benchmarks in one go and writes BENCHMARKS.md:
// machine details, every benchmark's figures per package, and docs/design.md section 6's targets
// marked met, missed or not measured.
//
//	go run ./hack/benchreport                      # every package with benchmarks
//	go run ./hack/benchreport ./internal/testing/pulsartest/
//	go run ./hack/benchreport -input bench.txt     # report on saved go test -bench output
//
// Progress (go test's own output) goes to stderr. It exits non-zero when a package failed,
// after writing the report.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

type options struct {
	patterns  []string
	output    string
	input     string
	bench     string
	benchtime string
	timeout   time.Duration
	dirty     bool
	parts     string
	resume    bool
}

func main() {
	if err := run(parseFlags()); err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
}

func parseFlags() options {
	var o options
	flag.StringVar(&o.output, "o", "", "report file (default BENCHMARKS.md at the module root)")
	flag.StringVar(&o.input, "input", "", "parse this saved `go test -bench` output instead of running benchmarks (machine details are still this machine's)")
	flag.StringVar(&o.bench, "bench", ".", "benchmark regexp passed to go test -bench")
	flag.StringVar(&o.benchtime, "benchtime", "", "passed to go test -benchtime when set")
	// internal/testing/fleetbench takes about two hours at full size (100 rounds of every fleet shape).
	flag.DurationVar(&o.timeout, "timeout", 3*time.Hour, "go test -timeout per package")
	flag.StringVar(&o.parts, "parts", "", "keep each go test run's output in this directory (a part per package, and per isolated benchmark)")
	flag.BoolVar(&o.resume, "resume", false, "with -parts: read the runs whose part is there instead of running them again")
	flag.BoolVar(&o.dirty, "allow-dirty", false, "measure a tree with uncommitted changes (the report says so); by default refuse, so that every report names the commit it measured")
	flag.Parse()
	o.patterns = flag.Args()
	if len(o.patterns) == 0 {
		o.patterns = []string{"./..."}
	}
	return o
}

func run(o options) error {
	if o.resume && o.parts == "" {
		return errors.New("-resume reads the parts of -parts: name the directory")
	}
	if o.input == "" && !o.dirty && treeIsDirty() {
		return errors.New("the tree has uncommitted changes: commit first so that the report names what it measured, or pass -allow-dirty")
	}
	if o.output == "" {
		root, err := moduleRoot()
		if err != nil {
			return err
		}
		o.output = filepath.Join(root, "BENCHMARKS.md")
	}
	out, runs, err := collect(o)
	if err != nil {
		return err
	}
	report, err := buildReport(o, out, runs)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	writeReport(&buf, report)
	if err := os.WriteFile(o.output, buf.Bytes(), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "benchreport: wrote %s (%d benchmarks)\n", o.output, len(out.Results))
	return failedPackages(runs)
}

// collect runs the benchmarks package by package, or reads a saved run.
func collect(o options) (BenchOutput, []PackageRun, error) {
	if o.input != "" {
		f, err := os.Open(o.input)
		if err != nil {
			return BenchOutput{}, nil, err
		}
		defer f.Close()
		out, err := parseBenchOutput(f, "")
		return out, nil, err
	}
	pkgs, err := benchmarkPackages(o.patterns)
	if err != nil {
		return BenchOutput{}, nil, err
	}
	if len(pkgs) == 0 {
		return BenchOutput{}, nil, fmt.Errorf("no benchmarks in %s", strings.Join(o.patterns, " "))
	}
	fmt.Fprintf(os.Stderr, "benchreport: %d packages with benchmarks: %s\n", len(pkgs), strings.Join(pkgs, " "))
	var all BenchOutput
	var runs []PackageRun
	for _, pkg := range pkgs {
		// The package's own benchmarks first, then each isolated one in a process of its own.
		for _, args := range append([][]string{{"-skip", isolatedPattern}}, isolatedRuns(o.bench)...) {
			out, run, err := runOrResume(o, pkg, args)
			if err != nil {
				return BenchOutput{}, nil, err
			}
			all.Results = append(all.Results, out.Results...)
			if out.CPU != "" {
				all.CPU = out.CPU
			}
			if run.Failure != "" || len(out.Results) > 0 {
				runs = append(runs, run)
			}
		}
	}
	return all, runs, nil
}

// runOrResume runs one package's benchmarks, or with -resume reads them from their part. With
// -parts, a run that passed with results is kept as its part (an isolated benchmark's run in a
// package without it has none, and takes seconds).
func runOrResume(o options, pkg string, extra []string) (BenchOutput, PackageRun, error) {
	if o.parts == "" {
		out, run, _ := runPackage(o, pkg, extra, os.Stderr)
		return out, run, nil
	}
	path := partPath(o.parts, pkg, extra)
	if o.resume {
		out, run, ok, err := readPart(path, pkg)
		if err != nil {
			return BenchOutput{}, PackageRun{}, err
		}
		if ok {
			fmt.Fprintf(os.Stderr, "benchreport: %s %s: read from %s (measured %s)\n", pkg, strings.Join(extra, " "), path, run.Measured)
			return out, run, nil
		}
	}
	out, run, raw := runPackage(o, pkg, extra, os.Stderr)
	if run.Failure == "" && len(out.Results) > 0 {
		if err := writePart(path, run.Measured, raw); err != nil {
			return BenchOutput{}, PackageRun{}, err
		}
	}
	return out, run, nil
}

func buildReport(o options, out BenchOutput, runs []PackageRun) (Report, error) {
	verdicts, err := evaluateTargets(targets, out.Results)
	if err != nil {
		return Report{}, err
	}
	machine := describeMachine()
	machine.TestCPU = out.CPU
	command := "`go " + shellJoin(benchArgs(o)) + " " + strings.Join(o.patterns, " ") + "`"
	if o.input != "" {
		command = "the benchmarks whose output was saved in `" + o.input + "`"
	}
	return Report{
		Command:  command,
		Machine:  machine,
		Runs:     runs,
		Results:  out.Results,
		Verdicts: verdicts,
	}, nil
}

// shellJoin quotes the arguments a shell would mangle, so the command can be pasted.
func shellJoin(args []string) string {
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = a
		if strings.ContainsAny(a, "^$*?[]| ") {
			quoted[i] = "'" + a + "'"
		}
	}
	return strings.Join(quoted, " ")
}

func failedPackages(runs []PackageRun) error {
	var errs []error
	for _, r := range runs {
		if r.Failure != "" {
			errs = append(errs, fmt.Errorf("%s: %s", r.Package, r.Failure))
		}
	}
	return errors.Join(errs...)
}
