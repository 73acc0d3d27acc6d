package controllers

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

func TestEffectiveState(t *testing.T) {
	// Saturday 2026-11-28; Europe/Berlin is UTC+1 in winter.
	saturday := func(hhmm string) time.Time {
		tm, err := time.Parse(time.RFC3339, "2026-11-28T"+hhmm+":00Z")
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	window := subflowv1.MaintenanceWindow{Schedule: "0 2 * * 6", Duration: metav1.Duration{Duration: 2 * time.Hour},
		TimeZone: "Europe/Berlin", State: subflowv1.StatePaused}
	tests := []struct {
		name        string
		spec        subflowv1.FlowState
		windows     []subflowv1.MaintenanceWindow
		annotations map[string]string
		now         time.Time
		wantState   subflowv1.FlowState
		wantSource  subflowv1.StateSource
		wantNext    string
		wantNote    string
	}{
		{name: "spec only", spec: subflowv1.StatePaused, now: saturday("10:00"),
			wantState: subflowv1.StatePaused, wantSource: subflowv1.SourceSpec},
		{name: "empty spec state means Running", now: saturday("10:00"),
			wantState: subflowv1.StateRunning, wantSource: subflowv1.SourceSpec},
		{name: "before window: next is its start", spec: subflowv1.StateRunning, windows: []subflowv1.MaintenanceWindow{window},
			now: saturday("00:59"), wantState: subflowv1.StateRunning, wantSource: subflowv1.SourceSpec, wantNext: "2026-11-28T01:00:00Z"},
		{name: "window start is inclusive", spec: subflowv1.StateRunning, windows: []subflowv1.MaintenanceWindow{window},
			now: saturday("01:00"), wantState: subflowv1.StatePaused, wantSource: subflowv1.SourceWindow, wantNext: "2026-11-28T03:00:00Z"},
		{name: "window end is exclusive", spec: subflowv1.StateRunning, windows: []subflowv1.MaintenanceWindow{window},
			now: saturday("03:00"), wantState: subflowv1.StateRunning, wantSource: subflowv1.SourceSpec, wantNext: "2026-12-05T01:00:00Z"},
		{name: "most restrictive of overlapping windows", spec: subflowv1.StateRunning,
			windows: []subflowv1.MaintenanceWindow{window, {Schedule: "30 0 * * *", Duration: metav1.Duration{Duration: 4 * time.Hour}, State: subflowv1.StateStopped}},
			now:     saturday("02:00"), wantState: subflowv1.StateStopped, wantSource: subflowv1.SourceWindow, wantNext: "2026-11-28T03:00:00Z"},
		{name: "override wins over window", spec: subflowv1.StatePaused, windows: []subflowv1.MaintenanceWindow{window},
			annotations: map[string]string{subflowv1.OverrideStateAnnotation: "Running", subflowv1.OverrideUntilAnnotation: "2026-11-28T02:30:00Z"},
			now:         saturday("02:00"), wantState: subflowv1.StateRunning, wantSource: subflowv1.SourceOverride, wantNext: "2026-11-28T02:30:00Z"},
		{name: "expired override is ignored and reported", spec: subflowv1.StatePaused,
			annotations: map[string]string{subflowv1.OverrideStateAnnotation: "Running", subflowv1.OverrideUntilAnnotation: "2026-11-28T01:30:00Z"},
			now:         saturday("02:00"), wantState: subflowv1.StatePaused, wantSource: subflowv1.SourceSpec, wantNote: "expired"},
		{name: "override without end", spec: subflowv1.StateRunning,
			annotations: map[string]string{subflowv1.OverrideStateAnnotation: "Stopped"},
			now:         saturday("02:00"), wantState: subflowv1.StateStopped, wantSource: subflowv1.SourceOverride},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			flow := &subflowv1.SubscriptionFlow{Spec: subflowv1.SubscriptionFlowSpec{State: tt.spec, MaintenanceWindows: tt.windows}}
			flow.Annotations = tt.annotations
			got := EffectiveState(flow, tt.now)
			if len(got.Problems) > 0 {
				t.Fatal(got.Problems)
			}
			if got.State != tt.wantState || got.Source != tt.wantSource {
				t.Errorf("got %s from %s, want %s from %s", got.State, got.Source, tt.wantState, tt.wantSource)
			}
			next := ""
			if got.Next != nil {
				next = got.Next.UTC().Format(time.RFC3339)
			}
			if next != tt.wantNext {
				t.Errorf("next transition %q, want %q", next, tt.wantNext)
			}
			if tt.wantNote != "" && (len(got.Notes) == 0 || !strings.Contains(got.Notes[0], tt.wantNote)) {
				t.Errorf("notes %q, want one containing %q", got.Notes, tt.wantNote)
			}
		})
	}
}

func TestBadOverrideIsReportedAndTheRestApplies(t *testing.T) {
	paused := subflowv1.SubscriptionFlowSpec{State: subflowv1.StatePaused}
	tests := []struct {
		name        string
		annotations map[string]string
		wantState   subflowv1.FlowState
		wantSource  subflowv1.StateSource
		wantProblem string
	}{
		{name: "unknown state is ignored", annotations: map[string]string{subflowv1.OverrideStateAnnotation: "Sleeping"},
			wantState: subflowv1.StatePaused, wantSource: subflowv1.SourceSpec, wantProblem: "want Running, Paused or Stopped"},
		{name: "letter case does not matter", annotations: map[string]string{subflowv1.OverrideStateAnnotation: "stopped"},
			wantState: subflowv1.StateStopped, wantSource: subflowv1.SourceOverride},
		{name: "unreadable end keeps the override, without end", annotations: map[string]string{
			subflowv1.OverrideStateAnnotation: "Running", subflowv1.OverrideUntilAnnotation: "tomorrow"},
			wantState: subflowv1.StateRunning, wantSource: subflowv1.SourceOverride, wantProblem: "RFC 3339"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			flow := &subflowv1.SubscriptionFlow{Spec: paused}
			flow.Annotations = tt.annotations
			got := EffectiveState(flow, time.Now())
			if got.State != tt.wantState || got.Source != tt.wantSource {
				t.Errorf("got %s from %s, want %s from %s", got.State, got.Source, tt.wantState, tt.wantSource)
			}
			problems := strings.Join(got.Problems, "; ")
			if (tt.wantProblem == "") != (problems == "") || !strings.Contains(problems, tt.wantProblem) {
				t.Errorf("problems %q, want %q", problems, tt.wantProblem)
			}
		})
	}
}
