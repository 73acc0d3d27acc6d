package webhooks_test

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/webhooks"
)

// A pod created while a flow selects it starts gated, with the flow's state as its fallback: a
// Deployment rolled or scaled up during a pause consumes nothing before the controller's first
// push, and nothing if the push never comes. A pod no flow selects starts as before.
func TestPodBornIntoAFlowStartsGated(t *testing.T) {
	ns := namespace(t, k8s)
	brokerConfig(t, ns, map[string]string{webhooks.BrokerURLKey: "pulsar://pulsar:6650"})
	paused := flow(ns, nil)
	paused.Spec.State = subflowv1.StatePaused
	if err := k8s.Create(context.Background(), paused); err != nil {
		t.Fatal(err)
	}
	orders := map[string]string{"app": "orders"}
	sidecarArgs := func(labels, annotations map[string]string) []string {
		labels = merge(labels, inject("sidecar"))
		return create(t, k8s, appPod(ns, labels, annotations)).Spec.InitContainers[0].Args
	}
	// The webhook reads flows from the manager's cache: wait until it has this one.
	deadline := time.Now().Add(30 * time.Second)
	for !slices.Contains(sidecarArgs(orders, nil), "--fallback-state=Paused") {
		if time.Now().After(deadline) {
			t.Fatalf("a sidecar pod selected by a Paused flow got args %q, want --start-gated --fallback-state=Paused", sidecarArgs(orders, nil))
		}
		time.Sleep(100 * time.Millisecond) // polling interval
	}
	if args := sidecarArgs(orders, nil); !slices.Contains(args, "--start-gated") {
		t.Errorf("a sidecar pod selected by a Paused flow: args %q, want --start-gated", args)
	}
	if args := sidecarArgs(map[string]string{"app": "billing"}, nil); slices.Contains(args, "--start-gated") {
		t.Errorf("a sidecar pod no flow selects: args %q, want no --start-gated", args)
	}
	if args := sidecarArgs(orders, map[string]string{webhooks.StartGatedAnnotation: "false"}); slices.Contains(args, "--start-gated") {
		t.Errorf("%s=false: args %q, want no --start-gated", webhooks.StartGatedAnnotation, args)
	}

	agentPod := create(t, k8s, appPod(ns, merge(orders, inject("agent")), nil))
	env := container(agentPod, "app").Env
	for _, want := range []corev1.EnvVar{{Name: webhooks.StartGatedEnv, Value: "true"}, {Name: webhooks.FallbackStateEnv, Value: "Paused"}} {
		if !slices.Contains(env, want) {
			t.Errorf("an agent pod selected by a Paused flow: env %v, want %s=%s", env, want.Name, want.Value)
		}
	}
}

func merge(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}
