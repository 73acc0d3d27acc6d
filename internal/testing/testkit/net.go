package testkit

import (
	"net"
	"testing"
)

// FreePort returns a loopback port nothing listens on right now, for a process the test starts
// that binds it itself (and cannot say which port ":0" gave it). Another process may take the
// port meanwhile: use it at once, and never as an address that must stay unreachable.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port
}
