package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// TestInteractiveKeepsProducingAndStopsWithGoRun runs the demo as a person would
// (`go run ./hack/demo --interactive`): after the walk-through the producer keeps going, and
// SIGTERM to `go run` (which does not pass it on) ends the demo and the control plane it started.
func TestInteractiveKeepsProducingAndStopsWithGoRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole demo")
	}
	d := startInteractive(t)
	produced := regexp.MustCompile(`produced (\d+)$`)
	var counts []int
	for len(counts) < 3 {
		if m := produced.FindStringSubmatch(d.next()); m != nil {
			n, _ := strconv.Atoi(m[1])
			counts = append(counts, n)
		}
	}
	cmd, lines := d.cmd, d.lines
	if counts[2] <= counts[0] {
		t.Fatalf("produced stays at %v after the walk-through", counts)
	}
	family := descendants(cmd.Process.Pid)
	if len(family) < 3 {
		t.Fatalf("found %d processes under go run, want the demo, kube-apiserver and etcd", len(family))
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	go func() {
		for range lines { // keep draining so that the demo never blocks on its output
		}
	}()
	var running []int
	stopped := testkit.Poll{Within: time.Minute, Every: 100 * time.Millisecond}.Until(func() bool {
		running = slices.DeleteFunc(slices.Clone(family), func(pid int) bool { return !alive(pid) })
		return len(running) == 0
	})
	if !stopped {
		t.Fatalf("process %d (%s) still runs after SIGTERM to go run", running[0], command(running[0]))
	}
}

// interactiveDemo is `go run . --interactive` once its walk-through is over.
type interactiveDemo struct {
	t          *testing.T
	cmd        *exec.Cmd
	lines      chan string
	seen       []string
	kubeconfig string
	deadline   <-chan time.Time
}

// startInteractive runs the demo as a person would and returns once it waits for kubectl.
func startInteractive(t *testing.T) *interactiveDemo {
	cmd := exec.Command("go", "run", ".", "--interactive")
	cmd.Env = os.Environ()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	d := &interactiveDemo{t: t, cmd: cmd, lines: make(chan string, 1024), deadline: time.After(5 * time.Minute)}
	go func() {
		defer close(d.lines)
		scan := bufio.NewScanner(out)
		for scan.Scan() {
			d.lines <- scan.Text()
		}
	}()
	kubeconfig := regexp.MustCompile(`^\s*export KUBECONFIG=(\S+)$`)
	for line := d.next(); !strings.Contains(line, "Press Ctrl-C"); line = d.next() {
		if m := kubeconfig.FindStringSubmatch(line); m != nil {
			d.kubeconfig = m[1]
		}
	}
	if d.kubeconfig == "" {
		t.Fatalf("the demo printed no kubeconfig:\n%s", strings.Join(d.seen, "\n"))
	}
	return d
}

// next returns the demo's next line of output.
func (d *interactiveDemo) next() string {
	d.t.Helper()
	select {
	case line, ok := <-d.lines:
		if !ok {
			d.t.Fatalf("the demo ended:\n%s", strings.Join(d.seen, "\n"))
		}
		d.seen = append(d.seen[max(0, len(d.seen)-30):], line)
		return line
	case <-d.deadline:
		d.t.Fatalf("timed out reading the interactive demo:\n%s", strings.Join(d.seen, "\n"))
		return ""
	}
}

// descendants lists every process below pid, from /proc.
func descendants(pid int) []int {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so read after the last ')'.
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) > 1 {
			ppid, _ := strconv.Atoi(fields[1])
			children[ppid] = append(children[ppid], p)
		}
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		next := queue[0]
		queue = queue[1:]
		for _, c := range children[next] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// alive reports whether pid runs (a zombie waiting for its parent counts as gone).
func alive(pid int) bool {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

func command(pid int) string {
	data, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	return strings.ReplaceAll(string(data), "\x00", " ")
}
