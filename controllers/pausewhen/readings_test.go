package pausewhen

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A thousand flows asking the same thing within one interval cost one read.
func TestReadingsShareOneReadPerInterval(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	var clock atomic.Pointer[time.Time]
	clock.Store(&now)
	rs := &Readings{Now: func() time.Time { return *clock.Load() }}
	var reads atomic.Int64
	release := make(chan struct{})
	read := func(context.Context) Reading {
		reads.Add(1)
		<-release
		return Reading{Verdict: Unhealthy, At: *clock.Load()}
	}
	var wg sync.WaitGroup
	for range 1000 {
		wg.Go(func() {
			if r := rs.Get(context.Background(), "db", 10*time.Second, read); r.Verdict != Unhealthy {
				t.Errorf("reading %v, want the shared Unhealthy one", r.Verdict)
			}
		})
	}
	close(release)
	wg.Wait()
	rs.Get(context.Background(), "db", 10*time.Second, read)
	if n := reads.Load(); n != 1 {
		t.Fatalf("1001 askers within the interval made %d reads, want 1", n)
	}
	later := now.Add(10 * time.Second)
	clock.Store(&later)
	rs.Get(context.Background(), "db", 10*time.Second, read)
	rs.Get(context.Background(), "other", 10*time.Second, read)
	if n := reads.Load(); n != 3 {
		t.Fatalf("after the interval, and for another key: %d reads, want 3", n)
	}
}

// What no flow asks for any more is forgotten.
func TestReadingsForgetWhatNobodyAsks(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	current := now
	rs := &Readings{Now: func() time.Time { return current }}
	read := func(context.Context) Reading { return Reading{At: current} }
	rs.Get(context.Background(), "gone", time.Second, read)
	current = now.Add(forget + time.Second)
	rs.Get(context.Background(), "kept", time.Second, read)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if _, ok := rs.latest["gone"]; ok || len(rs.latest) != 1 {
		t.Fatalf("readings kept %v, want only the one still asked", rs.latest)
	}
}

// A source that hangs is given up at the asker's deadline: the shared read keeps it.
func TestReadingsKeepTheAskersDeadline(t *testing.T) {
	rs := &Readings{}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := make(chan Reading, 1)
	go func() {
		done <- rs.Get(ctx, "hangs", time.Second, func(ctx context.Context) Reading {
			<-ctx.Done()
			return Reading{Verdict: Unknown, Err: ctx.Err(), At: time.Now()}
		})
	}()
	select {
	case r := <-done:
		if r.Err == nil {
			t.Fatalf("a hanging read returned %v without an error", r.Verdict)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a hanging read outlived the asker's deadline by 10 s")
	}
}
