package main

import (
	"strings"
	"testing"

	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// Outside a cluster (no service account), a manager electing a leader is made only when the
// lease's namespace is given: --leader-election-namespace reaches the manager.
func TestLeaderElectionNamespaceReachesTheManager(t *testing.T) {
	cfg := &rest.Config{Host: "http://127.0.0.1:1"} // never contacted: the manager is not started
	base := ctrl.Options{Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"}
	if _, err := ctrl.NewManager(cfg, withElection(base, true, "")); err == nil || !strings.Contains(err.Error(), "namespace") {
		t.Fatalf("election without a namespace outside a cluster: %v, want an error naming the namespace", err)
	}
	if _, err := ctrl.NewManager(cfg, withElection(base, true, "subflow-system")); err != nil {
		t.Fatalf("election with --leader-election-namespace: %v", err)
	}
}
