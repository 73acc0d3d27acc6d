// Package testenv starts a real control plane (kube-apiserver and etcd through envtest) with the
// subflow CRD installed, for integration tests and the demo.
package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// RepoRoot is the root of the subflow module, found from this file's location.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// Assets returns the directory holding kube-apiserver and etcd: $KUBEBUILDER_ASSETS when set,
// otherwise whatever hack/setup-envtest.sh provides (it builds them on first use).
func Assets() (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" || os.Getenv("USE_EXISTING_CLUSTER") == "true" {
		return dir, nil
	}
	cmd := exec.Command(filepath.Join(RepoRoot(), "hack", "setup-envtest.sh"))
	cmd.Stderr = os.Stderr
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("providing envtest binaries with hack/setup-envtest.sh: %w", err)
	}
	return strings.TrimSpace(out.String()), nil
}

// Start starts the control plane and installs the CRDs of config/crd/bases. Stop the returned
// environment when done.
func Start() (*envtest.Environment, *rest.Config, error) {
	return start(envtest.WebhookInstallOptions{})
}

// StartWithWebhooks is Start with the admission webhooks of config/webhook installed, pointed at
// a local server: serve them on env.WebhookInstallOptions' LocalServingHost and
// LocalServingPort with the certificate envtest writes to its LocalServingCertDir.
func StartWithWebhooks() (*envtest.Environment, *rest.Config, error) {
	return start(envtest.WebhookInstallOptions{
		Paths:            []string{filepath.Join(RepoRoot(), "config", "webhook", "manifests.yaml")},
		LocalServingHost: "127.0.0.1",
	})
}

func start(webhooks envtest.WebhookInstallOptions) (*envtest.Environment, *rest.Config, error) {
	assets, err := Assets()
	if err != nil {
		return nil, nil, err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(RepoRoot(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		WebhookInstallOptions: webhooks,
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, nil, fmt.Errorf("starting envtest control plane from %s: %w", assets, err)
	}
	return env, cfg, nil
}

// WriteKubeconfig writes a kubeconfig at path whose current context reaches cfg's API server
// as cfg's user, for kubectl and the plugin run as separate processes.
func WriteKubeconfig(path string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData,
		Token: cfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "admin"}
	kc.CurrentContext = "envtest"
	return clientcmd.WriteToFile(*kc, path)
}

// Scheme knows the built-in kinds, CustomResourceDefinitions and SubscriptionFlows.
func Scheme() *k8sruntime.Scheme {
	scheme := k8sruntime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = apiextensionsv1.AddToScheme(scheme)
	_ = subflowv1.AddToScheme(scheme)
	return scheme
}

// Client is a client of cfg's API server for the kinds of Scheme.
func Client(cfg *rest.Config) (client.Client, error) {
	return client.New(cfg, client.Options{Scheme: Scheme()})
}
