package controllers

import (
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

func window(schedule string, d time.Duration, zone string) subflowv1.MaintenanceWindow {
	return subflowv1.MaintenanceWindow{Schedule: schedule, Duration: metav1.Duration{Duration: d}, TimeZone: zone,
		State: subflowv1.StatePaused}
}

func utc(t *testing.T, s string) time.Time {
	t.Helper()
	tm, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

// TestWindowsOverDaylightSavingTime walks both zones over both transitions of 2026:
// Europe/Berlin springs forward 29 March 02:00 CET -> 03:00 CEST (01:00Z) and falls back
// 25 October 03:00 CEST -> 02:00 CET (01:00Z); America/New_York springs forward 8 March 02:00
// EST -> 03:00 EDT (07:00Z) and falls back 1 November 02:00 EDT -> 01:00 EST (06:00Z).
func TestWindowsOverDaylightSavingTime(t *testing.T) {
	tests := []struct {
		name     string
		w        subflowv1.MaintenanceWindow
		now      string
		wantOpen bool
		wantNext string // nextTransitionTime
	}{
		// Spring forward: 02:30 does not exist; the window opens at the end of the gap (03:00
		// local) and lasts its elapsed duration.
		{"Berlin gap start opens at end of gap", window("30 2 * * *", 2*time.Hour, "Europe/Berlin"),
			"2026-03-29T01:00:00Z", true, "2026-03-29T03:00:00Z"},
		{"Berlin before the gap: next start is the gap end", window("30 2 * * *", 2*time.Hour, "Europe/Berlin"),
			"2026-03-29T00:59:00Z", false, "2026-03-29T01:00:00Z"},
		{"Berlin gap window still open after 1h59", window("30 2 * * *", 2*time.Hour, "Europe/Berlin"),
			"2026-03-29T02:59:00Z", true, "2026-03-29T03:00:00Z"},
		{"Berlin gap window closed after 2h elapsed", window("30 2 * * *", 2*time.Hour, "Europe/Berlin"),
			"2026-03-29T03:00:00Z", false, "2026-03-30T00:30:00Z"},
		{"New York gap start opens at end of gap", window("30 2 * * *", time.Hour, "America/New_York"),
			"2026-03-08T07:00:00Z", true, "2026-03-08T08:00:00Z"},
		{"New York day before the gap is normal", window("30 2 * * *", time.Hour, "America/New_York"),
			"2026-03-07T07:30:00Z", true, "2026-03-07T08:30:00Z"},
		// Fall back: 02:30 CEST and 02:30 CET both exist in Berlin; the window opens once, at the
		// first, and a 2h window lasts 2h, not 3h.
		{"Berlin repeated hour opens at first occurrence", window("30 2 * * *", 2*time.Hour, "Europe/Berlin"),
			"2026-10-25T00:30:00Z", true, "2026-10-25T02:30:00Z"},
		{"Berlin repeated hour: still open in the second 02:30", window("30 2 * * *", 2*time.Hour, "Europe/Berlin"),
			"2026-10-25T01:30:00Z", true, "2026-10-25T02:30:00Z"},
		{"Berlin repeated hour: closed after 2h elapsed", window("30 2 * * *", 2*time.Hour, "Europe/Berlin"),
			"2026-10-25T02:30:00Z", false, "2026-10-26T01:30:00Z"},
		{"New York repeated 01:30 opens once", window("30 1 * * *", 2*time.Hour, "America/New_York"),
			"2026-11-01T05:30:00Z", true, "2026-11-01T07:30:00Z"},
		{"New York repeated 01:30: no second opening", window("30 1 * * *", 30*time.Minute, "America/New_York"),
			"2026-11-01T06:30:00Z", false, "2026-11-02T06:30:00Z"},
		// Hourly windows across the gap: 02:xx starts collapse onto 03:00.
		{"every 15 min in the gap hour collapses", window("*/15 2 * * *", 10*time.Minute, "Europe/Berlin"),
			"2026-03-29T01:05:00Z", true, "2026-03-29T01:10:00Z"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			flow := &subflowv1.SubscriptionFlow{Spec: subflowv1.SubscriptionFlowSpec{State: subflowv1.StateRunning,
				MaintenanceWindows: []subflowv1.MaintenanceWindow{tt.w}}}
			got := EffectiveState(flow, utc(t, tt.now))
			if len(got.Problems) > 0 {
				t.Fatal(got.Problems)
			}
			if open := got.Source == subflowv1.SourceWindow; open != tt.wantOpen {
				t.Errorf("open = %v, want %v (state %s)", open, tt.wantOpen, got.State)
			}
			if got.Next == nil || !got.Next.Equal(utc(t, tt.wantNext)) {
				t.Errorf("next = %v, want %s", got.Next, tt.wantNext)
			}
		})
	}
}

func TestWindowThatNeverFiresIsReportedAndSpecStillApplies(t *testing.T) {
	for _, schedule := range []string{"0 0 30 2 *", "0 0 31 4 *", "0 0 31 2,4,6 *", "0 0 30-31 2 *"} {
		t.Run(schedule, func(t *testing.T) {
			flow := &subflowv1.SubscriptionFlow{Spec: subflowv1.SubscriptionFlowSpec{State: subflowv1.StatePaused,
				MaintenanceWindows: []subflowv1.MaintenanceWindow{window("0 2 * * *", time.Hour, ""), window(schedule, time.Hour, "")}}}
			flow.Annotations = map[string]string{subflowv1.OverrideStateAnnotation: "Stopped"}
			done := make(chan Effective, 1)
			go func() { done <- EffectiveState(flow, utc(t, "2026-11-30T12:00:00Z")) }()
			var got Effective
			select {
			case got = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("EffectiveState did not return: schedule math is unbounded")
			}
			if got.State != subflowv1.StateStopped || got.Source != subflowv1.SourceOverride {
				t.Errorf("got %s from %s, want the override to apply", got.State, got.Source)
			}
			if len(got.Problems) != 1 || !strings.Contains(got.Problems[0], "maintenanceWindows[1]") ||
				!strings.Contains(got.Problems[0], "no occurrence") {
				t.Errorf("problems %q, want one naming maintenanceWindows[1]", got.Problems)
			}
			if got.Next == nil || !got.Next.Equal(utc(t, "2026-12-01T02:00:00Z")) {
				t.Errorf("next = %v, want the valid window's next start", got.Next)
			}
		})
	}
}

func TestFebruary29FiresInLeapYears(t *testing.T) {
	s, err := parseWindow(window("0 0 29 2 *", time.Hour, "Europe/Berlin"))
	if err != nil {
		t.Fatal(err)
	}
	next, ok := s.nextStart(utc(t, "2097-03-01T00:00:00Z"))
	if !ok || !next.Equal(utc(t, "2104-02-28T23:00:00Z")) { // 2100 is no leap year
		t.Fatalf("next = %v %v, want 2104-02-29 00:00 Berlin", next, ok)
	}
}

func TestOverlappingStartsMergeIntoOneWindow(t *testing.T) {
	// Every 10 minutes for 15 minutes: one long window; its end is bounded re-evaluation.
	flow := &subflowv1.SubscriptionFlow{Spec: subflowv1.SubscriptionFlowSpec{
		MaintenanceWindows: []subflowv1.MaintenanceWindow{window("*/10 1 * * *", 15*time.Minute, "")}}}
	got := EffectiveState(flow, utc(t, "2026-11-30T01:22:00Z"))
	if got.Source != subflowv1.SourceWindow || got.Next == nil || !got.Next.Equal(utc(t, "2026-11-30T02:05:00Z")) {
		t.Fatalf("got %s next %v, want open until 02:05 (last start 01:50 + 15m)", got.Source, got.Next)
	}
}

// worstWindows is the costliest spec the API accepts: 16 windows firing every minute for the
// longest duration, in a zone with transitions, evaluated next to a transition.
func worstWindows() []subflowv1.MaintenanceWindow {
	ws := make([]subflowv1.MaintenanceWindow, 16)
	for i := range ws {
		ws[i] = window("* * * * *", subflowv1.MaxWindowDuration, "Europe/Berlin")
	}
	return ws
}

func TestWorstAcceptedSpecReturns(t *testing.T) {
	flow := &subflowv1.SubscriptionFlow{Spec: subflowv1.SubscriptionFlowSpec{MaintenanceWindows: worstWindows()}}
	got := EffectiveState(flow, utc(t, "2026-03-29T01:00:30Z"))
	if got.Source != subflowv1.SourceWindow || got.Next == nil {
		t.Fatalf("got %+v", got)
	}
}

func BenchmarkWorstAcceptedSchedule(b *testing.B) {
	flow := &subflowv1.SubscriptionFlow{Spec: subflowv1.SubscriptionFlowSpec{MaintenanceWindows: worstWindows()}}
	now, _ := time.Parse(time.RFC3339, "2026-03-29T01:00:30Z")
	var took []time.Duration
	for b.Loop() {
		start := time.Now()
		EffectiveState(flow, now)
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(len(took)), "samples")
}

func BenchmarkNeverFiringSchedule(b *testing.B) {
	flow := &subflowv1.SubscriptionFlow{Spec: subflowv1.SubscriptionFlowSpec{
		MaintenanceWindows: []subflowv1.MaintenanceWindow{window("0 0 29 2 1", time.Hour, "America/New_York")}}}
	now, _ := time.Parse(time.RFC3339, "2026-03-08T07:00:00Z")
	for b.Loop() {
		EffectiveState(flow, now)
	}
}

func TestRetriesBackOffToACap(t *testing.T) {
	var book memory
	var got []time.Duration
	for range 9 {
		got = append(got, book.nextRetry(flowKey(&subflowv1.SubscriptionFlow{})))
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second,
		32 * time.Second, time.Minute, time.Minute, time.Minute}
	if !slices.Equal(got, want) {
		t.Fatalf("delays %v, want %v", got, want)
	}
	book.resetRetries(flowKey(&subflowv1.SubscriptionFlow{}))
	if d := book.nextRetry(flowKey(&subflowv1.SubscriptionFlow{})); d != time.Second {
		t.Fatalf("after reset %v, want 1s", d)
	}
}

// The day rule is the pinned cron library's: with both day-of-month and day-of-week restricted
// a day matching either fires (the 13th, and every Friday); with one of them a star, both must.
func TestDayRuleIsTheCronLibrarys(t *testing.T) {
	for _, tc := range []struct {
		schedule string
		day      string
		want     bool
	}{
		{"0 9 13 * 5", "2026-12-04", true},  // a Friday
		{"0 9 13 * 5", "2026-12-13", true},  // a Sunday, the 13th
		{"0 9 13 * 5", "2026-12-14", false}, // neither
		{"0 9 13 * *", "2026-12-04", false}, // day-of-week a star: the 13th only
		{"0 9 * * 5", "2026-12-13", false},  // day-of-month a star: Fridays only
		{"0 9 29 2 *", "2028-02-29", true},
	} {
		s, err := parseWindow(window(tc.schedule, time.Hour, "UTC"))
		if err != nil {
			t.Fatal(err)
		}
		day, _ := time.Parse(time.DateOnly, tc.day)
		if got := s.dayMatches(day); got != tc.want {
			t.Errorf("%q on %s: %v, want %v", tc.schedule, tc.day, got, tc.want)
		}
	}
}
