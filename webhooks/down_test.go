package webhooks_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/webhooks"
)

// TestWebhookDownFailsOpen runs config/cert-manager's installation on its own control plane:
// while no controller serves the webhooks, pods are created as they come and flows are accepted
// as today (the controller's InvalidSpec report is the safety net); once the controller serves
// them, with the certificate read from files as cert-manager provides it, pods are wired.
func TestWebhookDownFailsOpen(t *testing.T) {
	plane, err := startControlPlane("cert-manager")
	if err != nil {
		t.Fatal(err)
	}
	defer plane.stop()
	c := plane.admin
	ns := namespace(t, c)

	checkAdmittedUnwired := func(phase string) {
		t.Helper()
		pod := create(t, c, appPod(ns, inject("agent"), nil))
		if len(pod.Annotations) != 0 || len(pod.Spec.Volumes) != 0 {
			t.Fatalf("%s: pod annotations %v volumes %v, want the pod as it came", phase, pod.Annotations, pod.Spec.Volumes)
		}
	}
	checkAdmittedUnwired("before the controller started")
	typo := flow(ns, override("Pausd", ""))
	if err := c.Create(context.Background(), typo); err != nil {
		t.Fatalf("with the webhook down a flow must still be accepted: %v", err)
	}

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	if err := plane.startController(ctx, webhooks.Options{SidecarImage: sidecarImage, Certs: webhooks.CertsFromFiles,
		CertDir: plane.env.WebhookInstallOptions.LocalServingCertDir}); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() error {
		if pod := create(t, c, appPod(ns, inject("agent"), nil)); pod.Annotations[webhooks.InjectedAnnotation] != webhooks.ModeAgent {
			return errors.New("pods are not wired yet")
		}
		return nil
	})

	// A value stored while the webhook was down blocks no unrelated update (a finalizer, a label).
	labels := client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"labels":{"db":"orders"}}}`))
	if err := c.Patch(context.Background(), typo.DeepCopy(), labels); err != nil {
		t.Fatalf("labelling a flow whose old override value is unknown: %v", err)
	}
	another := client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"annotations":{"`+subflowv1.OverrideStateAnnotation+`":"Pased"}}}`))
	if err := c.Patch(context.Background(), typo.DeepCopy(), another); err == nil || !strings.Contains(err.Error(), "want Running, Paused or Stopped") {
		t.Fatalf("changing it to another unknown value: %v, want a refusal", err)
	}

	stop()
	eventually(t, func() error {
		pod := create(t, c, appPod(ns, inject("agent"), nil))
		if len(pod.Annotations) != 0 {
			return errors.New("the webhook still answers")
		}
		return nil
	})
	checkAdmittedUnwired("after the controller stopped")
}
