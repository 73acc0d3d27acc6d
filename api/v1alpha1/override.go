package v1alpha1

import (
	"fmt"
	"strings"
	"time"
)

// ParseOverrideState reads a subflow.dev/override-state value: Running, Paused or Stopped in any
// letter case ("paused" typed during an incident is meant). The error says what is allowed; the
// controller and the admission webhook share it so that both judge a value alike.
func ParseOverrideState(value string) (FlowState, error) {
	for _, s := range []FlowState{StateRunning, StatePaused, StateStopped} {
		if strings.EqualFold(value, string(s)) {
			return s, nil
		}
	}
	return "", fmt.Errorf("annotation %s=%q is not a state: want Running, Paused or Stopped (any letter case)",
		OverrideStateAnnotation, value)
}

// ParseOverrideUntil reads a subflow.dev/override-until value, an RFC 3339 time.
func ParseOverrideUntil(value string) (time.Time, error) {
	until, err := time.Parse(time.RFC3339, value)
	if err != nil {
		return time.Time{}, fmt.Errorf("annotation %s=%q cannot be read: want an RFC 3339 time such as 2026-11-30T18:00:00Z",
			OverrideUntilAnnotation, value)
	}
	return until, nil
}
