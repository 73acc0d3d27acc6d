// Package e2e runs subflow the way users run it: images built by hack/images and imported into a
// real single-node Kubernetes (internal/testing/realcluster), the chart installed with helm --wait,
// consumer Deployments onboarded by their label, a real Apache Pulsar on the host reached through
// a Service without a selector, and every step taken with kubectl. make e2e runs it (it needs
// root); without SUBFLOW_E2E=1 the tests skip.
package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/subflow-dev/subflow/internal/testing/realcluster"
)

// The images' names as make e2e builds them (hack/images -registry subflow.local -tag e2e).
const (
	imageRegistry = "subflow.local"
	imageTag      = "e2e"
)

func image(name string) string { return imageRegistry + "/" + name + ":" + imageTag }

// world is what every test shares: the cluster, the broker, the installed controller.
type world struct {
	cluster  *realcluster.Cluster
	pulsar   string // the broker's service URL as the host reaches it
	admin    string // its admin URL
	brokerIP string
	// brokerPort and adminPort are the broker's ports, which the Service's endpoints name.
	brokerPort, adminPort string
	// setup is how long each step of setting the suite up took (BenchmarkSuiteSetup).
	setup struct{ cluster, broker, chart time.Duration }
}

var w *world

func TestMain(m *testing.M) {
	if os.Getenv("SUBFLOW_E2E") != "1" {
		fmt.Println("e2e: skipped (make e2e runs these tests on a real cluster; it needs root)")
		os.Exit(0)
	}
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) (code int) {
	ctx, stop := signalContext()
	defer stop()
	runDir := filepath.Join(os.TempDir(), "subflow-e2e")
	started := time.Now()
	images, _ := filepath.Glob(filepath.Join(os.Getenv("SUBFLOW_E2E_IMAGES"), "*.tar"))
	next, _ := filepath.Glob(filepath.Join(os.Getenv("SUBFLOW_E2E_IMAGES"), "next", "*.tar"))
	images = append(images, next...)
	c, err := realcluster.Start(ctx, realcluster.Options{RunDir: runDir, Binaries: os.Getenv("SUBFLOW_NODE_BINARIES"),
		Images: images, Log: logf})
	if err != nil {
		logf("e2e: %v", err)
		return 1
	}
	defer func() {
		if code != 0 {
			dumpLogs(c)
		}
		if err := c.Stop(); err != nil {
			logf("e2e: stopping the cluster: %v", err)
			code = 1
		}
		if err := realcluster.CheckClean(runDir, c.Before); err != nil {
			logf("e2e: %v", err)
			code = 1
		}
		logf("e2e: the suite took %.0fs; nothing of the cluster is left", time.Since(started).Seconds())
	}()
	w = &world{cluster: c}
	w.setup.cluster = time.Since(started)
	pluginDir, err := installPlugin()
	defer os.RemoveAll(pluginDir)
	if err != nil {
		logf("e2e: %v", err)
		return 1
	}
	brokerStart := time.Now()
	stopPulsar, err := w.startPulsar(ctx)
	w.setup.broker = time.Since(brokerStart)
	if err != nil {
		logf("e2e: %v", err)
		return 1
	}
	defer stopPulsar()
	if err := w.install(ctx); err != nil {
		logf("e2e: %v", err)
		return 1
	}
	return m.Run()
}

// signalContext is cancelled by SIGINT and SIGTERM, so that Ctrl-C still tears the cluster down.
func signalContext() (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case <-sigs:
			logf("e2e: interrupted; tearing the cluster down")
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

func logf(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }

// startPulsar runs hack/pulsar's broker on the host, advertised at the host's end of the veth
// pair so pods reach it, as users run a broker outside their cluster.
func (w *world) startPulsar(ctx context.Context) (stop func(), err error) {
	cmd := exec.Command("../hack/pulsar/pulsar.sh", "run", "--set", "bindAddress=0.0.0.0")
	cmd.Env = append(os.Environ(), "PULSAR_ADVERTISED_ADDRESS="+realcluster.HostIP)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	stop = func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}
	urls := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			key, value, _ := strings.Cut(sc.Text(), "=")
			switch key {
			case "PULSAR_URL":
				w.pulsar = value
			case "PULSAR_ADMIN_URL":
				w.admin = value
				urls <- nil
			}
		}
		urls <- fmt.Errorf("the broker stopped before it printed its URLs")
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case err = <-urls:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		stop()
		return nil, err
	}
	w.brokerIP = realcluster.HostIP
	w.brokerPort = w.pulsar[strings.LastIndexByte(w.pulsar, ':')+1:]
	w.adminPort = w.admin[strings.LastIndexByte(w.admin, ':')+1:]
	return stop, nil
}

// install installs the chart as README's "Use it in a cluster" says, with the images built for
// this run, and waits for it (helm --wait: both replicas Ready).
func (w *world) install(ctx context.Context) error {
	start := time.Now()
	_, err := w.helm(ctx, "install", "subflow", "../charts/subflow", "-n", "subflow-system", "--create-namespace",
		"--set", "image.repository="+imageRegistry+"/subflow-controller", "--set", "image.tag="+imageTag,
		"--set", "webhook.sidecarImage="+image("subflow-sidecar"),
		"--wait", "--timeout", "3m")
	if err != nil {
		return err
	}
	w.setup.chart = time.Since(start)
	logf("e2e: chart installed and ready after %.1fs", w.setup.chart.Seconds())
	return nil
}

func (w *world) helm(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", append([]string{"tool", "helm", "--kubeconfig", w.cluster.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// installPlugin builds kubectl-subflow into a directory put first on PATH, where kubectl finds
// its plugins, as README's install does.
func installPlugin() (dir string, err error) {
	if dir, err = os.MkdirTemp("", "subflow-e2e-plugin-"); err != nil {
		return "", err
	}
	out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "kubectl-subflow"), "../cmd/kubectl-subflow").CombinedOutput()
	if err != nil {
		return dir, fmt.Errorf("building kubectl-subflow: %w: %s", err, out)
	}
	return dir, os.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// dumpLogs prints the tail of each component's log, for a failed run.
func dumpLogs(c *realcluster.Cluster) {
	logs, _ := filepath.Glob(filepath.Join(c.Logs(), "*.log"))
	for _, l := range logs {
		data, _ := os.ReadFile(l)
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) > 15 {
			lines = lines[len(lines)-15:]
		}
		logf("==> %s <==\n%s", filepath.Base(l), strings.Join(lines, "\n"))
	}
}
