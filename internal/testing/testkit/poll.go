// Package testkit holds the helpers that tests across the module share: waiting for a
// condition with a deadline, and the pulsar-client-go clients, producers and consumers a test
// opens and closes at its end. It is for tests only; nothing outside a _test.go file imports it.
package testkit

import (
	"testing"
	"time"
)

// Poll says how long to wait for a condition and how often to ask it.
type Poll struct {
	Within time.Duration // how long to wait in all
	Every  time.Duration // the pause between two asks
}

// Until asks cond, then again every p.Every, until it returns true or p.Within has passed,
// and reports whether it returned true.
func (p Poll) Until(cond func() bool) bool {
	deadline := time.Now().Add(p.Within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(p.Every) // the polling pace, not a wait for an event
	}
	return true
}

// UntilNil asks check, then again every p.Every, until it returns nil or p.Within has passed,
// and returns nil or check's last error.
func (p Poll) UntilNil(check func() error) error {
	var err error
	p.Until(func() bool { err = check(); return err == nil })
	return err
}

// Eventually fails t, naming what it awaited and for how long, unless cond returns true
// within p.Within.
func (p Poll) Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	if !p.Until(cond) {
		t.Fatalf("timed out after %v waiting for %s", p.Within, what)
	}
}

// Eventually fails t, naming what it awaited and for how long, unless cond returns true
// within the given time; it asks cond every 10 milliseconds.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	Poll{Within: within, Every: 10 * time.Millisecond}.Eventually(t, what, cond)
}
