package agent

import (
	"testing"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// The webhook's environment can gate an agent and name its fallback, never loosen what the
// application chose.
func TestStartFromEnvOnlyTightens(t *testing.T) {
	for _, tc := range []struct {
		name     string
		opts     Options
		env      map[string]string
		gated    bool
		fallback protocol.State
	}{
		{"no environment", Options{}, nil, false, ""},
		{"the webhook gates", Options{}, map[string]string{protocol.StartGatedEnv: "true", protocol.FallbackStateEnv: "Paused"}, true, protocol.Paused},
		{"the application's gate stays", Options{StartGated: true}, map[string]string{protocol.StartGatedEnv: "false"}, true, ""},
		{"the application's fallback wins", Options{FallbackState: protocol.Running}, map[string]string{protocol.StartGatedEnv: "true", protocol.FallbackStateEnv: "Stopped"}, true, protocol.Running},
	} {
		got := startFromEnv(tc.opts, func(k string) string { return tc.env[k] })
		if got.StartGated != tc.gated || got.FallbackState != tc.fallback {
			t.Errorf("%s: StartGated %v FallbackState %q, want %v %q", tc.name, got.StartGated, got.FallbackState, tc.gated, tc.fallback)
		}
	}
}
