package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/testing/testenv"
)

// The plugin runs in-process against a real kube-apiserver with the CRD installed; there is no
// controller, so tests write status themselves where a command reads it.

var (
	kubeconfig       string        // admin kubeconfig; its current context's namespace is contextNS
	viewerKubeconfig string        // user "viewer", who has no RBAC rights unless a test grants them
	k8s              client.Client // the tests' own view of the API server
)

const (
	contextNS      = "from-context"
	otherContext   = "other"
	otherContextNS = "from-other-context"
)

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	env, cfg, err := testenv.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	dir, err := os.MkdirTemp("", "kubectl-subflow-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = os.RemoveAll(dir) }()
	kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := writeKubeconfig(kubeconfig, cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	viewer, err := env.AddUser(envtest.User{Name: "viewer"}, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	viewerKubeconfig = filepath.Join(dir, "viewer-kubeconfig")
	if err := writeKubeconfig(viewerKubeconfig, viewer.Config()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if k8s, err = testenv.Client(cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// writeKubeconfig writes two contexts for the same admin user, differing only in namespace.
func writeKubeconfig(path string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["admin"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "admin", Namespace: contextNS}
	kc.Contexts[otherContext] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "admin", Namespace: otherContextNS}
	kc.CurrentContext = "admin"
	return clientcmd.WriteToFile(*kc, path)
}

// result is what a person running the plugin sees.
type result struct {
	stdout, stderr string
	code           int
}

// subflow runs `kubectl subflow ARGS --kubeconfig ...` in-process.
func subflow(args ...string) result {
	var stdout, stderr bytes.Buffer
	code := run(append(args, "--kubeconfig", kubeconfig), &stdout, &stderr)
	return result{stdout.String(), stderr.String(), code}
}

func (r result) String() string {
	return fmt.Sprintf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
}

func mustSucceed(t *testing.T, args ...string) result {
	t.Helper()
	r := subflow(args...)
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("kubectl subflow %s: %s", strings.Join(args, " "), r)
	}
	return r
}

// namespace creates a fresh namespace for one test.
func namespace(t *testing.T, name string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := k8s.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return name
}

// newFlow creates a flow; change adjusts it before creation.
func newFlow(t *testing.T, ns, name string, change func(*subflowv1.SubscriptionFlow)) *subflowv1.SubscriptionFlow {
	t.Helper()
	flow := &subflowv1.SubscriptionFlow{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: map[string]string{"team": "orders"}},
		Spec: subflowv1.SubscriptionFlowSpec{
			Selector:     metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Subscription: name,
		},
	}
	if change != nil {
		change(flow)
	}
	if err := k8s.Create(context.Background(), flow); err != nil {
		t.Fatal(err)
	}
	return flow
}

func getFlow(t *testing.T, ns, name string) *subflowv1.SubscriptionFlow {
	t.Helper()
	var flow subflowv1.SubscriptionFlow
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &flow); err != nil {
		t.Fatal(err)
	}
	return &flow
}

// setStatus writes status as the controller would.
func setStatus(t *testing.T, ns, name string, change func(*subflowv1.SubscriptionFlow)) {
	t.Helper()
	flow := getFlow(t, ns, name)
	change(flow)
	if err := k8s.Status().Update(context.Background(), flow); err != nil {
		t.Fatal(err)
	}
}

func condition(condType string, status metav1.ConditionStatus, reason, message string) metav1.Condition {
	return metav1.Condition{Type: condType, Status: status, Reason: reason, Message: message,
		LastTransitionTime: metav1.NewTime(time.Now().Add(-5 * time.Minute).Truncate(time.Second))}
}
