package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const fleetPkg = "github.com/subflow-dev/subflow/internal/testing/fleetbench"

func TestPartIsReadBackAsMeasured(t *testing.T) {
	dir := t.TempDir()
	path := partPath(dir, fleetPkg, []string{"-skip", isolatedPattern})
	if want := filepath.Join(dir, "internal_testing_fleetbench.txt"); path != want {
		t.Errorf("part path %s, want %s", path, want)
	}
	if isolated := partPath(dir, fleetPkg, []string{"-bench", "^BenchmarkFullResync$"}); isolated == path || !strings.HasSuffix(isolated, "__BenchmarkFullResync.txt") {
		t.Errorf("an isolated run's part %s is not its own", isolated)
	}
	output := "pkg: " + fleetPkg + "\nBenchmarkFleetPause/flows=1,pods=100-2 \t1\t5 ns/op\t42 all-p99-ms\nPASS\n"
	if err := writePart(path, "2026-12-03 15:04 UTC at abc1234", []byte(output)); err != nil {
		t.Fatal(err)
	}
	out, run, ok, err := readPart(path, fleetPkg)
	if err != nil || !ok {
		t.Fatalf("reading the part back: ok %v, %v", ok, err)
	}
	if run.Measured != "2026-12-03 15:04 UTC at abc1234" || run.FromPart != path || run.Package != fleetPkg {
		t.Errorf("run %+v", run)
	}
	if len(out.Results) != 1 {
		t.Fatalf("results %+v", out.Results)
	}
	if v, _ := out.Results[0].Metric("all-p99-ms"); v != 42 || out.Results[0].Name != "BenchmarkFleetPause/flows=1,pods=100" {
		t.Errorf("result %+v", out.Results[0])
	}
}

func TestMissingPartIsRunAndForeignFileRefused(t *testing.T) {
	dir := t.TempDir()
	if _, _, ok, err := readPart(filepath.Join(dir, "none.txt"), fleetPkg); ok || err != nil {
		t.Errorf("a missing part: ok %v, err %v; want a run instead", ok, err)
	}
	foreign := filepath.Join(dir, "foreign.txt")
	if err := os.WriteFile(foreign, []byte("BenchmarkX-2 1 5 ns/op\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := readPart(foreign, fleetPkg); err == nil || !strings.Contains(err.Error(), "not a part benchreport wrote") {
		t.Errorf("a file without the header: %v", err)
	}
}

func TestResumedReportSaysWhenEachPackageWasMeasured(t *testing.T) {
	var buf bytes.Buffer
	writeReport(&buf, Report{Command: "`go test`", Runs: []PackageRun{
		{Package: fleetPkg, Measured: "2026-12-03 15:04 UTC at abc1234", FromPart: "bench-runs/internal_testing_fleetbench.txt"},
		{Package: "github.com/subflow-dev/subflow/agent", Measured: "2026-12-04 09:00 UTC at def5678"},
	}})
	got := buf.String()
	for _, want := range []string{"more than one sitting", "## Runs",
		"| `" + fleetPkg + "` | 2026-12-03 15:04 UTC at abc1234 | `bench-runs/internal_testing_fleetbench.txt` |",
		"| `github.com/subflow-dev/subflow/agent` | 2026-12-04 09:00 UTC at def5678 | this run |"} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
	buf.Reset()
	writeReport(&buf, Report{Command: "`go test`", Runs: []PackageRun{{Package: fleetPkg}}})
	if got := buf.String(); strings.Contains(got, "## Runs") || !strings.Contains(got, "All figures below come from one run") {
		t.Errorf("a report of one run:\n%s", got)
	}
}
