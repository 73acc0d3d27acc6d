// Package config holds the deployable manifests; its test renders them as `kubectl kustomize` would.
package config

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/resmap"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// clusterScoped are the kinds config/ renders outside subflow-system.
var clusterScoped = map[string]bool{"Namespace": true, "CustomResourceDefinition": true, "ClusterRole": true,
	"ClusterRoleBinding": true, "MutatingWebhookConfiguration": true, "ValidatingWebhookConfiguration": true,
	"ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true}

func TestDefaultOverlayRenders(t *testing.T) {
	checkOverlay(t, "default", map[string]string{"Secret": "subflow-webhook-server-cert"})
}

// TestCertManagerOverlayRenders: the same installation with cert-manager's Issuer and Certificate
// instead of the self-managed Secret, and its CA injected into both webhook configurations.
func TestCertManagerOverlayRenders(t *testing.T) {
	resources := checkOverlay(t, "cert-manager", map[string]string{"Issuer": "subflow-selfsigned-issuer", "Certificate": "subflow-serving-cert"})
	for _, r := range resources.Resources() {
		if r.GetKind() == "Secret" {
			t.Errorf("config/cert-manager renders Secret %s: cert-manager creates the serving certificate's Secret", r.GetName())
		}
		if clusterScoped[r.GetKind()] && (r.GetKind() == "MutatingWebhookConfiguration" || r.GetKind() == "ValidatingWebhookConfiguration") {
			if got := r.GetAnnotations()["cert-manager.io/inject-ca-from"]; got != "subflow-system/subflow-serving-cert" {
				t.Errorf("%s %s: cert-manager.io/inject-ca-from = %q, want subflow-system/subflow-serving-cert", r.GetKind(), r.GetName(), got)
			}
		}
	}
}

func checkOverlay(t *testing.T, dir string, extra map[string]string) resmap.ResMap {
	t.Helper()
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize config/%s: %v", dir, err)
	}
	want := map[string]string{
		"MutatingWebhookConfiguration/subflow-mutating-webhook-configuration":     "",
		"ValidatingWebhookConfiguration/subflow-validating-webhook-configuration": "",
		"Service/subflow-webhook-service":                                         "",
		"Service/subflow-controller-metrics":                                      "",
		"CustomResourceDefinition/subscriptionflows.subflow.dev":                  "",
		"Deployment/subflow-controller":                                           "",
		"ClusterRole/subflow-manager-role":                                        "",
		"ClusterRole/subflow-metrics-reader":                                      "",
		"ClusterRoleBinding/subflow-manager-rolebinding":                          "",
		"Role/subflow-leader-election-role":                                       "",
		"ServiceAccount/subflow-controller":                                       "",
		"ValidatingAdmissionPolicy/subflow-controller-secrets":                    "",
		"ValidatingAdmissionPolicyBinding/subflow-controller-secrets":             "",
		"Namespace/subflow-system":                                                "",
	}
	for kind, name := range extra {
		want[kind+"/"+name] = ""
	}
	for _, r := range resources.Resources() {
		delete(want, r.GetKind()+"/"+r.GetName())
		if !clusterScoped[r.GetKind()] && r.GetNamespace() != "subflow-system" {
			t.Errorf("%s/%s rendered in namespace %q, want subflow-system", r.GetKind(), r.GetName(), r.GetNamespace())
		}
		if clusterScoped[r.GetKind()] && r.GetNamespace() != "" {
			t.Errorf("%s/%s is cluster-scoped but rendered in namespace %q", r.GetKind(), r.GetName(), r.GetNamespace())
		}
	}
	for missing := range want {
		t.Errorf("config/%s does not render %s", dir, missing)
	}
	return resources
}

// TestWebhooksFailOpen: neither webhook can stop a pod from being created or a pause from being
// written, in either overlay; only labelled pods are sent, and a pod may be sent again.
func TestWebhooksFailOpen(t *testing.T) {
	for _, dir := range []string{"default", "cert-manager"} {
		resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
		if err != nil {
			t.Fatalf("kustomize config/%s: %v", dir, err)
		}
		seen := 0
		for _, r := range resources.Resources() {
			if r.GetKind() != "MutatingWebhookConfiguration" && r.GetKind() != "ValidatingWebhookConfiguration" {
				continue
			}
			m, err := r.Map()
			if err != nil {
				t.Fatal(err)
			}
			hooks, _ := m["webhooks"].([]any)
			for _, h := range hooks {
				seen++
				hook := h.(map[string]any)
				if hook["failurePolicy"] != "Ignore" || hook["sideEffects"] != "None" {
					t.Errorf("config/%s %s: failurePolicy %v sideEffects %v, want Ignore and None", dir, hook["name"], hook["failurePolicy"], hook["sideEffects"])
				}
				if s, _ := hook["timeoutSeconds"].(int); s < 1 || s > 5 {
					t.Errorf("config/%s %s: timeoutSeconds %v, want 1 to 5", dir, hook["name"], hook["timeoutSeconds"])
				}
				if r.GetKind() == "MutatingWebhookConfiguration" {
					selector := fmt.Sprint(hook["objectSelector"])
					if hook["reinvocationPolicy"] != "IfNeeded" || !strings.Contains(selector, "subflow.dev/inject") || !strings.Contains(selector, "Exists") {
						t.Errorf("config/%s %s: reinvocationPolicy %v objectSelector %s, want IfNeeded and subflow.dev/inject Exists", dir, hook["name"], hook["reinvocationPolicy"], selector)
					}
				}
			}
		}
		if seen != 2 {
			t.Errorf("config/%s renders %d webhooks, want 2", dir, seen)
		}
	}
}

// TestMetricsServiceReachesTheController: the metrics Service selects the controller's pods
// and targets a port the controller container declares.
func TestMetricsServiceReachesTheController(t *testing.T) {
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), "default")
	if err != nil {
		t.Fatal(err)
	}
	var selector, podLabels map[string]any
	var target any
	var ports []any
	for _, r := range resources.Resources() {
		m, err := r.Map()
		if err != nil {
			t.Fatal(err)
		}
		switch r.GetKind() + "/" + r.GetName() {
		case "Service/subflow-controller-metrics":
			spec := m["spec"].(map[string]any)
			selector = spec["selector"].(map[string]any)
			target = spec["ports"].([]any)[0].(map[string]any)["targetPort"]
		case "Deployment/subflow-controller":
			tmpl := m["spec"].(map[string]any)["template"].(map[string]any)
			podLabels = tmpl["metadata"].(map[string]any)["labels"].(map[string]any)
			ports = tmpl["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)["ports"].([]any)
		}
	}
	for k, v := range selector {
		if podLabels[k] != v {
			t.Errorf("the metrics Service selects %s=%v; the controller's pods have %v", k, v, podLabels[k])
		}
	}
	found := false
	for _, p := range ports {
		found = found || p.(map[string]any)["name"] == target
	}
	if len(selector) == 0 || !found {
		t.Errorf("the metrics Service (selector %v) targets port %v, which the controller (ports %v) does not name", selector, target, ports)
	}
}

// TestSecretsPolicyNamesTheController: in both overlays the admission policy on Secret creates
// applies to the user of the ServiceAccount the overlay renders and the Deployment runs as (its
// expression names it literally: kustomize cannot write into a CEL string), refuses when it
// cannot evaluate, and is bound to deny.
func TestSecretsPolicyNamesTheController(t *testing.T) {
	for _, dir := range []string{"default", "cert-manager"} {
		resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
		if err != nil {
			t.Fatalf("kustomize config/%s: %v", dir, err)
		}
		objs := map[string]map[string]any{}
		var accounts []string
		for _, r := range resources.Resources() {
			m, err := r.Map()
			if err != nil {
				t.Fatal(err)
			}
			objs[r.GetKind()] = m
			if r.GetKind() == "ServiceAccount" {
				accounts = append(accounts, r.GetNamespace()+":"+r.GetName())
			}
		}
		policy, binding, deployment := objs["ValidatingAdmissionPolicy"], objs["ValidatingAdmissionPolicyBinding"], objs["Deployment"]
		if policy == nil || binding == nil || deployment == nil || len(accounts) != 1 {
			t.Fatalf("config/%s: policy %v, binding %v, Deployment %v, ServiceAccounts %v", dir, policy != nil, binding != nil, deployment != nil, accounts)
		}
		ns, _, _ := unstructured.NestedString(deployment, "metadata", "namespace")
		runsAs, _, _ := unstructured.NestedString(deployment, "spec", "template", "spec", "serviceAccountName")
		if accounts[0] != ns+":"+runsAs {
			t.Errorf("config/%s: the controller runs as %s:%s, the ServiceAccount rendered is %s", dir, ns, runsAs, accounts[0])
		}
		conditions, _, _ := unstructured.NestedSlice(policy, "spec", "matchConditions")
		want := "request.userInfo.username == 'system:serviceaccount:" + accounts[0] + "'"
		if len(conditions) != 1 || conditions[0].(map[string]any)["expression"] != want {
			t.Errorf("config/%s: the policy's matchConditions are %v, want the one expression %s", dir, conditions, want)
		}
		name, _, _ := unstructured.NestedString(policy, "metadata", "name")
		bound, _, _ := unstructured.NestedString(binding, "spec", "policyName")
		actions, _, _ := unstructured.NestedStringSlice(binding, "spec", "validationActions")
		failure, _, _ := unstructured.NestedString(policy, "spec", "failurePolicy")
		if bound != name || fmt.Sprint(actions) != "[Deny]" || failure != "Fail" {
			t.Errorf("config/%s: binding of %q with %v to policy %q with failurePolicy %q, want Deny, the policy's name and Fail", dir, bound, actions, name, failure)
		}
	}
}
