package controllers

import (
	"fmt"
	"time"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// Effective is the state in force for a flow at one instant, and why.
type Effective struct {
	State  subflowv1.FlowState
	Source subflowv1.StateSource
	// Next is when this answer may change (window start or end, override expiry); nil if never.
	Next *time.Time
	// Notes are things a person should know, e.g. an expired override that is being ignored.
	Notes []string
	// Reason is the override's stated reason, if any.
	Reason string
	// Problems are inputs that passed the API server but cannot be applied (a window that never
	// fires, an unknown override value). They are ignored; the rest still decides the state.
	Problems []string
}

// EffectiveState computes override > a spec.pauseWhen condition that holds > active
// maintenance window > spec.state, where a condition only ever pauses a flow that would run (a
// Stopped one stays Stopped): the conditions' decisions are read from status.pauseWhen, written
// by their evaluation. It always answers: an input that cannot be applied is left out and
// named in Problems, so that spec.state and the override keep working whatever else the spec
// holds.
func EffectiveState(flow *subflowv1.SubscriptionFlow, now time.Time) Effective {
	eff := Effective{State: flow.Spec.State, Source: subflowv1.SourceSpec}
	if eff.State == "" {
		eff.State = subflowv1.StateRunning
	}
	windowState, windowNext, problems := activeWindow(flow.Spec.MaintenanceWindows, now)
	eff.Next, eff.Problems = windowNext, problems
	if windowState != "" {
		eff.State, eff.Source = windowState, subflowv1.SourceWindow
	}
	if len(holding(flow)) > 0 && eff.State == subflowv1.StateRunning {
		eff.State, eff.Source = subflowv1.StatePaused, subflowv1.SourceCondition
	}
	override, until, note, err := activeOverride(flow.Annotations, now)
	if err != nil {
		eff.Problems = append(eff.Problems, err.Error())
	}
	if note != "" {
		eff.Notes = append(eff.Notes, note)
	}
	if override != "" {
		eff.State, eff.Source = override, subflowv1.SourceOverride
		eff.Next = earliest(eff.Next, until)
		eff.Reason = flow.Annotations[subflowv1.OverrideReasonAnnotation]
	}
	return eff
}

// activeWindow returns the state of the most restrictive window open at now (if any), the next
// instant at which any window opens or closes, and the windows that cannot be applied.
func activeWindow(windows []subflowv1.MaintenanceWindow, now time.Time) (subflowv1.FlowState, *time.Time, []string) {
	var state subflowv1.FlowState
	var next *time.Time
	var problems []string
	for i, w := range windows {
		sched, err := parseWindow(w)
		if err != nil {
			problems = append(problems, fmt.Sprintf("spec.maintenanceWindows[%d] is ignored: %v", i, err))
			continue
		}
		if open, end := sched.activeAt(now); open {
			state = mostRestrictive(state, windowStateOf(w))
			next = earliest(next, &end) // its own later starts only extend it
		} else if start, ok := sched.nextStart(now); ok {
			next = earliest(next, &start)
		}
	}
	return state, next, problems
}

func windowStateOf(w subflowv1.MaintenanceWindow) subflowv1.FlowState {
	if w.State == "" {
		return subflowv1.StatePaused
	}
	return w.State
}

// activeOverride reads the on-call override annotations. An expired override yields a note; an
// unknown state is ignored and an unreadable end applies the override without one, both with an
// error for the status.
func activeOverride(annotations map[string]string, now time.Time) (subflowv1.FlowState, *time.Time, string, error) {
	value, ok := annotations[subflowv1.OverrideStateAnnotation]
	if !ok || value == "" {
		return "", nil, "", nil
	}
	state, err := subflowv1.ParseOverrideState(value)
	if err != nil {
		return "", nil, "", fmt.Errorf("%w; it is ignored", err)
	}
	untilValue, ok := annotations[subflowv1.OverrideUntilAnnotation]
	if !ok || untilValue == "" {
		return state, nil, "", nil
	}
	until, err := subflowv1.ParseOverrideUntil(untilValue)
	if err != nil {
		// The state is what the on-call engineer asked for now; only its end is unreadable.
		return state, nil, "", fmt.Errorf("%w; the override applies without an end", err)
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
