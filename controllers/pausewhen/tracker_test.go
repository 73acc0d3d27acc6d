package pausewhen

import (
	"errors"
	"math"
	"testing"
	"time"
)

func ptr(f float64) *float64 { return &f }

func TestThresholdsJudgeWithHysteresis(t *testing.T) {
	lag := Thresholds{Above: ptr(1000), ResumeBelow: ptr(100)}
	for value, want := range map[float64]Verdict{5000: Unhealthy, 1000: Between, 500: Between, 100: Healthy, 0: Healthy, math.NaN(): Unknown, math.Inf(1): Unknown} {
		if got := lag.Judge(value); got != want {
			t.Errorf("above 1000, resume below 100: %v is %v, want %v", value, got, want)
		}
	}
	ready := Thresholds{Below: ptr(1)} // resumes at the trip threshold when no other is given
	for value, want := range map[float64]Verdict{0: Unhealthy, 1: Healthy, 3: Healthy} {
		if got := ready.Judge(value); got != want {
			t.Errorf("below 1: %v is %v, want %v", value, got, want)
		}
	}
	if got := (Thresholds{}).Judge(1); got != Unknown {
		t.Errorf("no threshold: %v, want Unknown", got)
	}
}

// step is one reading at a time offset, and whether the condition is to be tripped after it.
type step struct {
	at      time.Duration
	verdict Verdict
	tripped bool
}

func run(t *testing.T, policy Policy, steps []step) {
	t.Helper()
	start := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	tr := Tracker{Policy: policy}
	for i, s := range steps {
		r := Reading{Verdict: s.verdict, At: start.Add(s.at)}
		if s.verdict == Unknown {
			r.Err = errors.New("no answer")
		}
		tr.Observe(r)
		if tr.Tripped() != s.tripped {
			t.Fatalf("step %d (%v at +%v): tripped %v, want %v", i, s.verdict, s.at, tr.Tripped(), s.tripped)
		}
	}
}

func TestTrackerTripsAfterForAndResumesAfterResumeAfter(t *testing.T) {
	run(t, Policy{For: 20 * time.Second, ResumeAfter: time.Minute}, []step{
		{0, Healthy, false},
		{10 * time.Second, Unhealthy, false},
		{20 * time.Second, Unhealthy, false},
		{30 * time.Second, Unhealthy, true}, // 20 s unhealthy
		{40 * time.Second, Healthy, true},
		{50 * time.Second, Unhealthy, true}, // the healthy run is broken
		{60 * time.Second, Healthy, true},
		{110 * time.Second, Healthy, true},
		{120 * time.Second, Healthy, false}, // 60 s healthy
	})
}

func TestTrackerWithoutForTripsOnTheFirstUnhealthyReading(t *testing.T) {
	run(t, Policy{ResumeAfter: 30 * time.Second}, []step{
		{0, Unhealthy, true},
		{10 * time.Second, Healthy, true},
		{40 * time.Second, Healthy, false},
		{41 * time.Second, Unhealthy, true},
	})
}

func TestTrackerBetweenThresholdsBreaksEveryRun(t *testing.T) {
	run(t, Policy{For: 10 * time.Second, ResumeAfter: 10 * time.Second}, []step{
		{0, Unhealthy, false},
		{5 * time.Second, Between, false},
		{10 * time.Second, Unhealthy, false}, // the run began again at +10 s
		{20 * time.Second, Unhealthy, true},
		{25 * time.Second, Healthy, true},
		{30 * time.Second, Between, true},
		{35 * time.Second, Healthy, true},
		{45 * time.Second, Healthy, false},
	})
}

func TestTrackerOnError(t *testing.T) {
	t.Run("Hold keeps a pause and never starts one", func(t *testing.T) {
		run(t, Policy{ResumeAfter: 10 * time.Second, OnError: Hold}, []step{
			{0, Unknown, false},
			{10 * time.Second, Unknown, false},
			{20 * time.Second, Unhealthy, true},
			{30 * time.Second, Unknown, true},
			{60 * time.Second, Unknown, true},
			{61 * time.Second, Healthy, true},
			{65 * time.Second, Unknown, true}, // missing data breaks the healthy run
			{71 * time.Second, Healthy, true},
			{81 * time.Second, Healthy, false},
		})
	})
	t.Run("the zero OnError is Hold", func(t *testing.T) {
		run(t, Policy{}, []step{{0, Unknown, false}, {time.Second, Unhealthy, true}, {2 * time.Second, Unknown, true}})
	})
	t.Run("Pause takes missing data as unhealthy", func(t *testing.T) {
		run(t, Policy{For: 10 * time.Second, OnError: Pause}, []step{
			{0, Unknown, false},
			{5 * time.Second, Unhealthy, false},
			{10 * time.Second, Unknown, true},
		})
	})
	t.Run("Run takes missing data as healthy", func(t *testing.T) {
		run(t, Policy{ResumeAfter: 10 * time.Second, OnError: Run}, []step{
			{0, Unhealthy, true},
			{5 * time.Second, Unknown, true},
			{15 * time.Second, Unknown, false},
		})
	})
}

// However short ResumeAfter, a tripped condition holds MinimumHold: a dependency that flaps
// every second pauses the flow once, not every other second.
func TestTrackerHoldsAtLeastMinimumHold(t *testing.T) {
	var steps []step
	for s := time.Duration(0); s < MinimumHold; s += time.Second {
		verdict := Unhealthy
		if s%(2*time.Second) != 0 {
			verdict = Healthy
		}
		steps = append(steps, step{s, verdict, true})
	}
	steps = append(steps, step{MinimumHold - time.Second, Healthy, true}, step{2*MinimumHold - time.Second, Healthy, false})
	run(t, Policy{}, steps)
}

func TestTrackerPendingSaysWhenToLookAgain(t *testing.T) {
	start := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	tr := Tracker{Policy: Policy{For: 30 * time.Second, ResumeAfter: time.Minute}}
	if !tr.Pending().IsZero() {
		t.Fatalf("pending %v before any reading", tr.Pending())
	}
	tr.Observe(Reading{Verdict: Unhealthy, At: start})
	if got, want := tr.Pending(), start.Add(30*time.Second); !got.Equal(want) {
		t.Fatalf("pending %v after an unhealthy reading, want %v", got, want)
	}
	tr.Observe(Reading{Verdict: Unhealthy, At: start.Add(30 * time.Second)})
	if !tr.Tripped() || !tr.Pending().IsZero() || !tr.Since().Equal(start.Add(30*time.Second)) {
		t.Fatalf("tripped %v pending %v since %v, want tripped at +30s with nothing pending", tr.Tripped(), tr.Pending(), tr.Since())
	}
}

// A controller that restarts while a condition holds restores it from the flow's status: the
// flow stays paused without waiting For again, and resumes only after ResumeAfter of health.
func TestTrackerRestoredFromStatusKeepsThePause(t *testing.T) {
	start := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	tr := Tracker{Policy: Policy{For: time.Minute, ResumeAfter: 30 * time.Second}}
	tr.Restore(true, start.Add(-time.Hour))
	tr.Observe(Reading{Verdict: Healthy, At: start})
	if !tr.Tripped() {
		t.Fatal("a restored pause lifted on the first healthy reading")
	}
	tr.Observe(Reading{Verdict: Healthy, At: start.Add(30 * time.Second)})
	if tr.Tripped() {
		t.Fatal("a restored pause did not lift after ResumeAfter of health")
	}
}

// Describe names the reading that decided, a run under way and when it completes, and a
// latest reading that failed; not every reading (it goes into a status).
func TestTrackerDescribeNamesWhatDecided(t *testing.T) {
	start := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	tr := Tracker{Policy: Policy{ResumeAfter: 30 * time.Second}}
	tr.Observe(Reading{Verdict: Unhealthy, Seen: "Available=False", At: start})
	tr.Observe(Reading{Verdict: Unknown, Err: errors.New("connection refused"), At: start.Add(10 * time.Second)})
	if got, want := tr.Describe("orders-db"), "condition orders-db holds: Available=False; the latest reading failed: connection refused"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
	tr.Observe(Reading{Verdict: Healthy, Seen: "Available=True", At: start.Add(20 * time.Second)})
	if got, want := tr.Describe("orders-db"), "condition orders-db holds: Available=False; resumes at 2026-12-05T12:00:50Z if readings stay so"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
	tr.Observe(Reading{Verdict: Healthy, Seen: "Available=True", At: start.Add(50 * time.Second)})
	if got, want := tr.Describe("orders-db"), "condition orders-db does not hold: Available=True"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
	first := Tracker{}
	first.Observe(Reading{Verdict: Unknown, Err: errors.New("no such host"), At: start})
	if got, want := first.Describe("lag"), "condition lag does not hold: unknown (no such host)"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
	// A source that failed at first and answers since: what it answers explains the decision,
	// not the old failure (a status that would say "unknown" for as long as nothing changes).
	first.Observe(Reading{Verdict: Healthy, Seen: "0.2", At: start.Add(10 * time.Second)})
	if got, want := first.Describe("lag"), "condition lag does not hold: 0.2"; got != want || first.Decided().Seen != "0.2" {
		t.Errorf("%q (seen %q), want %q", got, first.Decided().Seen, want)
	}
	first.Observe(Reading{Verdict: Healthy, Seen: "0.3", At: start.Add(20 * time.Second)})
	if got := first.Decided().Seen; got != "0.2" {
		t.Errorf("the decided reading moved to %q at a reading that decided nothing, want 0.2 kept", got)
	}
}

// A clock stepped back (an NTP correction) must not freeze a run toward a change: the run
// starts again at the earlier reading and completes after its wait from there.
func TestTrackerRunRestartsWhenTheClockStepsBack(t *testing.T) {
	run(t, Policy{For: 10 * time.Second}, []step{
		{time.Hour, Unhealthy, false},
		{0, Unhealthy, false}, // an hour earlier: the run starts again here
		{10 * time.Second, Unhealthy, true},
	})
}
