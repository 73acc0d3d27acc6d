// Package pausewhen decides when a flow's spec.pauseWhen conditions hold: what a source's reading
// says (Verdict), and, per condition, when a run of readings trips the pause or lifts it
// (Tracker). It knows nothing of the API types or of where readings come from, so that its rules
// - the for and resumeAfter durations, onError, the hysteresis of numbers - are read, and tested,
// in one place.
package pausewhen

import (
	"fmt"
	"math"
	"time"
)

// Verdict is what one reading of a condition's source says of the dependency.
type Verdict int

const (
	// Between: neither unhealthy nor healthy (a number between its trip and recover
	// thresholds). It keeps the condition as it is and breaks a run toward either side.
	Between Verdict = iota
	// Unhealthy: the trip side (a Deployment not Available, a query above its threshold).
	Unhealthy
	// Healthy: the recover side.
	Healthy
	// Unknown: the source could not say (unreachable, missing, NaN, stale): OnError decides.
	Unknown
)

func (v Verdict) String() string {
	return [...]string{"Between", "Unhealthy", "Healthy", "Unknown"}[v]
}

// OnError is what a condition does with a reading its source could not give.
type OnError string

const (
	// Hold keeps the condition as it is (before any reading: not tripped) and breaks any run
	// toward a change: acting on missing data is what users of metric-driven automation
	// complain of most, so it is the default.
	Hold OnError = "Hold"
	// Pause takes a missing reading as unhealthy.
	Pause OnError = "Pause"
	// Run takes a missing reading as healthy.
	Run OnError = "Run"
)

// Thresholds compare a number: it is unhealthy above Above (or below Below) and healthy again
// only at or below ResumeBelow (or at or above ResumeAbove), which default to the trip
// threshold. Exactly one of Above and Below is set.
type Thresholds struct {
	Above, ResumeBelow *float64
	Below, ResumeAbove *float64
}

// Judge says what the value means under the thresholds; NaN and infinities are Unknown.
func (t Thresholds) Judge(value float64) Verdict {
	if math.IsNaN(value) || math.IsInf(value, 0) {
		return Unknown
	}
	switch {
	case t.Above != nil:
		resume := *t.Above
		if t.ResumeBelow != nil {
			resume = *t.ResumeBelow
		}
		return judge(value > *t.Above, value <= resume)
	case t.Below != nil:
		resume := *t.Below
		if t.ResumeAbove != nil {
			resume = *t.ResumeAbove
		}
		return judge(value < *t.Below, value >= resume)
	}
	return Unknown
}

func judge(trip, recover bool) Verdict {
	switch {
	case trip:
		return Unhealthy
	case recover:
		return Healthy
	}
	return Between
}

// Rejudge judges a number's reading, shared with other askers, by these thresholds.
func (t Thresholds) Rejudge(r Reading) Reading {
	if r.Err == nil {
		r.Verdict = t.Judge(r.Value)
	}
	return r
}

// Reading is one evaluation of a condition's source.
type Reading struct {
	Verdict Verdict
	// Seen is what was read, for status and events: "Available=False", "0.93", "HTTP 503".
	Seen string
	// Value is the number read, for a source that reads one (a query), so that flows sharing
	// the reading judge it by their own thresholds (Rejudge).
	Value float64
	// Err says why the verdict is Unknown.
	Err error
	At  time.Time
}

// Policy is how a condition turns readings into a pause.
type Policy struct {
	// For is how long readings must stay unhealthy before the condition trips; zero trips on
	// the first unhealthy reading.
	For time.Duration
	// ResumeAfter is how long readings must stay healthy before a tripped condition lifts; at
	// least MinimumHold. It is also the least time a condition stays tripped, which bounds
	// flapping: a condition trips at most once per ResumeAfter + For, so at most once per
	// MinimumHold. A pause is never delayed to bound it: only the resume waits.
	ResumeAfter time.Duration
	OnError     OnError
}

// MinimumHold is the least time a tripped condition keeps the flow paused, whatever
// ResumeAfter says.
const MinimumHold = 10 * time.Second

// Tracker follows one condition of one flow. The zero value is not tripped with no reading; a
// tripped condition survives a controller restart through Restore, from the flow's status.
type Tracker struct {
	Policy Policy
	// tripped is the decision; since is when it last changed (zero: never).
	tripped bool
	since   time.Time
	// run is when the current run of readings toward the other decision began (zero: none).
	run  time.Time
	last Reading
	// decided is the reading that took the decision, or the first reading before any (the
	// first that worked, if one failed before): what a status shows, which then changes with
	// decisions, not with every reading.
	decided Reading
	read    bool
}

// Restore sets the decision a previous controller process recorded, and when it was taken.
func (t *Tracker) Restore(tripped bool, since time.Time) {
	t.tripped, t.since, t.run = tripped, since, time.Time{}
}

// Tripped reports the decision: the condition pauses the flow.
func (t *Tracker) Tripped() bool { return t.tripped }

// Since is when the decision last changed (zero if it never did).
func (t *Tracker) Since() time.Time { return t.since }

// Last is the latest reading observed.
func (t *Tracker) Last() Reading { return t.last }

// Decided is the reading that took the decision (before any decision, the first reading).
func (t *Tracker) Decided() Reading { return t.decided }

// Observe takes a reading (readings come in time order) and reports whether the decision
// changed.
func (t *Tracker) Observe(r Reading) (changed bool) {
	t.last = r
	// The first reading, or the first that worked after a failure: a source that failed at
	// first and answers since is explained by what it answers, not by the old failure.
	if !t.read || (t.decided.Err != nil && r.Err == nil) {
		t.decided, t.read = r, true
	}
	v := r.Verdict
	if v == Unknown {
		switch t.Policy.OnError {
		case Pause:
			v = Unhealthy
		case Run:
			v = Healthy
		default:
			t.run = time.Time{}
			return false
		}
	}
	toward := (v == Unhealthy && !t.tripped) || (v == Healthy && t.tripped)
	if !toward {
		t.run = time.Time{}
		return false
	}
	if t.run.IsZero() || r.At.Before(t.run) { // a clock stepped back starts the run again
		t.run = r.At
	}
	if r.At.Sub(t.run) < t.wait() {
		return false
	}
	t.tripped, t.since, t.run, t.decided = !t.tripped, r.At, time.Time{}, r
	return true
}

// wait is how long a run must last to change the decision from what it is.
func (t *Tracker) wait() time.Duration {
	if t.tripped {
		return max(t.Policy.ResumeAfter, MinimumHold)
	}
	return t.Policy.For
}

// Pending is when the current run changes the decision if readings go on saying the same
// (zero if no run is under way), so that the controller evaluates again then.
func (t *Tracker) Pending() time.Time {
	if t.run.IsZero() {
		return time.Time{}
	}
	return t.run.Add(t.wait())
}

// Describe says what the condition decided, on which reading, and what is under way: a run
// toward the other decision and when it completes, a latest reading that failed. It changes
// with those, not with every reading, so that it can go into a status.
func (t *Tracker) Describe(name string) string {
	verb := "does not hold"
	if t.tripped {
		verb = "holds"
	}
	text := fmt.Sprintf("condition %s %s: %s", name, verb, seenOf(t.decided))
	if p := t.Pending(); !p.IsZero() {
		next := "pauses"
		if t.tripped {
			next = "resumes"
		}
		text += fmt.Sprintf("; %s at %s if readings stay so", next, p.UTC().Format(time.RFC3339))
	}
	if t.last.Err != nil && t.decided.Err == nil {
		text += "; the latest reading failed: " + t.last.Err.Error()
	}
	return text
}

func seenOf(r Reading) string {
	if r.Err != nil {
		return "unknown (" + r.Err.Error() + ")"
	}
	return r.Seen
}
