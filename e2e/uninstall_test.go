package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestUninstallReleasesPodsFirst removes subflow as README says, during a pause: the flows are
// deleted while the controller runs, which releases their pods (deletionPolicy Resume: the
// messages produced during the pause are processed), then helm uninstall removes the
// controller, and the CRD, which the chart keeps, goes last. It runs last: the file's name sorts
// after every other test file's, and go test runs files in that order.
func TestUninstallReleasesPodsFirst(t *testing.T) {
	in := startIncident(t, "shop-uninstall", goAgent, 2)
	kubectl(t, "delete", "sf", "--all", "-n", in.ns, "--wait", "--timeout=60s")
	in.waitProcessed(t, in.during)

	if _, err := w.helm(context.Background(), "uninstall", "subflow", "-n", "subflow-system", "--wait", "--timeout", "2m"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the controller's pods are gone", func() error {
		if pods := kubectl(t, "get", "pods", "-n", "subflow-system", "-o", "name"); strings.TrimSpace(pods) != "" {
			return fmt.Errorf("after helm uninstall: %s", pods)
		}
		return nil
	})
	if crd := kubectl(t, "get", "crd", "-o", "name"); !strings.Contains(crd, "subscriptionflows.subflow.dev") {
		t.Errorf("helm uninstall removed the CRD, which the chart keeps (crds.keep): %s", crd)
	}
	kubectl(t, "delete", "crd", "subscriptionflows.subflow.dev", "--wait", "--timeout=60s")
}

// TestKustomizeDeployAndUndeploy installs subflow the other way README gives, make deploy (the
// kustomize overlay, self-managed certificates), runs an incident's pause and resume on it, and
// removes it with make undeploy, which releases the flows' pods before the controller goes. It
// runs after the chart's uninstall.
func TestKustomizeDeployAndUndeploy(t *testing.T) {
	makeTarget(t, "deploy", "IMG="+image("subflow-controller"))
	kubectl(t, "wait", "deployment", "--all", "-n", "subflow-system", "--for=condition=Available", "--timeout=180s")
	in := startIncident(t, "shop-kustomize", goAgent, 1)
	in.resume(t)
	extra := produce(t, in.topic, "undeploy", 5)
	kubectl(t, "patch", "sf", in.sub, "-n", in.ns, "--type", "merge", "-p", `{"spec":{"state":"Paused"}}`)
	kubectl(t, "wait", "sf/"+in.sub, "-n", in.ns, "--for=condition=Paused", "--timeout=60s")
	makeTarget(t, "undeploy")
	in.waitProcessed(t, extra) // released before the controller went: the pod runs again
	if crd, err := w.cluster.Kubectl(context.Background(), "get", "crd", "subscriptionflows.subflow.dev", "-o", "name"); err == nil {
		t.Errorf("make undeploy left the CRD: %s", crd)
	}
}

// makeTarget runs a target of the project's Makefile against the cluster, as a user does.
func makeTarget(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command("make", append([]string{"-C", "..", "--no-print-directory"}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+w.cluster.Kubeconfig)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}
