package main

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// stopWithParent asks the kernel to send SIGTERM when the parent process ends: `go run` exits on
// SIGTERM without passing it on, and the demo must then still stop the control plane it started.
func stopWithParent() {
	_ = unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGTERM), 0, 0, 0)
}
