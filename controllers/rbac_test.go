package controllers_test

import (
	"cmp"
	"context"
	"fmt"
	"path/filepath"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/resource"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/subflow-dev/subflow/internal/testenv"
)

// The controller's identity as config/default deploys it.
const (
	controllerNamespace = "subflow-system"
	controllerSA        = "subflow-controller"
	controllerUser      = "system:serviceaccount:" + controllerNamespace + ":" + controllerSA
)

// applyControllerRBAC renders config/default as kubectl kustomize does and creates its
// namespace, ServiceAccount and RBAC objects, so that the manager under test runs with exactly
// the permissions a deployment grants.
func applyControllerRBAC(ctx context.Context, admin client.Client) error {
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(),
		filepath.Join(testenv.RepoRoot(), "config", "default"))
	if err != nil {
		return fmt.Errorf("kustomize config/default: %w", err)
	}
	// In dependency order: the namespace before what lives in it.
	for _, kind := range []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"} {
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
// code does not need is not granted.
func TestControllerPermissionsAreNarrow(t *testing.T) {
	ns := namespace(t, true)
	const cluster = "(cluster)" // a cluster-scoped resource; an empty namespace means the test's
	tests := []struct {
		verb, group, resource, subresource, name string
		namespace                                string
		allowed                                  bool
	}{
		{"get", "", "secrets", "", "subflow-agent-token", "", true},
		{"create", "", "secrets", "", "", "", true},
		{"get", "", "secrets", "", "db-password", "", false},
		{"list", "", "secrets", "", "", "", false},
		{"watch", "", "secrets", "", "", "", false},
		{"update", "", "secrets", "", "subflow-agent-token", "", false},
		{"patch", "subflow.dev", "subscriptionflows", "", "", "", true},
		{"update", "subflow.dev", "subscriptionflows", "", "", "", false},
		{"create", "subflow.dev", "subscriptionflows", "", "", "", false},
		{"delete", "subflow.dev", "subscriptionflows", "", "", "", false},
		{"patch", "subflow.dev", "subscriptionflows", "status", "", "", true},
		{"get", "subflow.dev", "subscriptionflows", "status", "", "", false},
		{"update", "subflow.dev", "subscriptionflows", "status", "", "", false},
		{"update", "", "pods", "", "", "", false},
		{"create", "", "pods", "", "", "", false},
		{"create", "", "configmaps", "", "", "", false},
		// The webhooks: the namespace's sidecar configuration, by name only.
		{"get", "", "configmaps", "", "subflow", "", true},
		{"get", "", "configmaps", "", "other", "", false},
		{"list", "", "configmaps", "", "", "", false},
		// The self-managed certificates: the controller's own Secret and its own two webhook
		// configurations, updated by name only.
		{"update", "", "secrets", "", "subflow-webhook-server-cert", controllerNamespace, true},
		{"update", "", "secrets", "", "other", controllerNamespace, false},
		{"update", "", "secrets", "", "subflow-webhook-server-cert", "", false},
		{"update", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "subflow-mutating-webhook-configuration", cluster, true},
		{"update", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "other", cluster, false},
		{"update", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", "subflow-validating-webhook-configuration", cluster, true},
		{"delete", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "subflow-mutating-webhook-configuration", cluster, false},
		{"create", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "", cluster, false},
	}
	for _, tt := range tests {
		name := fmt.Sprintf("%s %s/%s %s %s in %s", tt.verb, tt.resource, tt.subresource, tt.group, tt.name, tt.namespace)
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
