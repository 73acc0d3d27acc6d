package controllers_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/testing/testenv"
)

// kubectlSubflow builds the plugin and returns a function that runs it against the test API
// server, as an administrator would, returning its combined output.
func kubectlSubflow(t *testing.T) func(args ...string) (string, error) {
	t.Helper()
	dir := t.TempDir()
	plugin := filepath.Join(dir, "kubectl-subflow")
	build := exec.Command("go", "build", "-o", plugin, "./cmd/kubectl-subflow")
	build.Dir = testenv.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the plugin: %v\n%s", err, out)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := testenv.WriteKubeconfig(kubeconfig, restConfig); err != nil {
		t.Fatal(err)
	}
	return func(args ...string) (string, error) {
		cmd := exec.Command(plugin, args...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
}

// A flow deleted with deletionPolicy Retain leaves its Paused rule in the pod. A new Running
// flow on that consumer is never Ready while the consumer stays Paused: its status and
// `kubectl subflow status` name the orphaned rule and the command that releases it, and that
// command, run as printed, releases it, after which the new flow's state applies.
func TestIntegrationOrphanedRuleIsNamedAndReleased(t *testing.T) {
	run := kubectlSubflow(t)
	ns := namespace(t, true)
	topic := "orphan-" + ns
	p := startPod(t, ns, "worker-0", topic, testToken)
	old := newFlow(ns, "old", topic, subflowv1.StatePaused)
	old.Spec.DeletionPolicy = subflowv1.DeletionRetain
	create(t, old)
	old = waitFlow(t, old, "the old flow Paused", func(f *subflowv1.SubscriptionFlow) bool { return isTrue(f, subflowv1.ConditionPaused) })
	if err := k8s.Delete(context.Background(), old); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the old flow gone", func() bool {
		return k8s.Get(context.Background(), client.ObjectKeyFromObject(old), &subflowv1.SubscriptionFlow{}) != nil
	})

	flow := newFlow(ns, "new", topic, subflowv1.StateRunning)
	create(t, flow)
	got := waitFlow(t, flow, "Ready=False naming the orphaned rule", func(f *subflowv1.SubscriptionFlow) bool {
		c := condition(f, subflowv1.ConditionReady)
		return current(f) && c != nil && c.Reason == subflowv1.ReasonHeldByOtherRule
	})
	if p.Consumer.State() != protocol.Paused {
		t.Fatalf("the consumer is %s; the orphaned rule should still hold it Paused", p.Consumer.State())
	}
	ready := condition(got, subflowv1.ConditionReady)
	if ready.Status == "True" || !strings.Contains(ready.Message, "the rule "+ns+"/old (uid "+string(old.UID)+", Paused) of a flow that no longer exists") {
		t.Fatalf("Ready = %s: %s", ready.Status, ready.Message)
	}
	if msg := got.Status.Agents[0].Message; !strings.Contains(msg, "orphaned") || !strings.Contains(msg, string(old.UID)) {
		t.Fatalf("the agent's line does not name the orphan: %q", msg)
	}
	status, err := run("status", "new", "-n", ns)
	if err != nil || !strings.Contains(status, "HeldByOtherRule") || !strings.Contains(status, ns+"/old") {
		t.Fatalf("kubectl subflow status (%v):\n%s", err, status)
	}

	_, command, ok := strings.Cut(ready.Message, "release it with: kubectl subflow ")
	if !ok {
		t.Fatalf("no release command in %q", ready.Message)
	}
	args := strings.Fields(strings.ReplaceAll(command, `"`, "")) // the selector is quoted for a shell
	if out, err := run(args...); err != nil || !strings.Contains(out, "released the rule "+ns+"/old in 1 pods") {
		t.Fatalf("kubectl subflow %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	eventually(t, "the consumer running", func() bool { return p.Consumer.State() == protocol.Running })
	poke(t, flow)
	waitFlow(t, flow, "Ready once released", func(f *subflowv1.SubscriptionFlow) bool {
		c := condition(f, subflowv1.ConditionReady)
		return c != nil && c.Reason == subflowv1.ReasonSynced && c.Status == "True"
	})

	// The command refuses a name that is a live flow, and a selector matching nothing.
	if out, err := run("release", "new", "-n", ns, "--selector", "app=worker"); err == nil || !strings.Contains(out, "is not orphaned") {
		t.Fatalf("release of a live flow: %v\n%s", err, out)
	}
	if out, err := run("release", "ghost", "-n", ns, "--selector", "app=nothing"); err == nil || !strings.Contains(out, "matches no running pod") {
		t.Fatalf("release with a selector matching nothing: %v\n%s", err, out)
	}
}
