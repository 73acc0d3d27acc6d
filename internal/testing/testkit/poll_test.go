package testkit

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestUntilReportsWhetherTheConditionHeldInTime(t *testing.T) {
	calls := 0
	if !(Poll{Within: time.Second, Every: time.Millisecond}).Until(func() bool { calls++; return calls == 3 }) {
		t.Fatal("a condition that holds on the third ask did not hold")
	}
	start := time.Now()
	if (Poll{Within: 20 * time.Millisecond, Every: time.Millisecond}).Until(func() bool { return false }) {
		t.Fatal("a condition that never holds held")
	}
	if waited := time.Since(start); waited < 20*time.Millisecond {
		t.Fatalf("gave up after %v, before the 20ms it was given", waited)
	}
}

func TestUntilNilReturnsTheLastError(t *testing.T) {
	n := 0
	err := Poll{Within: 10 * time.Millisecond, Every: time.Millisecond}.UntilNil(func() error { n++; return fmt.Errorf("ask %d", n) })
	if err == nil || err.Error() != fmt.Sprintf("ask %d", n) {
		t.Fatalf("got %v after %d asks, want the last ask's error", err, n)
	}
}

// fatalRecorder is a testing.TB that records Fatalf instead of ending the test.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper()                        {}
func (r *fatalRecorder) Fatalf(format string, a ...any) { r.msg = fmt.Sprintf(format, a...) }

func TestEventuallyNamesWhatItAwaitedAndForHowLong(t *testing.T) {
	r := &fatalRecorder{TB: t}
	Eventually(r, 30*time.Millisecond, "the flag set", func() bool { return false })
	if !strings.Contains(r.msg, "the flag set") || !strings.Contains(r.msg, "30ms") {
		t.Fatalf("failure message %q does not name what was awaited and for how long", r.msg)
	}
}
