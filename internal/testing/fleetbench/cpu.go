package fleetbench

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// cpuSeconds is the user+system CPU time a process used so far (Linux /proc, clock ticks of
// 1/100 s); 0 if it cannot be read.
func cpuSeconds(pid int) float64 {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	// The command may contain spaces: fields count from the closing parenthesis.
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return (utime + stime) / 100
}

// children returns this process's child processes by command name (envtest's kube-apiserver
// and etcd).
func children() map[string][]int {
	out := map[string][]int{}
	self := strconv.Itoa(os.Getpid())
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", d.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(data)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < open {
			continue
		}
		fields := strings.Fields(s[closing+1:])
		if len(fields) > 1 && fields[1] == self {
			out[s[open+1:closing]] = append(out[s[open+1:closing]], pid)
		}
	}
	return out
}

// cpuUse samples the CPU time of the processes a round involves.
type cpuUse map[string]float64

func sampleCPU(controller int) cpuUse {
	use := cpuUse{"controller": cpuSeconds(controller), "bench": cpuSeconds(os.Getpid())}
	for name, pids := range children() {
		for _, pid := range pids {
			switch {
			case strings.Contains(name, "apiserver"):
				use["apiserver"] += cpuSeconds(pid)
			case strings.Contains(name, "etcd"):
				use["etcd"] += cpuSeconds(pid)
			}
		}
	}
	return use
}
