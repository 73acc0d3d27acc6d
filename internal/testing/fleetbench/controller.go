package fleetbench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/subflow-dev/subflow/internal/testing/testenv"
)

// Build compiles the controller (main.go) and the kubectl plugin into dir.
func Build(dir string) (controller, plugin string, err error) {
	controller, plugin = filepath.Join(dir, "subflow"), filepath.Join(dir, "kubectl-subflow")
	for _, b := range [][2]string{{controller, "."}, {plugin, "./cmd/kubectl-subflow"}} {
		cmd := exec.Command("go", "build", "-o", b[0], b[1])
		cmd.Dir = testenv.RepoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("go build %s: %v\n%s", b[1], err, out)
		}
	}
	return controller, plugin, nil
}

// Controller is the controller binary running as a process of its own, with its metrics and
// pprof endpoints on loopback.
type Controller struct {
	cmd        *exec.Cmd
	Started    time.Time
	metricsURL string
	pprofURL   string
	exited     chan struct{}
}

// freePort returns a loopback port nobody listens on now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// StartController runs bin against kubeconfig with plain-HTTP metrics and pprof, no leader
// election, and flags appended (they win over the defaults set here; "ENV:K=V" sets an
// environment variable instead). Its output goes to logPath.
func StartController(bin, kubeconfig, logPath string, flags []string) (*Controller, error) {
	metrics, err := freePort()
	if err != nil {
		return nil, err
	}
	pprof, err := freePort()
	if err != nil {
		return nil, err
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	args := []string{"--metrics-bind-address=127.0.0.1:" + strconv.Itoa(metrics), "--metrics-secure=false",
		"--health-probe-bind-address=0", "--leader-elect=false", "--pprof-bind-address=127.0.0.1:" + strconv.Itoa(pprof)}
	env := append(os.Environ(), "KUBECONFIG="+kubeconfig)
	for _, f := range flags {
		if kv, ok := strings.CutPrefix(f, "ENV:"); ok {
			env = append(env, kv)
		} else {
			args = append(args, f)
		}
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logFile, logFile
	c := &Controller{cmd: cmd, metricsURL: fmt.Sprintf("http://127.0.0.1:%d/metrics", metrics),
		pprofURL: fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/", pprof), exited: make(chan struct{})}
	c.Started = time.Now()
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, err
	}
	go func() { _ = cmd.Wait(); logFile.Close(); close(c.exited) }()
	if err := c.waitServing(30 * time.Second); err != nil {
		c.Stop()
		return nil, fmt.Errorf("%w (log: %s)", err, logPath)
	}
	return c, nil
}

func (c *Controller) waitServing(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-c.exited:
			return fmt.Errorf("controller exited at start")
		default:
		}
		if resp, err := http.Get(c.metricsURL); err == nil {
			resp.Body.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("controller metrics not served after %s", timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Pid is the controller's process id.
func (c *Controller) Pid() int { return c.cmd.Process.Pid }

// Stop ends the process (SIGTERM, then SIGKILL after 10 s) and waits for it.
func (c *Controller) Stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}

// Memory reads the controller's resident set and its high-water mark, in MiB.
func (c *Controller) Memory() (rss, hwm float64) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", c.Pid()))
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(fields[1], 64)
		switch fields[0] {
		case "VmRSS:":
			rss = kb / 1024
		case "VmHWM:":
			hwm = kb / 1024
		}
	}
	return rss, hwm
}

// Profile saves a profile (e.g. "profile?seconds=20", "heap") to path.
func (c *Controller) Profile(ctx context.Context, which, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.pprofURL+which, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("pprof %s: %s", which, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

// Metrics is one scrape of the Prometheus text format: value by "name{labels}".
type Metrics map[string]float64

// Scrape reads the controller's metrics endpoint.
func (c *Controller) Scrape() (Metrics, error) {
	resp, err := http.Get(c.metricsURL)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return parseMetrics(resp.Body)
}

// parseMetrics reads the Prometheus text format, keeping every sample line.
func parseMetrics(r io.Reader) (Metrics, error) {
	m := Metrics{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			m[line[:i]] = v
		}
	}
	return m, sc.Err()
}

// Sum adds the series of one metric name whose labels contain every one of match.
func (m Metrics) Sum(name string, match ...string) float64 {
	var total float64
	for key, v := range m {
		base, labels, _ := strings.Cut(key, "{")
		if base != name || !containsAll(labels, match) {
			continue
		}
		total += v
	}
	return total
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// Delta is after minus before, series by series.
func Delta(before, after Metrics) Metrics {
	d := Metrics{}
	for k, v := range after {
		d[k] = v - before[k]
	}
	return d
}

// Mean is a histogram's sum over its count, in milliseconds, and the count.
func (m Metrics) Mean(name string, match ...string) (ms, count float64) {
	count = m.Sum(name+"_count", match...)
	if count == 0 {
		return 0, 0
	}
	return m.Sum(name+"_sum", match...) / count * 1000, count
}
