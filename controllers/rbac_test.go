package controllers_test

import (
	"cmp"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/resource"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/subflow-dev/subflow/controllers"
	"github.com/subflow-dev/subflow/internal/testing/testenv"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// The controller's identity as config/default deploys it.
const (
	controllerNamespace = "subflow-system"
	controllerSA        = "subflow-controller"
	controllerUser      = "system:serviceaccount:" + controllerNamespace + ":" + controllerSA
)

// applyControllerRBAC renders config/default as kubectl kustomize does and creates its
// namespace, ServiceAccount, RBAC objects and the admission policy on the controller's Secret
// creates, so that the manager under test runs with exactly the permissions and limits a
// deployment sets.
func applyControllerRBAC(ctx context.Context, admin client.Client) error {
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(),
		filepath.Join(testenv.RepoRoot(), "config", "default"))
	if err != nil {
		return fmt.Errorf("kustomize config/default: %w", err)
	}
	// In dependency order: the namespace before what lives in it.
	for _, kind := range []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
		"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		if err := createKind(ctx, admin, resources.Resources(), kind); err != nil {
			return err
		}
	}
	return nil
}

func createKind(ctx context.Context, admin client.Client, resources []*resource.Resource, kind string) error {
	for _, r := range resources {
		if r.GetKind() != kind {
			continue
		}
		m, err := r.Map()
		if err != nil {
			return err
		}
		obj := &unstructured.Unstructured{Object: m}
		if err := admin.Create(ctx, obj); err != nil {
			return fmt.Errorf("creating %s %s: %w", r.GetKind(), r.GetName(), err)
		}
	}
	return nil
}

// asController returns cfg impersonating the controller's ServiceAccount.
func asController(cfg *rest.Config) *rest.Config {
	out := rest.CopyConfig(cfg)
	out.Impersonate = rest.ImpersonationConfig{UserName: controllerUser,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + controllerNamespace, "system:authenticated"}}
	return out
}

// TestControllerPermissionsAreNarrow: the whole suite runs the manager as the controller's
// ServiceAccount, so a missing permission fails the other tests; this one shows that what the
// code does not need is not granted. Each row says what needs the grant, or why it is refused.
func TestControllerPermissionsAreNarrow(t *testing.T) {
	ns := namespace(t, true)
	const cluster = "(cluster)" // a cluster-scoped resource; an empty namespace means the test's
	tests := []struct {
		verb, group, resource, subresource, name string
		namespace                                string
		allowed                                  bool
		why                                      string
	}{
		// The agents' token (controllers/token.go).
		{"get", "", "secrets", "", "subflow-agent-token", "", true, "readToken reads the namespace's agent token, uncached, by name"},
		{"create", "", "secrets", "", "", "", true, "createToken makes a missing subflow-agent-token; the API cannot narrow create by name, the admission policy does"},
		{"get", "", "secrets", "", "db-password", "", false, "no Secret but the agent token is read"},
		{"list", "", "secrets", "", "", "", false, "Secrets are not cached"},
		{"watch", "", "secrets", "", "", "", false, "Secrets are not cached"},
		{"update", "", "secrets", "", "subflow-agent-token", "", false, "the token Secret is never rewritten"},
		// Flows.
		{"get", "subflow.dev", "subscriptionflows", "", "", "", true, "the cache's informer and Reconcile's Get"},
		{"list", "subflow.dev", "subscriptionflows", "", "", "", true, "the cache's informer; pod events map to the flows of their namespace"},
		{"watch", "subflow.dev", "subscriptionflows", "", "", "", true, "the cache's informer"},
		{"patch", "subflow.dev", "subscriptionflows", "", "", "", true, "patchFinalizer adds and removes the finalizer"},
		{"update", "subflow.dev", "subscriptionflows", "", "", "", false, "the finalizer is patched, never updated"},
		{"create", "subflow.dev", "subscriptionflows", "", "", "", false, "flows are people's"},
		{"delete", "subflow.dev", "subscriptionflows", "", "", "", false, "flows are people's"},
		{"patch", "subflow.dev", "subscriptionflows", "status", "", "", true, "the one status patch per reconcile"},
		{"get", "subflow.dev", "subscriptionflows", "status", "", "", false, "status is read with the flow"},
		{"update", "subflow.dev", "subscriptionflows", "status", "", "", false, "status is patched, never updated"},
		{"update", "subflow.dev", "subscriptionflows", "finalizers", "", "", false, "dropped: the finalizer is set by a patch of the flow, and nothing the controller creates has an ownerReference that blocks a flow's deletion"},
		// Pods: read from the cache only.
		{"list", "", "pods", "", "", "", true, "the cache's pod informer (matched pods, holders)"},
		{"watch", "", "pods", "", "", "", true, "the cache's pod informer"},
		{"get", "", "pods", "", "", "", false, "dropped: every pod Get is served by the cache, none by an uncached reader"},
		{"update", "", "pods", "", "", "", false, "pods are never changed"},
		{"create", "", "pods", "", "", "", false, "pods are never created"},
		{"create", "", "configmaps", "", "", "", false, "no ConfigMap is written"},
		// spec.pauseWhen's kubernetes conditions (controllers/pausewhen.go).
		{"get", "apps", "deployments", "", "", "", true, "a kubernetes condition reads the Deployment it names, uncached"},
		{"get", "apps", "statefulsets", "", "", "", true, "a kubernetes condition reads the StatefulSet it names, uncached"},
		{"list", "apps", "deployments", "", "", "", false, "conditions read one object by name"},
		{"update", "apps", "deployments", "", "", "", false, "conditions only read"},
		// Events.
		{"create", "events.k8s.io", "events", "", "", "", true, "the flows' events (Paused, Resumed, SeekCompleted...)"},
		{"patch", "events.k8s.io", "events", "", "", "", true, "the event recorder counts a repeated event by a patch"},
		// Leader election, in the controller's own namespace only.
		{"update", "coordination.k8s.io", "leases", "", "", controllerNamespace, true, "the leader's Lease"},
		{"update", "coordination.k8s.io", "leases", "", "", "", false, "Leases in the controller's namespace only"},
		// The webhooks: the namespace's sidecar configuration, by name only.
		{"get", "", "configmaps", "", "subflow", "", true, "the pod webhook reads the namespace's ConfigMap subflow, uncached"},
		{"get", "", "configmaps", "", "other", "", false, "no other ConfigMap is read"},
		{"list", "", "configmaps", "", "", "", false, "ConfigMaps are not cached"},
		// The self-managed certificates: the controller's own Secret and its own two webhook
		// configurations, updated by name only.
		{"update", "", "secrets", "", "subflow-webhook-server-cert", controllerNamespace, true, "the certificate rotation writes its Secret"},
		{"update", "", "secrets", "", "other", controllerNamespace, false, "no other Secret is written"},
		{"update", "", "secrets", "", "subflow-webhook-server-cert", "", false, "the certificate's Secret lives in the controller's namespace only"},
		{"update", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "subflow-mutating-webhook-configuration", cluster, true, "the rotation writes the caBundle"},
		{"update", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "other", cluster, false, "only subflow's own webhook configurations"},
		{"update", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", "subflow-validating-webhook-configuration", cluster, true, "the rotation writes the caBundle"},
		{"delete", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "subflow-mutating-webhook-configuration", cluster, false, "never deleted"},
		{"create", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "", cluster, false, "never created"},
		{"delete", "admissionregistration.k8s.io", "validatingadmissionpolicybindings", "", "subflow-controller-secrets", cluster, false, "the controller cannot lift the policy on its own Secret creates"},
	}
	for _, tt := range tests {
		resource := strings.TrimSuffix(tt.resource+"/"+tt.subresource, "/")
		name := fmt.Sprintf("%s %s %s in %s: %s", tt.verb, resource, tt.name, cmp.Or(tt.namespace, "a namespace"), tt.why)
		namespace := cmp.Or(tt.namespace, ns)
		if namespace == cluster {
			namespace = ""
		}
		t.Run(name, func(t *testing.T) {
			review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User:   controllerUser,
				Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + controllerNamespace, "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: namespace, Verb: tt.verb, Group: tt.group,
					Resource: tt.resource, Subresource: tt.subresource, Name: tt.name},
			}}
			if err := k8s.Create(context.Background(), review); err != nil {
				t.Fatal(err)
			}
			if review.Status.Allowed != tt.allowed {
				t.Fatalf("allowed = %v, want %v (%s)", review.Status.Allowed, tt.allowed, review.Status.Reason)
			}
		})
	}
}

// The refusals of config/rbac/controller_secrets_policy.yaml, as the API server words them.
const (
	refusedName        = "the subflow controller creates only the Secret subflow-agent-token"
	refusedType        = "the subflow controller creates only Secrets of type Opaque"
	refusedAnnotations = "the subflow controller creates no Secret with a service-account annotation"
)

// TestControllerCreatesOnlyItsAgentTokenSecret: the controller may create Secrets in every
// namespace and read subflow-agent-token back, so its token alone could otherwise get any
// ServiceAccount's credentials: create a service-account token Secret of that name and read what
// the API server fills in. With config/default's admission policy (applied in TestMain) the
// API server refuses the controller's ServiceAccount every Secret but the one controllers/token.go
// creates; other users are not limited.
func TestControllerCreatesOnlyItsAgentTokenSecret(t *testing.T) {
	ctx := context.Background()
	controller, err := client.New(asController(restConfig), client.Options{Scheme: k8s.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	// A policy is in force a moment after it is created: wait until a Secret the controller
	// must not create is refused (a dry run, so that nothing is stored before then).
	probe := namespace(t, false)
	var last error
	if !(testkit.Poll{Within: 30 * time.Second, Every: 50 * time.Millisecond}).Until(func() bool {
		last = controller.Create(ctx, newSecret(probe, "probe", "", nil), client.DryRunAll)
		return last != nil && strings.Contains(last.Error(), refusedName)
	}) {
		t.Errorf("the controller's Secret named probe was not refused within 30s (last answer: %v)", last)
	}

	saToken := map[string]string{corev1.ServiceAccountNameKey: "default"}
	for _, tc := range []struct {
		name   string
		secret func(ns string) *corev1.Secret
		refuse string // empty: created
	}{
		{"another name", func(ns string) *corev1.Secret { return newSecret(ns, "db-password", "", nil) }, refusedName},
		{"a service-account token Secret named subflow-agent-token", func(ns string) *corev1.Secret {
			return newSecret(ns, controllers.DefaultTokenSecret, corev1.SecretTypeServiceAccountToken, saToken)
		}, refusedType},
		{"an Opaque Secret with the service-account name annotation", func(ns string) *corev1.Secret {
			return newSecret(ns, controllers.DefaultTokenSecret, corev1.SecretTypeOpaque, saToken)
		}, refusedAnnotations},
		{"an Opaque Secret with the service-account uid annotation", func(ns string) *corev1.Secret {
			return newSecret(ns, controllers.DefaultTokenSecret, "", map[string]string{corev1.ServiceAccountUIDKey: "0b4e6a1c-2f0e-4a57-9d8b-7d7d1c0f3e21"})
		}, refusedAnnotations},
		{"the agent-token Secret as token.go creates it", func(ns string) *corev1.Secret {
			return newSecret(ns, controllers.DefaultTokenSecret, "", nil)
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			secret := tc.secret(namespace(t, false))
			err := controller.Create(ctx, secret)
			switch {
			case tc.refuse == "" && err != nil:
				t.Fatalf("the controller could not create %s/%s: %v", secret.Namespace, secret.Name, err)
			case tc.refuse != "" && err == nil:
				t.Fatalf("the controller created %s/%s (type %s, annotations %v), want it refused with %q",
					secret.Namespace, secret.Name, secret.Type, secret.Annotations, tc.refuse)
			case tc.refuse != "" && !strings.Contains(err.Error(), tc.refuse):
				t.Fatalf("refused with %v, want %q", err, tc.refuse)
			case err != nil:
				t.Logf("refused: %v", err)
			}
		})
	}
	t.Run("other users are not limited", func(t *testing.T) {
		if err := k8s.Create(ctx, newSecret(namespace(t, false), "db-password", "", saToken)); err != nil {
			t.Fatal(err)
		}
	})
}

// newSecret is a Secret shaped like the one controllers/token.go creates, with another name, type
// or annotations.
func newSecret(namespace, name string, typ corev1.SecretType, annotations map[string]string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Annotations: annotations,
		Labels: map[string]string{"app.kubernetes.io/managed-by": "subflow", controllers.TokenSecretLabel: "true"}},
		Type: typ, Data: map[string][]byte{controllers.DefaultTokenKey: []byte("a-token")}}
}
