package webhooks_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/resmap"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/testing/testenv"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
	"github.com/subflow-dev/subflow/webhooks"
)

// The installation as config/default renders it.
const (
	controllerNamespace = "subflow-system"
	controllerUser      = "system:serviceaccount:" + controllerNamespace + ":subflow-controller"
	certSecret          = "subflow-webhook-server-cert"
	mutatingConfig      = "subflow-mutating-webhook-configuration"
	validatingConfig    = "subflow-validating-webhook-configuration"
	sidecarImage        = "subflow-sidecar:test"
	// servingName is the name the API server dials in envtest (the URL's host) and so the one
	// the self-managed certificate is issued for.
	servingName = "localhost"
)

var (
	scheme = runtime.NewScheme()
	// k8s is an admin client of the shared control plane, where the controller's webhooks run
	// with self-managed certificates, impersonating the controller's ServiceAccount.
	k8s client.Client
	// serving is where the shared control plane's webhook server listens.
	serving envtest.WebhookInstallOptions
	shared  *controlPlane
)

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(subflowv1.AddToScheme(scheme))
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	plane, err := startControlPlane("default")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer plane.stop()
	shared, k8s, serving = plane, plane.admin, plane.env.WebhookInstallOptions
	certDir, err := os.MkdirTemp("", "subflow-webhook-certs-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(certDir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := plane.startController(ctx, webhooks.Options{
		SidecarImage: sidecarImage, Certs: webhooks.CertsSelfManaged, CertDir: certDir,
		Namespace: controllerNamespace, SecretName: certSecret, DNSName: servingName,
		MutatingConfiguration: mutatingConfig, ValidatingConfiguration: validatingConfig,
	}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := (testkit.Poll{Within: time.Minute, Every: poll.Every}).UntilNil(func() error { _, err := servedCA(ctx); return err }); err != nil {
		fmt.Fprintln(os.Stderr, "the self-managed certificate is not in use:", err)
		return 1
	}
	return m.Run()
}

// controlPlane is a kube-apiserver with the installation of one config/ overlay: its RBAC, the
// certificate Secret if any, and its webhook configurations, pointed by envtest at a local port.
type controlPlane struct {
	env   *envtest.Environment
	cfg   *rest.Config
	admin client.Client
}

func startControlPlane(overlay string) (*controlPlane, error) {
	rendered, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(),
		filepath.Join(testenv.RepoRoot(), "config", overlay))
	if err != nil {
		return nil, fmt.Errorf("kustomize config/%s: %w", overlay, err)
	}
	mutating, validating, err := webhookConfigurations(rendered)
	if err != nil {
		return nil, err
	}
	assets, err := testenv.Assets()
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(testenv.RepoRoot(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		WebhookInstallOptions: envtest.WebhookInstallOptions{MutatingWebhooks: mutating, ValidatingWebhooks: validating,
			LocalServingHost: "127.0.0.1", LocalServingHostExternalName: servingName},
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting envtest from %s: %w", assets, err)
	}
	plane := &controlPlane{env: env, cfg: cfg}
	if plane.admin, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		plane.stop()
		return nil, err
	}
	if err := plane.install(rendered); err != nil {
		plane.stop()
		return nil, err
	}
	return plane, nil
}

func (p *controlPlane) stop() { _ = p.env.Stop() }

// install creates what the controller runs with: its namespace, identity, RBAC and the
// certificate Secret, in dependency order.
func (p *controlPlane) install(rendered resmap.ResMap) error {
	for _, kind := range []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Secret"} {
		for _, r := range rendered.Resources() {
			if r.GetKind() != kind {
				continue
			}
			obj, err := unstructuredOf(r)
			if err != nil {
				return err
			}
			if err := p.admin.Create(context.Background(), obj); err != nil {
				return fmt.Errorf("creating %s %s: %w", kind, r.GetName(), err)
			}
		}
	}
	return nil
}

// startController runs the manager with the webhooks as main.go sets them up, impersonating the
// controller's ServiceAccount so that it has exactly the permissions the overlay grants.
func (p *controlPlane) startController(ctx context.Context, opts webhooks.Options) error {
	hooks, err := webhooks.New(opts)
	if err != nil {
		return err
	}
	asController := rest.CopyConfig(p.cfg)
	asController.Impersonate = rest.ImpersonationConfig{UserName: controllerUser,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + controllerNamespace, "system:authenticated"}}
	wio := p.env.WebhookInstallOptions
	mgr, err := ctrl.NewManager(asController, ctrl.Options{
		Scheme:  scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		WebhookServer: webhook.NewServer(hooks.ServerOptions(webhook.Options{
			Host: wio.LocalServingHost, Port: wio.LocalServingPort})),
	})
	if err != nil {
		return err
	}
	if err := hooks.SetupWithManager(mgr); err != nil {
		return err
	}
	go func() {
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	}()
	return nil
}

func webhookConfigurations(rendered resmap.ResMap) ([]*admissionregv1.MutatingWebhookConfiguration, []*admissionregv1.ValidatingWebhookConfiguration, error) {
	var mutating []*admissionregv1.MutatingWebhookConfiguration
	var validating []*admissionregv1.ValidatingWebhookConfiguration
	for _, r := range rendered.Resources() {
		m, err := r.Map()
		if err != nil {
			return nil, nil, err
		}
		switch r.GetKind() {
		case "MutatingWebhookConfiguration":
			c := &admissionregv1.MutatingWebhookConfiguration{}
			err = runtime.DefaultUnstructuredConverter.FromUnstructured(m, c)
			mutating = append(mutating, c)
		case "ValidatingWebhookConfiguration":
			c := &admissionregv1.ValidatingWebhookConfiguration{}
			err = runtime.DefaultUnstructuredConverter.FromUnstructured(m, c)
			validating = append(validating, c)
		}
		if err != nil {
			return nil, nil, err
		}
	}
	if len(mutating) != 1 || len(validating) != 1 {
		return nil, nil, fmt.Errorf("want one mutating and one validating webhook configuration, rendered %d and %d", len(mutating), len(validating))
	}
	return mutating, validating, nil
}

// servedCA returns the CA both webhook configurations trust once it is the one the Secret holds
// and the webhook server presents a certificate it signed.
func servedCA(ctx context.Context) ([]byte, error) {
	var secret corev1.Secret
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: controllerNamespace, Name: certSecret}, &secret); err != nil {
		return nil, err
	}
	ca := secret.Data["ca.crt"]
	if len(ca) == 0 {
		return nil, errors.New("the certificate Secret holds no CA yet")
	}
	bundles, err := caBundles(ctx)
	if err != nil {
		return nil, err
	}
	for name, bundle := range bundles {
		if string(bundle) != string(ca) {
			return nil, fmt.Errorf("%s does not trust the Secret's CA yet", name)
		}
	}
	if _, err := handshake(ca); err != nil {
		return nil, err
	}
	return ca, nil
}

func caBundles(ctx context.Context) (map[string][]byte, error) {
	var m admissionregv1.MutatingWebhookConfiguration
	var v admissionregv1.ValidatingWebhookConfiguration
	if err := k8s.Get(ctx, client.ObjectKey{Name: mutatingConfig}, &m); err != nil {
		return nil, err
	}
	if err := k8s.Get(ctx, client.ObjectKey{Name: validatingConfig}, &v); err != nil {
		return nil, err
	}
	return map[string][]byte{mutatingConfig: m.Webhooks[0].ClientConfig.CABundle, validatingConfig: v.Webhooks[0].ClientConfig.CABundle}, nil
}

// handshake connects to the webhook server as the API server does, trusting only ca, and
// returns the certificate it presents.
func handshake(ca []byte) (*x509.Certificate, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, errors.New("no certificate in the CA bundle")
	}
	conn, err := tls.Dial("tcp", fmt.Sprintf("%s:%d", serving.LocalServingHost, serving.LocalServingPort),
		&tls.Config{RootCAs: pool, ServerName: servingName})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0], nil
}

// poll is how the tests wait for the API server and the webhook.
var poll = testkit.Poll{Within: 30 * time.Second, Every: 50 * time.Millisecond}

// eventually fails t with check's last error unless check returns nil within poll.Within.
func eventually(t *testing.T, check func() error) {
	t.Helper()
	if err := poll.UntilNil(check); err != nil {
		t.Fatalf("not within %v: %v", poll.Within, err)
	}
}

func unstructuredOf(r interface {
	Map() (map[string]any, error)
}) (*unstructured.Unstructured, error) {
	m, err := r.Map()
	if err != nil {
		return nil, err
	}
	return &unstructured.Unstructured{Object: m}, nil
}

// namespace creates a namespace for one test.
func namespace(t *testing.T, c client.Client) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "webhook-test-"}}
	if err := c.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}
