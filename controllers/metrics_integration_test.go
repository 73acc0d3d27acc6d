package controllers_test

import (
	"context"
	"fmt"
	"net"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// flowSeries returns the controller's series of metric for one flow, by their state label.
func flowSeries(t *testing.T, metric, ns, name string) map[string]float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != metric {
			continue
		}
		for _, m := range f.GetMetric() {
			if testkit.Label(m, "namespace") == ns && testkit.Label(m, "name") == name {
				out[testkit.Label(m, "state")] += m.GetGauge().GetValue()
			}
		}
	}
	return out
}

func histogramCount(t *testing.T, metric string) uint64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == metric && len(f.GetMetric()) > 0 {
			return f.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	return 0
}

// TestAgentCountsCoverEveryPod: with more pods than status lists, the metric still counts all;
// each failed push counts as Unreachable and is timed.
func TestAgentCountsCoverEveryPod(t *testing.T) {
	unreachableBefore := testkit.MetricSum(t, metrics.Registry, "subflow_agent_push_errors_total", "reason", "Unreachable")
	pushesBefore := histogramCount(t, "subflow_agent_push_duration_seconds")
	ns := namespace(t, true)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := closed.Addr().(*net.TCPAddr).Port
	closed.Close()
	const pods = 80
	for i := range pods {
		createPod(t, ns, fmt.Sprintf("worker-%02d", i), port)
	}
	flow := newFlow(ns, "many", "any", subflowv1.StatePaused)
	create(t, flow)
	waitFlow(t, flow, "80 unreachable", func(f *subflowv1.SubscriptionFlow) bool { return f.Status.Pods.Unreachable == pods })
	eventually(t, "80 unreachable agents in the metric", func() bool {
		return flowSeries(t, "subflow_flow_agents", ns, "many")["Unreachable"] == pods
	}, func() string { return fmt.Sprint(flowSeries(t, "subflow_flow_agents", ns, "many")) })
	if got := len(getFlow(t, flow).Status.Agents); got != 50 {
		t.Fatalf("status lists %d agents, want the bounded 50", got)
	}
	if got := testkit.MetricSum(t, metrics.Registry, "subflow_agent_push_errors_total", "reason", "Unreachable") - unreachableBefore; got < pods {
		t.Fatalf("%v Unreachable push errors counted, want at least %d", got, pods)
	}
	if got := histogramCount(t, "subflow_agent_push_duration_seconds") - pushesBefore; got < pods {
		t.Fatalf("%d pushes timed, want at least %d", got, pods)
	}
	if got := flowSeries(t, "subflow_flow_paused", ns, "many")["Paused"]; got != 1 {
		t.Fatalf("subflow_flow_paused{state=Paused} = %v, want 1", got)
	}
}

// TestMetricsGoWithTheFlowEvenWithoutFinalizer: removing the finalizer by hand still removes
// the flow's series.
func TestMetricsGoWithTheFlowEvenWithoutFinalizer(t *testing.T) {
	ns := namespace(t, true)
	flow := newFlow(ns, "orphan", "any", subflowv1.StatePaused)
	create(t, flow)
	eventually(t, "series present", func() bool { return len(flowSeries(t, "subflow_flow_paused", ns, "orphan")) > 0 })
	patchFlow(t, flow, `{"metadata":{"finalizers":null}}`)
	if err := k8s.Delete(context.Background(), flow); err != nil {
		t.Fatal(err)
	}
	eventually(t, "flow gone", func() bool {
		return k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "orphan"}, &subflowv1.SubscriptionFlow{}) != nil
	})
	eventually(t, "series removed", func() bool {
		return len(flowSeries(t, "subflow_flow_paused", ns, "orphan")) == 0 && len(flowSeries(t, "subflow_flow_agents", ns, "orphan")) == 0
	})
}
