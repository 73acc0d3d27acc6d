package webhooks_test

import (
	"context"
	"fmt"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
)

// TestWebhookPermissionsAreNarrow: the suite's controller runs with config/default's RBAC, so a
// missing permission fails the other tests; this shows that what the webhooks and the
// certificate rotation do not need is not granted.
func TestWebhookPermissionsAreNarrow(t *testing.T) {
	const shop = "shop"
	tests := []struct {
		verb, group, resource, namespace, name string
		allowed                                bool
	}{
		{"get", "", "configmaps", shop, "subflow", true},
		{"get", "", "configmaps", shop, "app-config", false},
		{"list", "", "configmaps", shop, "", false},
		{"update", "", "configmaps", shop, "subflow", false},
		{"update", "", "secrets", controllerNamespace, certSecret, true},
		{"update", "", "secrets", controllerNamespace, "other", false},
		{"create", "", "secrets", controllerNamespace, "", true}, // the agent-token Secret, cluster-wide (controllers)
		{"delete", "", "secrets", controllerNamespace, certSecret, false},
		{"list", "", "secrets", controllerNamespace, "", true},
		{"list", "", "secrets", shop, "", false},
		{"update", "", "secrets", shop, certSecret, false},
		{"update", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", mutatingConfig, true},
		{"update", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", validatingConfig, true},
		{"update", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "istio-sidecar-injector", false},
		{"update", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", mutatingConfig, false},
		{"create", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "", false},
		{"delete", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", validatingConfig, false},
		{"update", "", "pods", shop, "", false},
		{"patch", "", "pods", shop, "", false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s %s %s/%s", tt.verb, tt.resource, tt.namespace, tt.name), func(t *testing.T) {
			review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User:   controllerUser,
				Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + controllerNamespace, "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: tt.namespace, Verb: tt.verb, Group: tt.group,
					Resource: tt.resource, Name: tt.name},
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
