package realcluster

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The kubelet forces these kernel settings with no opt-out; they are saved before the cluster
// starts and restored by Clean.
var forcedSysctls = []string{"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"}

// fixedPaths are the paths the kubelet, containerd and the CNI plugins use whatever their flags
// say. Clean removes those the run created.
var fixedPaths = []string{"/var/lib/kubelet", "/var/lib/cni", "/var/log/containers", "/var/log/pods", "/run/containerd"}

// State is what Clean needs to undo a run, even one whose process was killed: written before
// anything changes, in the run directory's parent so that removing the run keeps it until last.
type State struct {
	Sysctls map[string]string `json:"sysctls"`
	// Created are the fixed paths that did not exist before the run.
	Created []string `json:"created"`
	// Netns are the named network namespaces before the run: containerd pins each pod's in
	// /run/netns too, and a killed run leaves them.
	Netns []string `json:"netns"`
}

func statePath(runDir string) string { return runDir + ".state.json" }

func saveState(runDir string) (State, error) {
	if old, err := loadState(runDir); err == nil {
		return old, nil // a leftover run's state holds the values from before it
	}
	st := State{Sysctls: map[string]string{}}
	for _, key := range forcedSysctls {
		v, err := os.ReadFile("/proc/sys/" + key)
		if err != nil {
			return st, err
		}
		st.Sysctls[key] = strings.TrimSpace(string(v))
	}
	for _, p := range fixedPaths {
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			st.Created = append(st.Created, p)
		}
	}
	st.Netns = namedNetns()
	data, err := json.Marshal(st)
	if err != nil {
		return st, err
	}
	return st, os.WriteFile(statePath(runDir), data, 0o600)
}

func loadState(runDir string) (State, error) {
	var st State
	data, err := os.ReadFile(statePath(runDir))
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(data, &st)
}

// Clean undoes a run of the cluster in runDir, whether it ended well, failed or was killed:
// every process it started and every container, mounts, the network namespace, cgroups, the
// changed kernel settings and every file. It is safe to call when nothing is left.
func Clean(runDir string) error {
	st, stErr := loadState(runDir)
	var errs []error
	errs = append(errs, killAll(runDir))
	errs = append(errs, unmountAll(runDir))
	for _, ns := range runNetns(st.Netns) {
		errs = append(errs, run("ip", "netns", "delete", ns))
	}
	errs = append(errs, removeCgroups())
	if stErr == nil {
		for key, v := range st.Sysctls {
			errs = append(errs, os.WriteFile("/proc/sys/"+key, []byte(v), 0o644))
		}
		for _, p := range st.Created {
			errs = append(errs, os.RemoveAll(p))
		}
	}
	errs = append(errs, os.RemoveAll(runDir))
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if stErr == nil {
		return os.Remove(statePath(runDir))
	}
	return nil
}

// CheckClean says what a run in runDir left behind, compared with the state saved before it:
// nil when nothing. Call it after Clean with Cluster.Before.
func CheckClean(runDir string, st State) error {
	var left []string
	if pids := runPIDs(runDir); len(pids) > 0 {
		left = append(left, fmt.Sprintf("processes %v", pids))
	}
	if pids := cgroupPIDs(); len(pids) > 0 {
		left = append(left, fmt.Sprintf("container processes %v", pids))
	}
	if mounts := runMounts(runDir); len(mounts) > 0 {
		left = append(left, fmt.Sprintf("mounts %v", mounts))
	}
	if ns := runNetns(st.Netns); len(ns) > 0 {
		left = append(left, fmt.Sprintf("network namespaces %v", ns))
	}
	for _, h := range cgroupHierarchies() {
		if _, err := os.Stat(filepath.Join(h, cgroupName)); err == nil {
			left = append(left, "cgroup "+filepath.Join(h, cgroupName))
		}
	}
	for key, v := range st.Sysctls {
		now, _ := os.ReadFile("/proc/sys/" + key)
		if strings.TrimSpace(string(now)) != v {
			left = append(left, fmt.Sprintf("sysctl %s=%s (was %s)", key, strings.TrimSpace(string(now)), v))
		}
	}
	for _, p := range []string{runDir, statePath(runDir)} {
		if _, err := os.Lstat(p); err == nil {
			left = append(left, p)
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("the cluster left behind: %s", strings.Join(left, "; "))
	}
	return nil
}

// killAll ends the run's processes (their command lines name runDir: the control plane, the
// kubelet, containerd and its shims) and every process in the run's cgroups (the containers),
// and waits until none is left.
func killAll(runDir string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		pids := append(runPIDs(runDir), cgroupPIDs()...)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes still alive after 30s: %v", pids)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond) // a bounded wait for the kernel to reap what was killed
	}
}

// namedNetns lists /run/netns.
func namedNetns() []string {
	entries, _ := os.ReadDir("/run/netns")
	names := []string{} // never nil: a saved empty list is not a missing one
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// runNetns are the run's network namespaces: the node's, and the pods' that containerd pinned
// (cni-...) and that did not exist before the run. Without a saved state (nothing to compare
// with), only the node's.
func runNetns(before []string) []string {
	var ours []string
	for _, ns := range namedNetns() {
		if ns == netnsName || (before != nil && strings.HasPrefix(ns, "cni-") && !slices.Contains(before, ns)) {
			ours = append(ours, ns)
		}
	}
	return ours
}

// runPIDs are the processes whose command line names runDir, this process excepted.
func runPIDs(runDir string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Contains(string(cmdline), runDir) && !zombie(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func zombie(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z'
}

// cgroupPIDs are the processes in the run's cgroups (the pods' containers), read from the pids
// hierarchy, which every process is in.
func cgroupPIDs() []int {
	var pids []int
	root := filepath.Join(cgroupRoot, "pids", cgroupName)
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		data, _ := os.ReadFile(path)
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil && !zombie(pid) {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}

// runMounts are the mount points under runDir or the fixed paths, deepest first.
func runMounts(runDir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	prefixes := append([]string{runDir, "/run/netns/" + netnsName}, fixedPaths...)
	var mounts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		for _, p := range prefixes {
			if mp == p || strings.HasPrefix(mp, p+"/") {
				mounts = append(mounts, mp)
				break
			}
		}
	}
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	return mounts
}

// unescapeMount undoes mountinfo's octal escapes (a space is \040).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func unmountAll(runDir string) error {
	var errs []error
	for _, mp := range runMounts(runDir) {
		if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", mp, err))
		}
	}
	return errors.Join(errs...)
}

// cgroupHierarchies are the cgroup v1 hierarchies (name=systemd included) the kubelet needs its
// cgroupRoot in.
func cgroupHierarchies() []string {
	entries, _ := os.ReadDir(cgroupRoot)
	var dirs []string
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, filepath.Join(cgroupRoot, e.Name()))
		}
	}
	return dirs
}

// removeCgroups removes the run's cgroups in every hierarchy, children before parents.
func removeCgroups() error {
	var errs []error
	for _, h := range cgroupHierarchies() {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(h, cgroupName), func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := removeCgroup(dirs[i]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// removeCgroup retries for a moment: a cgroup whose last process was just killed is busy until
// the kernel has reaped it.
func removeCgroup(dir string) error {
	var err error
	for i := 0; i < 50; i++ {
		if err = syscall.Rmdir(dir); err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("remove cgroup %s: %w", dir, err)
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
