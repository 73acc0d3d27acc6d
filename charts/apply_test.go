package charts

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/testing/testenv"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// standIns are minimal CRDs for the kinds of cert-manager and the Prometheus Operator that the
// chart renders (envtest has neither): their group, version, kind and scope, with any spec
// accepted. So every object of the chart is applied, but only the API server's own kinds and
// the subflow CRD are checked against a schema.
func standIns() []*apiextensionsv1.CustomResourceDefinition {
	crd := func(group, kind, plural string) *apiextensionsv1.CustomResourceDefinition {
		return &apiextensionsv1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: plural + "." + group},
			Spec: apiextensionsv1.CustomResourceDefinitionSpec{
				Group: group, Scope: apiextensionsv1.NamespaceScoped,
				Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: kind, ListKind: kind + "List", Plural: plural, Singular: strings.ToLower(kind)},
				Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
					Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
						Type: "object", XPreserveUnknownFields: ptr.To(true)}}}},
			},
		}
	}
	return []*apiextensionsv1.CustomResourceDefinition{
		crd("cert-manager.io", "Certificate", "certificates"),
		crd("cert-manager.io", "Issuer", "issuers"),
		crd("monitoring.coreos.com", "PrometheusRule", "prometheusrules"),
		crd("monitoring.coreos.com", "ServiceMonitor", "servicemonitors"),
		crd("monitoring.coreos.com", "PodMonitor", "podmonitors"),
	}
}

// TestApplyServerSide installs the chart the way `helm install` would send it, server-side with
// kubectl (or the same requests from the Go client where there is no kubectl), into an API server
// that has no subflow CRD yet: with the default values as release
// subflow in subflow-system, and with the non-default values as release team-subflow in ops. The
// API server accepts every object, the CRD it installs serves SubscriptionFlows, and with the
// webhooks installed but no controller running, flows and labelled pods are still created (both
// webhooks fail open). The controller's ServiceAccount gets what the certificate rotation needs,
// by name, and no more.
func TestApplyServerSide(t *testing.T) {
	assets, err := testenv.Assets()
	if err != nil {
		t.Fatal(err)
	}
	// kubectl as hack/teardown finds it; without it the same server-side apply requests are sent
	// from here (a PATCH of type apply-patch+yaml per object, in the rendered order, as kubectl does).
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		kubectl = filepath.Join(assets, "kubectl")
		if _, err := os.Stat(kubectl); err != nil {
			kubectl = ""
			t.Log("no kubectl on PATH or with the envtest binaries: applying server-side with the Go client instead")
		}
	}
	logf.SetLogger(logr.Discard()) // envtest logs through controller-runtime's logger
	env := &envtest.Environment{BinaryAssetsDirectory: assets, CRDs: standIns()}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting envtest from %s: %v", assets, err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := testenv.WriteKubeconfig(kubeconfig, cfg); err != nil {
		t.Fatal(err)
	}
	k8s, err := testenv.Client(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(kubectl, args...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}

	installs := []struct {
		release, namespace string
		values             []string
	}{
		{"subflow", "subflow-system", nil},
		{"team-subflow", "ops", nonDefault},
	}
	// One field manager for both releases: they share the CRD, as two installs of one chart would.
	apply := func(path string, objs []*unstructured.Unstructured) {
		t.Helper()
		if kubectl != "" {
			run("apply", "--server-side", "--field-manager=helm", "-f", path)
			return
		}
		for _, o := range objs {
			if err := k8s.Apply(ctx, client.ApplyConfigurationFromUnstructured(o.DeepCopy()), client.FieldOwner("helm")); err != nil {
				t.Fatalf("server-side apply of %s %s: %v", o.GetKind(), client.ObjectKeyFromObject(o), err)
			}
		}
	}
	rendered := map[string]string{}
	renderedObjs := map[string][]*unstructured.Unstructured{}
	for _, in := range installs {
		args := []string{"template", in.release, chartDir, "--namespace", in.namespace}
		for _, v := range in.values {
			args = append(args, "--set", v)
		}
		all, err := decode(helm(t, args...))
		if err != nil {
			t.Fatal(err)
		}
		// helm install leaves out the test hooks (helm test creates them: TestHelmTestPod).
		objs, manifests := withoutTestHooks(t, all)
		path := filepath.Join(t.TempDir(), in.release+".yaml")
		if err := os.WriteFile(path, []byte(manifests), 0o600); err != nil {
			t.Fatal(err)
		}
		// helm install --create-namespace
		if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: in.namespace}}); err != nil {
			t.Fatal(err)
		}
		apply(path, objs)
		rendered[in.release], renderedObjs[in.release] = path, objs
		for _, o := range objs {
			got := &unstructured.Unstructured{}
			got.SetGroupVersionKind(o.GroupVersionKind())
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(o), got); err != nil {
				t.Errorf("release %s: %s %s not stored: %v", in.release, o.GetKind(), client.ObjectKeyFromObject(o), err)
			}
		}
		kinds := map[string]bool{}
		for _, o := range objs {
			kinds[o.GetKind()] = true
		}
		t.Logf("release %s in %s: %d objects applied (%d kinds)", in.release, in.namespace, len(objs), len(kinds))
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := k8s.Get(ctx, client.ObjectKey{Name: "subscriptionflows.subflow.dev"}, crd); err != nil {
		t.Fatal(err)
	}
	if err := envtest.WaitForCRDs(cfg, []*apiextensionsv1.CustomResourceDefinition{crd}, envtest.CRDInstallOptions{
		MaxTime: time.Minute, PollInterval: 50 * time.Millisecond}); err != nil {
		t.Fatalf("the chart's CRD is not served: %v", err)
	}

	// No controller runs: both webhooks' Services have no endpoints, and nothing is refused.
	shop := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}
	if err := k8s.Create(ctx, shop); err != nil {
		t.Fatal(err)
	}
	flow := &subflowv1.SubscriptionFlow{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders-ingest",
		Annotations: map[string]string{"subflow.dev/override-state": "Paused"}},
		Spec: subflowv1.SubscriptionFlowSpec{Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "orders-worker"}},
			Subscription: "orders-ingest", State: subflowv1.StatePaused}}
	if err := k8s.Create(ctx, flow); err != nil {
		t.Errorf("creating a SubscriptionFlow with the chart's CRD and webhooks, no controller running: %v", err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders-worker-0",
		Labels: map[string]string{"app": "orders-worker", "subflow.dev/inject": "agent"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Image: "orders-worker:1"}}}}
	if err := k8s.Create(ctx, pod); err != nil {
		t.Errorf("creating a pod labelled for injection, no controller running: %v", err)
	} else if _, injected := pod.Annotations["subflow.dev/injected"]; injected || len(pod.Spec.Volumes) > 0 {
		t.Errorf("a pod was changed with no webhook server running: %v %v", pod.Annotations, pod.Spec.Volumes)
	}

	// The controller fills the self-managed Secret and both caBundles; an upgrade (Helm 4 applies
	// server-side by default) must leave them: Helm never owned those fields.
	t.Run("upgrade keeps the self-managed certificate", func(t *testing.T) {
		secret := &corev1.Secret{}
		key := client.ObjectKey{Namespace: "subflow-system", Name: "subflow-webhook-server-cert"}
		if err := k8s.Get(ctx, key, secret); err != nil {
			t.Fatal(err)
		}
		secret.Data = map[string][]byte{"ca.crt": []byte("ca"), "tls.crt": []byte("crt"), "tls.key": []byte("key")}
		if err := k8s.Update(ctx, secret, client.FieldOwner("subflow")); err != nil {
			t.Fatal(err)
		}
		mutating := &admissionregistrationv1.MutatingWebhookConfiguration{}
		if err := k8s.Get(ctx, client.ObjectKey{Name: "subflow-mutating-webhook-configuration"}, mutating); err != nil {
			t.Fatal(err)
		}
		mutating.Webhooks[0].ClientConfig.CABundle = []byte("ca")
		if err := k8s.Update(ctx, mutating, client.FieldOwner("subflow")); err != nil {
			t.Fatal(err)
		}
		apply(rendered["subflow"], renderedObjs["subflow"])
		if err := k8s.Get(ctx, key, secret); err != nil {
			t.Fatal(err)
		}
		if string(secret.Data["tls.crt"]) != "crt" || string(secret.Data["ca.crt"]) != "ca" {
			t.Errorf("re-applying the chart emptied the controller's Secret: %v", secret.Data)
		}
		if err := k8s.Get(ctx, client.ObjectKey{Name: "subflow-mutating-webhook-configuration"}, mutating); err != nil {
			t.Fatal(err)
		}
		if string(mutating.Webhooks[0].ClientConfig.CABundle) != "ca" {
			t.Errorf("re-applying the chart reset the caBundle to %q", mutating.Webhooks[0].ClientConfig.CABundle)
		}
	})

	// Each release's admission policy lets its controller create the agent-token Secret and no
	// Secret a stolen controller token could turn into a ServiceAccount's credentials.
	for user, namespace := range map[string]string{"system:serviceaccount:subflow-system:subflow-controller": "subflow-system",
		"system:serviceaccount:ops:team-subflow-controller": "ops"} {
		t.Run("secret creates as "+user, func(t *testing.T) {
			checkControllerSecretCreates(t, cfg, k8s, user, namespace)
		})
	}

	t.Run("view and edit aggregate", func(t *testing.T) { checkAggregation(t, k8s, "subflow") })

	t.Run("permissions", func(t *testing.T) {
		type access struct {
			verb, group, resource, namespace, name string
			allowed                                bool
		}
		admission := "admissionregistration.k8s.io"
		checks := map[string][]access{
			// Self-managed certificates: the rotation's Secret and both webhook configurations, by name.
			"system:serviceaccount:subflow-system:subflow-controller": {
				{"update", "", "secrets", "subflow-system", "subflow-webhook-server-cert", true},
				{"get", "", "secrets", "subflow-system", "subflow-webhook-server-cert", true},
				{"list", "", "secrets", "subflow-system", "", true},
				{"watch", "", "secrets", "subflow-system", "", true},
				{"update", "", "secrets", "subflow-system", "other", false},
				{"delete", "", "secrets", "subflow-system", "subflow-webhook-server-cert", false},
				{"patch", "", "secrets", "subflow-system", "subflow-webhook-server-cert", false},
				{"update", "", "secrets", "shop", "subflow-webhook-server-cert", false},
				{"list", "", "secrets", "shop", "", false},
				{"get", "", "secrets", "shop", "db-password", false},
				{"get", "", "secrets", "shop", "subflow-agent-token", true},
				{"get", "postgresql.cnpg.io", "clusters", "shop", "orders-db", false},
				{"update", admission, "mutatingwebhookconfigurations", "", "subflow-mutating-webhook-configuration", true},
				{"update", admission, "validatingwebhookconfigurations", "", "subflow-validating-webhook-configuration", true},
				{"list", admission, "mutatingwebhookconfigurations", "", "", true},
				{"update", admission, "mutatingwebhookconfigurations", "", "team-subflow-mutating-webhook-configuration", false},
				{"update", admission, "validatingwebhookconfigurations", "", "subflow-mutating-webhook-configuration", false},
				{"patch", admission, "mutatingwebhookconfigurations", "", "subflow-mutating-webhook-configuration", false},
				{"delete", admission, "mutatingwebhookconfigurations", "", "subflow-mutating-webhook-configuration", false},
				{"create", admission, "validatingwebhookconfigurations", "", "", false},
				{"update", "", "pods", "shop", "", false},
				{"get", "", "pods", "shop", "", false},
				{"update", "subflow.dev", "subscriptionflows/finalizers", "shop", "", false},
			},
			// cert-manager: the controller needs no certificate permission at all.
			"system:serviceaccount:ops:team-subflow-controller": {
				{"patch", "subflow.dev", "subscriptionflows", "shop", "orders-ingest", true},
				{"update", "", "secrets", "ops", "team-subflow-webhook-server-cert", false},
				// pauseWhen.readableResources: get on CloudNativePG Clusters, and no more.
				{"get", "postgresql.cnpg.io", "clusters", "shop", "orders-db", true},
				{"list", "postgresql.cnpg.io", "clusters", "shop", "", false},
				{"get", "postgresql.cnpg.io", "backups", "shop", "orders-db", false},
				{"list", "", "secrets", "ops", "", false},
				{"update", admission, "mutatingwebhookconfigurations", "", "team-subflow-mutating-webhook-configuration", false},
				{"list", admission, "validatingwebhookconfigurations", "", "", false},
			},
		}
		for user, accesses := range checks {
			namespace := strings.Split(user, ":")[2]
			for _, a := range accesses {
				resource, subresource, _ := strings.Cut(a.resource, "/")
				review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
					User:   user,
					Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
					ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: a.namespace, Verb: a.verb, Group: a.group,
						Resource: resource, Subresource: subresource, Name: a.name},
				}}
				if err := k8s.Create(ctx, review); err != nil {
					t.Fatal(err)
				}
				if review.Status.Allowed != a.allowed {
					t.Errorf("%s: %s %s.%s %q in %q: allowed %v, want %v (%s)", user, a.verb, a.resource, a.group, a.name,
						a.namespace, review.Status.Allowed, a.allowed, review.Status.Reason)
				}
			}
		}
	})
}

// withoutTestHooks leaves out what helm install does not create (helm.sh/hook: test) and
// returns the rest as one manifest.
func withoutTestHooks(t *testing.T, objs []*unstructured.Unstructured) ([]*unstructured.Unstructured, string) {
	t.Helper()
	var kept []*unstructured.Unstructured
	var manifest strings.Builder
	for _, o := range objs {
		if o.GetAnnotations()["helm.sh/hook"] == "test" {
			continue
		}
		data, err := yaml.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		kept = append(kept, o)
		manifest.WriteString("---\n")
		manifest.Write(data)
	}
	return kept, manifest.String()
}

// checkAggregation: Kubernetes' own view, edit and admin ClusterRoles (bootstrapped by the API
// server) aggregate the chart's view and edit roles. envtest runs no controller manager, which
// does the aggregating, so the test checks their selectors against the roles' labels.
func checkAggregation(t *testing.T, k8s client.Client, release string) {
	t.Helper()
	ctx := context.Background()
	want := map[string][]string{"view": {release + "-view"}, "edit": {release + "-edit"}, "admin": {release + "-edit"}}
	for builtin, roles := range want {
		cr := &rbacv1.ClusterRole{}
		if err := k8s.Get(ctx, client.ObjectKey{Name: builtin}, cr); err != nil {
			t.Fatal(err)
		}
		if cr.AggregationRule == nil {
			t.Fatalf("ClusterRole %s has no aggregationRule", builtin)
		}
		var aggregated []string
		var all rbacv1.ClusterRoleList
		if err := k8s.List(ctx, &all); err != nil {
			t.Fatal(err)
		}
		for _, role := range all.Items {
			for _, s := range cr.AggregationRule.ClusterRoleSelectors {
				selector, err := metav1.LabelSelectorAsSelector(&s)
				if err != nil {
					t.Fatal(err)
				}
				if strings.HasPrefix(role.Name, release+"-") && selector.Matches(labels.Set(role.Labels)) {
					aggregated = append(aggregated, role.Name)
				}
			}
		}
		if !slices.Equal(aggregated, roles) {
			t.Errorf("Kubernetes' ClusterRole %s aggregates %v of release %s, want %v", builtin, aggregated, release, roles)
		}
	}
}

// checkControllerSecretCreates creates Secrets as the controller's ServiceAccount user (of the
// namespace namespace): once the release's policy is in force, another name, a service-account
// token Secret and the service-account annotations are refused, and the agent-token Secret as
// controllers/token.go creates it is stored.
func checkControllerSecretCreates(t *testing.T, cfg *rest.Config, admin client.Client, user, namespace string) {
	ctx := context.Background()
	as := rest.CopyConfig(cfg)
	as.Impersonate = rest.ImpersonationConfig{UserName: user,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"}}
	controller, err := client.New(as, client.Options{Scheme: admin.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	fresh := func() string {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "secrets-"}}
		if err := admin.Create(ctx, ns); err != nil {
			t.Fatal(err)
		}
		return ns.Name
	}
	secret := func(name string, typ corev1.SecretType, annotations map[string]string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: fresh(), Name: name, Annotations: annotations,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "subflow", "subflow.dev/agent-token": "true"}},
			Type: typ, Data: map[string][]byte{"token": []byte("a-token")}}
	}
	const (
		refusedName        = "the subflow controller creates only the Secret subflow-agent-token"
		refusedType        = "the subflow controller creates only Secrets of type Opaque"
		refusedAnnotations = "the subflow controller creates no Secret with a service-account annotation"
	)
	// In force a moment after it is created: wait for a refusal (a dry run stores nothing).
	probe := secret("probe", "", nil)
	var last error
	if !(testkit.Poll{Within: 30 * time.Second, Every: 50 * time.Millisecond}).Until(func() bool {
		last = controller.Create(ctx, probe.DeepCopy(), client.DryRunAll)
		return last != nil && strings.Contains(last.Error(), refusedName)
	}) {
		t.Errorf("%s: a Secret named probe was not refused within 30s (last answer: %v)", user, last)
	}
	saName := map[string]string{corev1.ServiceAccountNameKey: "default"}
	for _, c := range []struct {
		secret *corev1.Secret
		refuse string
	}{
		{secret("db-password", "", nil), refusedName},
		{secret("subflow-agent-token", corev1.SecretTypeServiceAccountToken, saName), refusedType},
		{secret("subflow-agent-token", corev1.SecretTypeOpaque, saName), refusedAnnotations},
		{secret("subflow-agent-token", "", map[string]string{corev1.ServiceAccountUIDKey: "0b4e6a1c-2f0e-4a57-9d8b-7d7d1c0f3e21"}), refusedAnnotations},
		{secret("subflow-agent-token", "", nil), ""},
	} {
		err := controller.Create(ctx, c.secret)
		what := fmt.Sprintf("%s/%s (type %s, annotations %v)", c.secret.Namespace, c.secret.Name, c.secret.Type, c.secret.Annotations)
		switch {
		case c.refuse == "" && err != nil:
			t.Errorf("%s could not create %s: %v", user, what, err)
		case c.refuse != "" && err == nil:
			t.Errorf("%s created %s, want it refused with %q", user, what, c.refuse)
		case c.refuse != "" && !strings.Contains(err.Error(), c.refuse):
			t.Errorf("%s: %s refused with %v, want %q", user, what, err, c.refuse)
		}
	}
}
