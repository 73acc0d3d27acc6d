// Package config holds the deployable manifests; its test renders them as `kubectl kustomize` would.
package config

import (
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

func TestDefaultOverlayRenders(t *testing.T) {
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), "default")
	if err != nil {
		t.Fatalf("kustomize config/default: %v", err)
	}
	want := map[string]string{
		"CustomResourceDefinition": "subscriptionflows.subflow.dev",
		"Deployment":               "subflow-controller",
		"ClusterRole":              "subflow-manager-role",
		"ClusterRoleBinding":       "subflow-manager-rolebinding",
		"Role":                     "subflow-leader-election-role",
		"ServiceAccount":           "subflow-controller",
		"Namespace":                "subflow-system",
	}
	for _, r := range resources.Resources() {
		if want[r.GetKind()] == r.GetName() {
			delete(want, r.GetKind())
		}
		if r.GetKind() != "Namespace" && r.GetKind() != "CustomResourceDefinition" &&
			r.GetKind() != "ClusterRole" && r.GetKind() != "ClusterRoleBinding" && r.GetNamespace() != "subflow-system" {
			t.Errorf("%s/%s rendered in namespace %q, want subflow-system", r.GetKind(), r.GetName(), r.GetNamespace())
		}
	}
	for kind, name := range want {
		t.Errorf("config/default does not render %s %s", kind, name)
	}
}
