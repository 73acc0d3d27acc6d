package controllers

import (
	"fmt"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// cronParser accepts what the CRD admits: five fields or a descriptor such as @daily.
var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Effective is the state in force for a flow at one instant, and why.
type Effective struct {
	State  subflowv1.FlowState
	Source subflowv1.StateSource
	// Next is when this answer may change (window start or end, override expiry); nil if never.
	Next *time.Time
	// Notes are things a person should know, e.g. an expired override that is being ignored.
	Notes []string
}

// EffectiveState computes override > active maintenance window > spec.state. Invalid windows
// or override values are errors: the spec passed the API server but cannot be applied.
func EffectiveState(flow *subflowv1.SubscriptionFlow, now time.Time) (Effective, error) {
	eff := Effective{State: flow.Spec.State, Source: subflowv1.SourceSpec}
	if eff.State == "" {
		eff.State = subflowv1.StateRunning
	}
	windowState, windowNext, err := activeWindow(flow.Spec.MaintenanceWindows, now)
	if err != nil {
		return Effective{}, err
	}
	eff.Next = windowNext
	if windowState != "" {
		eff.State, eff.Source = windowState, subflowv1.SourceWindow
	}
	override, until, note, err := activeOverride(flow.Annotations, now)
	if err != nil {
		return Effective{}, err
	}
	if note != "" {
		eff.Notes = append(eff.Notes, note)
	}
	if override != "" {
		eff.State, eff.Source = override, subflowv1.SourceOverride
		eff.Next = earliest(eff.Next, until)
	}
	return eff, nil
}

// activeWindow returns the state of the most restrictive window active at now (if any) and the
// next instant at which any window starts or ends.
func activeWindow(windows []subflowv1.MaintenanceWindow, now time.Time) (subflowv1.FlowState, *time.Time, error) {
	var state subflowv1.FlowState
	var next *time.Time
	for i, w := range windows {
		start, end, upcoming, err := windowAround(w, now)
		if err != nil {
			return "", nil, fmt.Errorf("spec.maintenanceWindows[%d]: %w", i, err)
		}
		if !start.IsZero() && !now.Before(start) && now.Before(end) {
			state = mostRestrictive(state, windowStateOf(w))
			next = earliest(next, &end)
		}
		next = earliest(next, &upcoming)
	}
	return state, next, nil
}

// windowAround finds the latest window start at or before now that may still be open (zero if
// none), its end, and the next start after now.
func windowAround(w subflowv1.MaintenanceWindow, now time.Time) (start, end, upcoming time.Time, err error) {
	loc := time.UTC
	if w.TimeZone != "" {
		if loc, err = time.LoadLocation(w.TimeZone); err != nil {
			return start, end, upcoming, fmt.Errorf("timeZone %q: %w", w.TimeZone, err)
		}
	}
	sched, err := cronParser.Parse(w.Schedule)
	if err != nil {
		return start, end, upcoming, fmt.Errorf("schedule %q: %w", w.Schedule, err)
	}
	local := now.In(loc)
	upcoming = sched.Next(local)
	// A window still open at now started within the last duration: walk the starts from there.
	for t := sched.Next(local.Add(-w.Duration.Duration - time.Second)); !t.After(local); t = sched.Next(t) {
		start = t
	}
	if !start.IsZero() {
		end = start.Add(w.Duration.Duration)
	}
	return start, end, upcoming, nil
}

func windowStateOf(w subflowv1.MaintenanceWindow) subflowv1.FlowState {
	if w.State == "" {
		return subflowv1.StatePaused
	}
	return w.State
}

// activeOverride reads the on-call override annotations. An expired override yields a note.
func activeOverride(annotations map[string]string, now time.Time) (subflowv1.FlowState, *time.Time, string, error) {
	value, ok := annotations[subflowv1.OverrideStateAnnotation]
	if !ok || value == "" {
		return "", nil, "", nil
	}
	state := subflowv1.FlowState(value)
	if state != subflowv1.StateRunning && state != subflowv1.StatePaused && state != subflowv1.StateStopped {
		return "", nil, "", fmt.Errorf("annotation %s=%q: want Running, Paused or Stopped", subflowv1.OverrideStateAnnotation, value)
	}
	untilValue, ok := annotations[subflowv1.OverrideUntilAnnotation]
	if !ok || untilValue == "" {
		return state, nil, "", nil
	}
	until, err := time.Parse(time.RFC3339, untilValue)
	if err != nil {
		return "", nil, "", fmt.Errorf("annotation %s=%q: want an RFC 3339 time: %w", subflowv1.OverrideUntilAnnotation, untilValue, err)
	}
	if !now.Before(until) {
		return "", nil, fmt.Sprintf("override %s=%s expired at %s and is ignored", subflowv1.OverrideStateAnnotation, value, untilValue), nil
	}
	return state, &until, "", nil
}

func mostRestrictive(a, b subflowv1.FlowState) subflowv1.FlowState {
	return subflowv1.FlowState(protocol.MostRestrictive(protocol.State(a), protocol.State(b)))
}

func earliest(a, b *time.Time) *time.Time {
	if a == nil || (b != nil && b.Before(*a)) {
		return b
	}
	return a
}
