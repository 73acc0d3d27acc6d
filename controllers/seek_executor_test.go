package controllers

import (
	"errors"
	"testing"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// A seek goes to the first pod with a consumer of the flow, an agent before a sidecar, and to
// a sidecar only when no agent pod has one; never to a pod that did not answer.
func TestSeekExecutorPrefersAnAgent(t *testing.T) {
	consumer := []protocol.ConsumerStatus{{Subscription: "s"}}
	answer := func(pod, kind string, consumers []protocol.ConsumerStatus) podOutcome {
		return podOutcome{Pod: pod, Status: &protocol.FlowStatus{Pod: pod, Kind: kind, Consumers: consumers}}
	}
	silent := podOutcome{Pod: "p-silent", Err: errors.New("timeout")}
	for _, tc := range []struct {
		name     string
		outcomes []podOutcome
		want     string
	}{
		{"agent after a sidecar", []podOutcome{answer("a", protocol.KindSidecar, consumer), answer("b", protocol.KindAgent, consumer)}, "b"},
		{"an older agent says no kind", []podOutcome{answer("a", protocol.KindSidecar, consumer), answer("b", "", consumer)}, "b"},
		{"only sidecars", []podOutcome{silent, answer("a", protocol.KindSidecar, nil), answer("b", protocol.KindSidecar, consumer)}, "b"},
		{"an agent without consumers is passed over", []podOutcome{answer("a", protocol.KindAgent, nil), answer("b", protocol.KindSidecar, consumer)}, "b"},
		{"nobody consumes", []podOutcome{silent, answer("a", protocol.KindAgent, nil)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ""
			if i := seekExecutor(tc.outcomes); i >= 0 {
				got = tc.outcomes[i].Pod
			}
			if got != tc.want {
				t.Errorf("executor %q, want %q", got, tc.want)
			}
		})
	}
}
