package charts

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/testing/testenv"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
	"github.com/subflow-dev/subflow/webhooks"
)

// TestHelmTestPod creates the chart's `helm test` Pod as helm test does, against an API server
// with the chart's MutatingWebhookConfiguration (pointed by envtest at a local port): while the
// controller's webhook server runs there, the Pod is admitted and wired; once it stops, the
// webhook fails open and the API server refuses the Pod, so helm test fails and says why.
func TestHelmTestPod(t *testing.T) {
	objs := render(t, "subflow", "subflow-system")
	rendered := find(objs, "Pod", "subflow-test-webhook")
	config := find(objs, "MutatingWebhookConfiguration", "subflow-mutating-webhook-configuration")
	if rendered == nil || config == nil {
		t.Fatalf("the chart renders test Pod %v, mutating webhook configuration %v", rendered != nil, config != nil)
	}
	if hook := rendered.GetAnnotations()["helm.sh/hook"]; hook != "test" {
		t.Errorf("the test Pod's helm.sh/hook is %q, want test", hook)
	}
	if none := render(t, "subflow", "subflow-system", "webhook.enabled=false"); find(none, "Pod", "subflow-test-webhook") != nil {
		t.Error("with webhook.enabled=false the chart renders the webhook's test Pod")
	}
	mutating := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(config.Object, mutating); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(rendered.Object, pod); err != nil {
		t.Fatal(err)
	}

	assets, err := testenv.Assets()
	if err != nil {
		t.Fatal(err)
	}
	logf.SetLogger(logr.Discard())
	env := &envtest.Environment{BinaryAssetsDirectory: assets,
		WebhookInstallOptions: envtest.WebhookInstallOptions{MutatingWebhooks: []*admissionregistrationv1.MutatingWebhookConfiguration{mutating},
			LocalServingHost: "127.0.0.1"}}
	env.CRDInstallOptions.Paths = []string{chartDir + "/files/crds"}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting envtest from %s: %v", assets, err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, subflowv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	k8s, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "subflow-system"}}); err != nil {
		t.Fatal(err)
	}

	// The controller's webhooks as main.go serves them (certificates from files: envtest's).
	wio := env.WebhookInstallOptions
	hooks, err := webhooks.New(webhooks.Options{Certs: webhooks.CertsFromFiles, CertDir: wio.LocalServingCertDir})
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"},
		WebhookServer: webhook.NewServer(hooks.ServerOptions(webhook.Options{Host: wio.LocalServingHost, Port: wio.LocalServingPort}))})
	if err != nil {
		t.Fatal(err)
	}
	if err := hooks.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	serving, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- mgr.Start(serving) }()
	t.Cleanup(stop)

	poll := testkit.Poll{Within: 30 * time.Second, Every: 100 * time.Millisecond}
	var last error
	if !poll.Until(func() bool {
		last = k8s.Create(ctx, pod.DeepCopy(), client.DryRunAll)
		return last == nil
	}) {
		t.Fatalf("the test Pod was not admitted within 30s of the webhook server starting: %v", last)
	}
	created := pod.DeepCopy()
	if err := k8s.Create(ctx, created); err != nil {
		t.Fatalf("helm test would fail with the webhook answering: %v", err)
	}
	if created.Annotations[subflowv1.InjectedAnnotation] != "agent" || len(created.Spec.Volumes) == 0 || created.Spec.Volumes[0].Name != "subflow-token" {
		t.Errorf("the admitted test Pod is not wired: annotations %v, volumes %v", created.Annotations, created.Spec.Volumes)
	}
	if err := k8s.Delete(ctx, created); err != nil {
		t.Fatal(err)
	}

	// No replica answers: the webhook fails open, and the Pod is invalid without its patch.
	stop()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("the webhook server stopped with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the webhook server did not stop within 30s")
	}
	const refusal = `volumeMounts[0].name: Not found: "subflow-token"`
	if !poll.Until(func() bool {
		last = k8s.Create(ctx, pod.DeepCopy(), client.DryRunAll)
		return last != nil && strings.Contains(last.Error(), refusal)
	}) {
		t.Errorf("with no webhook server the test Pod was not refused with %q within 30s: %v", refusal, last)
	}
}
