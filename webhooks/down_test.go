package webhooks_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/types"

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
	wio := plane.env.WebhookInstallOptions
	down := refuseConnections(t, fmt.Sprintf("%s:%d", wio.LocalServingHost, wio.LocalServingPort))
	checkAdmittedUnwired("before the controller started")
	typo := flow(ns, override("Pausd", ""))
	if err := c.Create(context.Background(), typo); err != nil {
		t.Fatalf("with the webhook down a flow must still be accepted: %v", err)
	}

	// Only annotation changes are sent to the flow webhook: a spec.state pause, a label or a
	// finalizer never waits on a controller that is down or hangs.
	calls := down.count()
	for _, patch := range []string{`{"spec":{"state":"Paused"}}`, `{"metadata":{"labels":{"team":"orders"}}}`, `{"metadata":{"finalizers":["example.test/keep"]}}`} {
		if err := c.Patch(context.Background(), typo.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
			t.Fatalf("patch %s: %v", patch, err)
		}
	}
	if n := down.count(); n != calls {
		t.Fatalf("the API server called the flow webhook %d times for updates that leave the annotations alone", n-calls)
	}
	reason := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null,"annotations":{"subflow.dev/override-reason":"INC-1"}}}`))
	if err := c.Patch(context.Background(), typo.DeepCopy(), reason); err != nil {
		t.Fatal(err)
	}
	if down.count() == calls {
		t.Fatal("an annotation change was not sent to the flow webhook")
	}
	down.close()

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

// refusingListener stands for a webhook server that is down: it accepts each connection, counts
// it and closes it at once, so the API server's call fails (and is ignored) without waiting.
type refusingListener struct {
	listener net.Listener
	mu       sync.Mutex
	accepted int
	done     chan struct{}
}

func refuseConnections(t *testing.T, addr string) *refusingListener {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	r := &refusingListener{listener: l, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			r.accepted++ // before the close the API server waits for
			r.mu.Unlock()
			conn.Close()
		}
	}()
	t.Cleanup(r.close)
	return r
}

func (r *refusingListener) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.accepted
}

func (r *refusingListener) close() {
	r.listener.Close()
	<-r.done
}
