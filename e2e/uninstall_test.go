package e2e

import (
	"context"
	"fmt"
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
	in := startIncident(t, "shop-uninstall", 2)
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
