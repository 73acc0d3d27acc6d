// Package realcluster runs a real single-node Kubernetes on this machine for the end-to-end
// suite: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, a kubelet with containerd,
// runc and the bridge CNI, and kube-proxy, all in a network namespace of their own joined to the
// host by one veth pair. Images come from archives imported into containerd: nothing is pulled.
//
// Clean undoes a run however it ended, and CheckClean proves that nothing is left. The facts
// behind every setting (why the machine needs it) are in docs/e2e.md.
package realcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

const (
	netnsName  = "subflow-e2e"
	vethHost   = "sfe2e-host"
	vethNode   = "sfe2e-node"
	cgroupRoot = "/sys/fs/cgroup"
	cgroupName = "subflow-e2e"
	nodeName   = "subflow-e2e"

	// HostIP is the host's end of the veth pair: pods reach services on the host here (a broker
	// must listen on it, or on every address).
	HostIP = "10.255.0.1"
	// NodeIP is the node's address, where the API server listens (port 6443).
	NodeIP      = "10.255.0.2"
	podCIDR     = "10.244.0.0/24"
	serviceCIDR = "10.96.0.0/16"

	// SandboxImage is the pod sandbox image containerd is configured with; the run imports it
	// with the others (hack/e2e/pause).
	SandboxImage = "subflow.local/subflow-e2e-pause:e2e"
)

// Options say where the binaries and images are.
type Options struct {
	// RunDir holds every state path of the run; a run left there by a killed process is cleaned
	// first.
	RunDir string
	// Binaries is the directory of kube-apiserver, etcd, kube-controller-manager, kube-scheduler,
	// kubelet and kube-proxy (hack/e2e/node-binaries.sh).
	Binaries string
	// Images are image archives to import into containerd before the kubelet starts.
	Images []string
	// Log receives progress lines.
	Log func(format string, args ...any)
}

// Cluster is a running cluster.
type Cluster struct {
	opts Options
	// Kubeconfig is an administrator's kubeconfig (system:masters).
	Kubeconfig string
	// Before is what the machine was like before the run, for CheckClean.
	Before State
	procs  []*exec.Cmd
}

// Start starts a cluster and returns once its node is Ready. On error, whatever started is
// cleaned up.
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	if opts.Log == nil {
		opts.Log = func(string, ...any) {}
	}
	if err := Clean(opts.RunDir); err != nil {
		return nil, fmt.Errorf("cleaning a previous run: %w", err)
	}
	st, err := saveState(opts.RunDir)
	if err != nil {
		return nil, err
	}
	c = &Cluster{opts: opts, Before: st, Kubeconfig: filepath.Join(opts.RunDir, "admin.kubeconfig")}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Stop())
		}
	}()
	started := time.Now()
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"network", c.network},
		{"files", c.files},
		{"containerd", c.containerd},
		{"images", c.importImages},
		{"control plane", c.controlPlane},
		{"node", c.node},
	}
	for _, s := range steps {
		t := time.Now()
		if err := s.fn(ctx); err != nil {
			return c, fmt.Errorf("%s: %w", s.name, err)
		}
		opts.Log("realcluster: %s ready (%.1fs)", s.name, time.Since(t).Seconds())
	}
	opts.Log("realcluster: node %s Ready after %.1fs", nodeName, time.Since(started).Seconds())
	return c, nil
}

// Stop ends the cluster and removes every trace of it (Clean).
func (c *Cluster) Stop() error {
	for _, p := range c.procs {
		if p.Process != nil {
			_ = p.Process.Kill()
		}
	}
	for _, p := range c.procs {
		_ = p.Wait()
	}
	c.procs = nil
	return Clean(c.opts.RunDir)
}

// Logs is the directory of the components' logs.
func (c *Cluster) Logs() string { return filepath.Join(c.opts.RunDir, "logs") }

func (c *Cluster) path(parts ...string) string {
	return filepath.Join(append([]string{c.opts.RunDir}, parts...)...)
}

// network makes the namespace, the veth pair and the routes between host and node.
func (c *Cluster) network(context.Context) error {
	cmds := [][]string{
		{"ip", "netns", "add", netnsName},
		{"ip", "link", "add", vethHost, "type", "veth", "peer", "name", vethNode},
		{"ip", "link", "set", vethNode, "netns", netnsName},
		{"ip", "addr", "add", HostIP + "/30", "dev", vethHost},
		{"ip", "link", "set", vethHost, "up"},
		{"ip", "-n", netnsName, "addr", "add", NodeIP + "/30", "dev", vethNode},
		{"ip", "-n", netnsName, "link", "set", vethNode, "up"},
		{"ip", "-n", netnsName, "link", "set", "lo", "up"},
		// The API server's own packets to ClusterIPs (webhooks) need a route for them.
		{"ip", "-n", netnsName, "route", "add", serviceCIDR, "dev", vethNode},
		{"ip", "route", "add", podCIDR, "via", NodeIP},
		{"ip", "route", "add", serviceCIDR, "via", NodeIP},
		{"ip", "netns", "exec", netnsName, "sysctl", "-qw", "net.ipv4.ip_forward=1"},
	}
	for _, args := range cmds {
		if err := run(args[0], args[1:]...); err != nil {
			return err
		}
	}
	for _, h := range cgroupHierarchies() {
		if err := os.MkdirAll(filepath.Join(h, cgroupName), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// files writes certificates, kubeconfigs and the components' configuration.
func (c *Cluster) files(context.Context) error {
	pki := c.path("pki")
	if err := writePKI(pki, nodeName, []net.IP{net.ParseIP(NodeIP), net.ParseIP("10.96.0.1")}); err != nil {
		return err
	}
	server := "https://" + NodeIP + ":6443"
	for _, id := range []string{"admin", "controller-manager", "scheduler", "kube-proxy", "kubelet-client"} {
		if err := os.WriteFile(c.path(id+".kubeconfig"), []byte(kubeconfig(pki, id, server)), 0o600); err != nil {
			return err
		}
	}
	files := map[string]string{
		"containerd.toml":              containerdConfig(c.opts.RunDir),
		"cni/net.d/10-bridge.conflist": cniConfig(c.opts.RunDir),
		"kubelet.yaml":                 kubeletConfig(c.opts.RunDir),
		"kube-proxy.yaml":              kubeProxyConfig(c.opts.RunDir),
	}
	for name, content := range files {
		if err := os.MkdirAll(filepath.Dir(c.path(name)), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(c.path(name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return os.MkdirAll(c.Logs(), 0o755)
}

// start runs a component in the node's network namespace (nsenter, not ip netns exec, which
// would give it a private mount namespace and hide the kubelet's volume mounts from runc). It
// dies with this process.
func (c *Cluster) start(name, bin string, args ...string) error {
	logFile, err := os.Create(filepath.Join(c.Logs(), name+".log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command("nsenter", append([]string{"--net=/run/netns/" + netnsName, bin}, args...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	c.procs = append(c.procs, cmd)
	return nil
}

func (c *Cluster) bin(name string) string { return filepath.Join(c.opts.Binaries, name) }

func (c *Cluster) containerd(ctx context.Context) error {
	if err := c.start("containerd", "containerd", "--config", c.path("containerd.toml")); err != nil {
		return err
	}
	return poll(ctx, 30*time.Second, "containerd's socket", func() error {
		return run("ctr", "--address", c.path("containerd.sock"), "version")
	})
}

func (c *Cluster) importImages(context.Context) error {
	for _, img := range c.opts.Images {
		if _, err := c.Ctr(context.Background(), "images", "import", "--no-unpack", img); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) controlPlane(ctx context.Context) error {
	pki := c.path("pki")
	p := func(f string) string { return filepath.Join(pki, f) }
	if err := c.start("etcd", c.bin("etcd"), "--data-dir", c.path("etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--unsafe-no-fsync"); err != nil {
		return err
	}
	if err := c.start("kube-apiserver", c.bin("kube-apiserver"),
		"--etcd-servers=http://127.0.0.1:2379", "--bind-address=0.0.0.0", "--advertise-address="+NodeIP,
		"--secure-port=6443", "--service-cluster-ip-range="+serviceCIDR,
		"--client-ca-file="+p("ca.crt"), "--tls-cert-file="+p("apiserver.crt"), "--tls-private-key-file="+p("apiserver.key"),
		"--kubelet-client-certificate="+p("apiserver-kubelet-client.crt"), "--kubelet-client-key="+p("apiserver-kubelet-client.key"),
		"--kubelet-certificate-authority="+p("ca.crt"), "--kubelet-preferred-address-types=InternalIP",
		"--service-account-key-file="+p("sa.pub"), "--service-account-signing-key-file="+p("sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
		"--enable-aggregator-routing=true", "--allow-privileged=true"); err != nil {
		return err
	}
	if err := poll(ctx, 90*time.Second, "the API server's /readyz", func() error {
		return c.kubectlQuiet(ctx, "get", "--raw", "/readyz")
	}); err != nil {
		return err
	}
	if err := c.start("kube-controller-manager", c.bin("kube-controller-manager"),
		"--kubeconfig="+c.path("controller-manager.kubeconfig"), "--leader-elect=false",
		"--service-account-private-key-file="+p("sa.key"), "--root-ca-file="+p("ca.crt"),
		"--cluster-signing-cert-file="+p("ca.crt"), "--cluster-signing-key-file="+p("ca.key"),
		"--use-service-account-credentials", "--allocate-node-cidrs=false"); err != nil {
		return err
	}
	return c.start("kube-scheduler", c.bin("kube-scheduler"),
		"--kubeconfig="+c.path("scheduler.kubeconfig"), "--leader-elect=false")
}

func (c *Cluster) node(ctx context.Context) error {
	if err := c.start("kubelet", c.bin("kubelet"), "--config="+c.path("kubelet.yaml"),
		"--kubeconfig="+c.path("kubelet-client.kubeconfig"), "--hostname-override="+nodeName,
		"--node-ip="+NodeIP, "--root-dir="+c.path("kubelet")); err != nil {
		return err
	}
	if err := c.start("kube-proxy", c.bin("kube-proxy"), "--config="+c.path("kube-proxy.yaml"),
		"--hostname-override="+nodeName); err != nil {
		return err
	}
	if err := poll(ctx, 120*time.Second, "node Ready", func() error {
		return c.kubectlQuiet(ctx, "wait", "--for=condition=Ready", "node/"+nodeName, "--timeout=5s")
	}); err != nil {
		return err
	}
	// Pods need their namespace's default service account, made by the controller-manager.
	return poll(ctx, 60*time.Second, "the default service account", func() error {
		return c.kubectlQuiet(ctx, "get", "serviceaccount", "default", "-n", "default")
	})
}

// Kubectl runs kubectl as the administrator and returns what it printed.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	// KUBECONFIG rather than --kubeconfig: kubectl refuses flags before a plugin's name.
	cmd := exec.CommandContext(ctx, "kubectl", args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig, "KUBECACHEDIR="+c.path("kubectl-cache"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Ctr runs containerd's ctr against the node's containerd, in the kubelet's namespace: what an
// operator on the node would do (kill a container, list images).
func (c *Cluster) Ctr(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "ctr", append([]string{"--address", c.path("containerd.sock"), "-n", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

func (c *Cluster) kubectlQuiet(ctx context.Context, args ...string) error {
	_, err := c.Kubectl(ctx, args...)
	return err
}

// poll calls fn until it succeeds or timeout passes, and then names what it waited for with
// fn's last error.
func poll(ctx context.Context, timeout time.Duration, what string, fn func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
