package agent

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/subflow-dev/subflow/agent/protocol"
)

func TestMetricsFollowTheConsumer(t *testing.T) {
	reg := prometheus.NewRegistry()
	fc := &fakeClient{}
	a := newTestAgent(t, Options{Registerer: reg})
	c := subscribeFake(t, a, fc, pulsar.ConsumerOptions{Name: "c1"})
	labels := []string{c.topic, "sub", "c1"}
	state := func(s protocol.State) float64 {
		m, err := a.metrics.state.GetMetricWithLabelValues(append(labels, string(s))...)
		if err != nil {
			t.Fatal(err)
		}
		return testutil.ToFloat64(m)
	}
	if state(protocol.Running) != 1 || state(protocol.Paused) != 0 {
		t.Fatal("state gauge does not show Running")
	}
	c.Chan()
	fc.last().push(1)
	c.Pause()
	if state(protocol.Paused) != 1 || state(protocol.Running) != 0 {
		t.Fatal("state gauge does not show Paused")
	}
	if got := testutil.ToFloat64(a.metrics.held.WithLabelValues(labels...)); got != 1 {
		t.Fatalf("held gauge %v, want 1", got)
	}
	if got := testutil.ToFloat64(a.metrics.transitions.WithLabelValues(append(labels, "Paused")...)); got != 1 {
		t.Fatalf("transitions to Paused %v, want 1", got)
	}
	// A second agent on the same registry shares the collectors.
	if _, err := New(Options{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if n := testutil.CollectAndCount(reg, "subflow_agent_consumer_state"); n != 0 {
		t.Fatalf("%d state series left after Close", n)
	}
}

// The application must not pay for controller-runtime.
func TestAgentDoesNotDependOnControllerRuntime(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go tool")
	}
	out, err := exec.CommandContext(context.Background(), "go", "list", "-deps", "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	// k8s.io/client-go does come in, through pulsar-client-go's Athenz auth provider.
	if strings.Contains(string(out), "sigs.k8s.io/controller-runtime") {
		t.Error("the agent depends on sigs.k8s.io/controller-runtime")
	}
}
