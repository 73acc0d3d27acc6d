package testkit

import (
	"io"
	"os/exec"
	"testing"
)

// StartPiped starts cmd with a pipe to its standard input and one from its standard output,
// for a child process the test talks to; the caller sets cmd.Stderr first and waits for it.
func StartPiped(t testing.TB, cmd *exec.Cmd) (stdin io.WriteCloser, stdout io.ReadCloser) {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err = cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return stdin, stdout
}
