package main

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestPeerImagesRun builds the peer images and runs each one's entrypoint, with --help appended
// as a pod's args would be, in its extracted file system as the image's user: the runtime, its
// libraries and the client must all be found and readable there for the peer to answer.
func TestPeerImagesRun(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runs the images under chroot as their user: needs root")
	}
	for _, tool := range []string{"ldd", "unshare", "chroot", "mvn", "javac", "python3", filepath.Join(jdk, "bin", "jlink")} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the peer images need %s", tool)
		}
	}
	t.Chdir("../..") // the components name the repository's paths
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, script := range []string{"hack/clients/java/peer.sh", "hack/clients/python/peer.sh"} {
		// Offline, so that missing caches skip the test instead of downloading.
		cmd := exec.CommandContext(ctx, "unshare", "--net", script, "--prepare")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Skipf("the peers are not prepared (run make clients-fetch): %s: %v: %s", script, err, lastLine(out))
		}
	}
	// The command as make runs it: built without -race, the compression takes seconds, not a minute.
	out := t.TempDir()
	build := exec.CommandContext(ctx, "go", "run", "./hack/images", "-registry", "subflow.local", "-tag", "test",
		"-arch", runtime.GOARCH, "-out", out, "gopeer", "java-peer", "python-peer")
	log, err := build.CombinedOutput()
	t.Logf("%s", log)
	if err != nil {
		t.Fatal(err)
	}
	chroot, _ := exec.LookPath("chroot") // the image's environment has no PATH
	help := []string{"--help"}
	for _, tc := range []struct {
		name   string
		checks []imageRun
	}{
		{"gopeer", []imageRun{{args: help, code: 0, want: []string{"Usage of /subflow-e2e-gopeer", "-subscription"}}}},
		{"java-peer", []imageRun{
			// The Java peer has no --help: the client's builder refuses the missing URL.
			{args: help, code: 1, want: []string{"Param serviceUrl must not be blank", "at dev.subflow.peer.Peer.main"}},
			// A client is made before the consumer name is refused; its netty loads its native
			// transport from the jar, whose libraries only the jar's .so names. The client's
			// threads keep the JVM up, so the run stops at the line.
			{args: []string{"--url", "pulsar://127.0.0.1:1", "--topic", "t", "--subscription", "s"},
				env:   []string{"JAVA_TOOL_OPTIONS=-Dorg.slf4j.simpleLogger.log.org.apache.pulsar.shade.io.netty.util.internal.NativeLibraryLoader=debug"},
				until: "Successfully loaded the library"},
		}},
		{"python-peer", []imageRun{{args: help, code: 0, want: []string{"usage: peer.py", "--subscription SUBSCRIPTION"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img, err := tarball.ImageFromPath(filepath.Join(out, tc.name+"-"+runtime.GOARCH+".tar"), nil)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Config.User != nonRoot || len(cfg.Config.Cmd) != 0 || cfg.Config.WorkingDir != "/" {
				t.Errorf("config: user %q, cmd %q, working dir %q; want %s, none, /", cfg.Config.User, cfg.Config.Cmd, cfg.Config.WorkingDir, nonRoot)
			}
			root := extractImage(t, img)
			for _, r := range tc.checks {
				r.check(ctx, t, root, cfg, chroot)
			}
		})
	}
}

// imageRun is one run of an image's entrypoint with args (a pod's), its environment plus env.
// It waits for the exit, wanting code, or with until set, stops the run once its output holds
// until. Either way the output must hold want.
type imageRun struct {
	args, env []string
	code      int
	until     string
	want      []string
}

// check runs the entrypoint as a container runtime would: in the image's file system with /proc
// mounted, as its user, with only its environment.
func (r imageRun) check(ctx context.Context, t *testing.T, root string, cfg *v1.ConfigFile, chroot string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	argv := append([]string{"--mount", "--pid", "--fork", "--kill-child", "--mount-proc=" + filepath.Join(root, "proc"),
		chroot, "--userspec=" + cfg.Config.User, root}, cfg.Config.Entrypoint...)
	cmd := exec.CommandContext(ctx, "unshare", append(argv, r.args...)...)
	cmd.Env = append(slices.Clone(cfg.Config.Env), r.env...)
	if cmd.Env == nil {
		cmd.Env = []string{} // not this process's
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.Cancel = func() error { return killNamespace(cmd.Process) }
	err = cmd.Start()
	pw.Close()
	if err != nil {
		t.Fatal(err)
	}
	var output strings.Builder
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		output.WriteString(sc.Text() + "\n")
		if r.until != "" && strings.Contains(sc.Text(), r.until) {
			break
		}
	}
	if r.until != "" {
		cancel()
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	wants := r.want
	if r.until != "" {
		wants = append(wants, r.until)
	} else if code := cmd.ProcessState.ExitCode(); code != r.code {
		t.Errorf("%q: exit code %d, want %d", r.args, code, r.code)
	}
	for _, w := range wants {
		if !strings.Contains(output.String(), w) {
			t.Errorf("%q: output lacks %q:\n%s", r.args, w, output.String())
		}
	}
}

// killNamespace kills the process unshare forked, the PID namespace's init, which ends every
// process in the namespace, and then unshare. (Killing unshare alone does not: its
// --kill-child signal does not survive chroot's change of user.)
func killNamespace(unshare *os.Process) error {
	children, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", unshare.Pid, unshare.Pid))
	for _, f := range strings.Fields(string(children)) {
		if pid, err := strconv.Atoi(f); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return unshare.Kill()
}

// extractImage writes the image's file system into a new directory (plus /proc, which a
// container runtime mounts), failing the test on any entry a non-root user could not read.
func extractImage(t *testing.T, img v1.Image) string {
	t.Helper()
	root := t.TempDir()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := extractEntry(root, hdr, tr); err != nil {
			t.Fatal(err)
		}
	}
	for _, dir := range []string{root, filepath.Join(root, "proc")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o755); err != nil { // t.TempDir's is 0700
			t.Fatal(err)
		}
	}
	return root
}

func extractEntry(root string, hdr *tar.Header, r io.Reader) error {
	if !filepath.IsLocal(hdr.Name) {
		return fmt.Errorf("%s: outside the file system", hdr.Name)
	}
	if hdr.Uid != 0 || hdr.Gid != 0 {
		return fmt.Errorf("%s: owned by %d:%d, want root", hdr.Name, hdr.Uid, hdr.Gid)
	}
	p := filepath.Join(root, hdr.Name)
	mode := hdr.FileInfo().Mode()
	switch hdr.Typeflag {
	case tar.TypeDir:
		if mode.Perm()&0o555 != 0o555 {
			return fmt.Errorf("%s: mode %s, not listable by everyone", hdr.Name, mode)
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		return os.Chmod(p, mode)
	case tar.TypeSymlink:
		return os.Symlink(hdr.Linkname, p)
	case tar.TypeReg:
		if mode.Perm()&0o444 != 0o444 {
			return fmt.Errorf("%s: mode %s, not readable by everyone", hdr.Name, mode)
		}
		err := writeFile(p, func(w io.Writer) error {
			_, err := io.Copy(w, r)
			return err
		})
		if err != nil {
			return err
		}
		return os.Chmod(p, mode)
	}
	return fmt.Errorf("%s: unexpected type %c", hdr.Name, hdr.Typeflag)
}

func lastLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

// The peers' runtimes are this machine's: an image for another architecture would not run.
func TestPeerImagesRefuseAnotherArch(t *testing.T) {
	other := "arm64"
	if runtime.GOARCH == other {
		other = "amd64"
	}
	for _, name := range []string{"java-peer", "python-peer"} {
		out := t.TempDir()
		err := run(context.Background(), options{tag: "dev", out: out, archs: []string{other}}, []string{name})
		if err == nil || !strings.Contains(err.Error(), "only for -arch "+runtime.GOARCH) {
			t.Errorf("%s for %s: got %v, want a refusal naming -arch %s", name, other, err, runtime.GOARCH)
		}
		if entries, _ := os.ReadDir(out); len(entries) != 0 {
			t.Errorf("%s for %s: left %d files in the output directory", name, other, len(entries))
		}
	}
}
