package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// A part is one go test run's output kept in the -parts directory, headed by when and at which
// commit it was measured. Every package one after the other takes longer than a working
// session on a 2-core machine (internal/testing/fleetbench alone about two hours), so -resume reads
// the parts already there instead of running them again, and a report can be built in
// several sittings. A failed run leaves no part, so that resuming runs it again.

const partHeader = "# benchreport: measured "

// partPath names the part of one run: the package, and the isolated benchmark if it is one.
func partPath(dir, pkg string, extra []string) string {
	name := strings.ReplaceAll(strings.TrimPrefix(pkg, modulePath()+"/"), "/", "_")
	if len(extra) == 2 && extra[0] == "-bench" {
		name += "__" + strings.Trim(extra[1], "^$")
	}
	return filepath.Join(dir, name+".txt")
}

func writePart(path, measured string, output []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append([]byte(partHeader+measured+"\n"), output...), 0o644)
}

// readPart returns a part's results and when it was measured; ok is false when there is none.
func readPart(path, pkg string) (out BenchOutput, run PackageRun, ok bool, err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return BenchOutput{}, PackageRun{}, false, nil
	}
	if err != nil {
		return BenchOutput{}, PackageRun{}, false, err
	}
	first, rest, _ := bytes.Cut(data, []byte("\n"))
	measured, found := strings.CutPrefix(string(first), partHeader)
	if !found {
		return BenchOutput{}, PackageRun{}, false, fmt.Errorf("%s: first line is not %q...: not a part benchreport wrote", path, partHeader)
	}
	out, err = parseBenchOutput(bytes.NewReader(rest), pkg)
	if err != nil {
		return BenchOutput{}, PackageRun{}, false, fmt.Errorf("%s: %w", path, err)
	}
	return out, PackageRun{Package: pkg, Measured: measured, FromPart: path}, true, nil
}

// modulePath is the module's import path, which part names leave out.
var modulePath = sync.OnceValue(func() string {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Path}}").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
})
