package testkit

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// PrometheusBinary finds prometheus on PATH; without it the test skips, or fails under
// SUBFLOW_REQUIRE_PROMTOOL=1 (CI installs it from Debian's packages).
func PrometheusBinary(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("prometheus")
	if err == nil {
		return path
	}
	msg := "prometheus is not on PATH (Debian/Ubuntu: apt-get install -y prometheus)"
	if os.Getenv("SUBFLOW_REQUIRE_PROMTOOL") == "1" {
		t.Fatal(msg + "; SUBFLOW_REQUIRE_PROMTOOL=1 requires it")
	}
	t.Skip(msg + "; this test needs a real Prometheus")
	return ""
}

// StartPrometheus runs a real Prometheus with the configuration given (prometheus.yml) on a
// free loopback port until the test ends, and returns its URL once it is ready.
func StartPrometheus(t testing.TB, config []byte) string {
	t.Helper()
	binary := PrometheusBinary(t)
	dir := t.TempDir()
	configPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(configPath, config, 0o600); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", FreePort(t))
	cmd := exec.Command(binary, "--config.file="+configPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr)
	var out LockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("prometheus output:\n%s", out.String())
		}
	})
	url := "http://" + addr
	ready := Poll{Within: 30 * time.Second, Every: 100 * time.Millisecond}.Until(func() bool {
		select {
		case <-exited:
			t.Fatalf("prometheus exited:\n%s", out.String())
		default:
		}
		resp, err := http.Get(url + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if !ready {
		t.Fatalf("prometheus not ready after 30s:\n%s", out.String())
	}
	return url
}
