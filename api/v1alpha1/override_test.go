package v1alpha1

import (
	"strings"
	"testing"
)

func TestParseOverrideState(t *testing.T) {
	for value, want := range map[string]FlowState{"Paused": StatePaused, "paused": StatePaused, "STOPPED": StateStopped, "running": StateRunning} {
		if got, err := ParseOverrideState(value); err != nil || got != want {
			t.Errorf("ParseOverrideState(%q) = %q, %v; want %q", value, got, err, want)
		}
	}
	for _, value := range []string{"Pausd", "", " Paused", "halt"} {
		_, err := ParseOverrideState(value)
		if err == nil || !strings.Contains(err.Error(), "want Running, Paused or Stopped") {
			t.Errorf("ParseOverrideState(%q) error = %v, want one naming the allowed states", value, err)
		}
	}
}

func TestParseOverrideUntil(t *testing.T) {
	if _, err := ParseOverrideUntil("2026-11-30T18:00:00+01:00"); err != nil {
		t.Errorf("an RFC 3339 time with an offset: %v", err)
	}
	for _, value := range []string{"tomorrow", "2026-11-30 18:00", "2026-11-30"} {
		if _, err := ParseOverrideUntil(value); err == nil || !strings.Contains(err.Error(), "RFC 3339") {
			t.Errorf("ParseOverrideUntil(%q) error = %v, want one naming RFC 3339", value, err)
		}
	}
}
