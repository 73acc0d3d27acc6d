package realcluster

import (
	"fmt"
	"path/filepath"
)

// containerdConfig keeps every state path and socket under the run directory. The settings this
// machine needs: restrict_oom_score_adj (root here lacks CAP_SYS_RESOURCE, so the kubelet's
// oom_score_adj of -998 for sandboxes makes runc fail), no AppArmor, cgroupfs (no systemd), and
// only the overlayfs snapshotter.
func containerdConfig(runDir string) string {
	return fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %[6]q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %[7]q
`, filepath.Join(runDir, "containerd", "root"), filepath.Join(runDir, "containerd", "state"),
		filepath.Join(runDir, "containerd.sock"), filepath.Join(runDir, "containerd.sock.ttrpc"),
		SandboxImage, filepath.Join(runDir, "runc"), filepath.Join(runDir, "cni", "net.d"))
}

// cniConfig is a bridge on the pod CIDR, masquerading what leaves it, with port mappings.
func cniConfig(runDir string) string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "subflow-e2e",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": %q,
        "ranges": [[{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, filepath.Join(runDir, "cni", "ipam"), podCIDR)
}

// kubeletConfig: cgroup v1 with cgroupfs under a root of the run's own, no swap check, eviction
// and image garbage collection that never act on a shared disk (an imported image that is
// collected can never be pulled back), no cluster DNS, and the API server's CA for clients.
func kubeletConfig(runDir string) string {
	pki := filepath.Join(runDir, "pki")
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://%[1]s
cgroupDriver: cgroupfs
cgroupRoot: /%[2]s
failCgroupV1: false
failSwapOn: false
resolvConf: ""
podLogsDir: %[3]s
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[4]s}
authorization: {mode: Webhook}
tlsCertFile: %[5]s
tlsPrivateKeyFile: %[6]s
evictionHard: {memory.available: "100Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 60
`, filepath.Join(runDir, "containerd.sock"), cgroupName, filepath.Join(runDir, "pod-logs"),
		filepath.Join(pki, "ca.crt"), filepath.Join(pki, "kubelet.crt"), filepath.Join(pki, "kubelet.key"))
}

// kubeProxyConfig: iptables mode, and conntrack left as it is (its sysctls are the host's).
func kubeProxyConfig(runDir string) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: %s
clientConnection: {kubeconfig: %s}
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, podCIDR, filepath.Join(runDir, "kube-proxy.kubeconfig"))
}
