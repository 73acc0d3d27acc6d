package charts

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestPermissionsMatchConfig: installed as release subflow in subflow-system, the chart grants
// exactly what config/default grants (self-managed certificates), and with webhook.certs
// cert-manager exactly what config/cert-manager grants: the same roles, each with the same
// permissions (compared verb by verb, resource by resource, name by name, however the rules are
// grouped), bound to the same subjects.
func TestPermissionsMatchConfig(t *testing.T) {
	for _, tc := range []struct {
		overlay string
		values  []string
	}{
		{"default", nil},
		{"cert-manager", []string{"webhook.certs=cert-manager"}},
	} {
		t.Run(tc.overlay, func(t *testing.T) {
			chart := permissions(t, render(t, "subflow", "subflow-system", tc.values...))
			config := permissions(t, kustomize(t, tc.overlay))
			for key := range union(chart, config) {
				if !chart[key] {
					t.Errorf("config/%s grants, the chart does not: %s", tc.overlay, key)
				}
				if !config[key] {
					t.Errorf("the chart grants, config/%s does not: %s", tc.overlay, key)
				}
			}
			if len(chart) == 0 {
				t.Fatal("the chart grants nothing")
			}
		})
	}
}

// permissions lists every role's single permissions ("ClusterRole subflow-manager-role: get
// secrets subflow-agent-token") and every binding ("ClusterRoleBinding x: ClusterRole y to
// ServiceAccount ns/name").
func permissions(t *testing.T, objs []*unstructured.Unstructured) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, o := range objs {
		role := o.GetKind() + " " + qualified(o.GetNamespace(), o.GetName())
		switch o.GetKind() {
		case "ClusterRole", "Role":
			rules, _, err := unstructured.NestedSlice(o.Object, "rules")
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rules {
				rule := r.(map[string]any)
				for _, verb := range strs(rule["verbs"]) {
					for _, url := range strs(rule["nonResourceURLs"]) {
						out[fmt.Sprintf("%s: %s %s", role, verb, url)] = true
					}
					for _, group := range strs(rule["apiGroups"]) {
						for _, resource := range strs(rule["resources"]) {
							names := strs(rule["resourceNames"])
							if len(names) == 0 {
								names = []string{"*"}
							}
							for _, name := range names {
								out[fmt.Sprintf("%s: %s %s.%s %s", role, verb, resource, group, name)] = true
							}
						}
					}
				}
			}
			if _, ok := o.Object["aggregationRule"]; ok {
				out[role+": aggregationRule "+toJSON(t, o.Object["aggregationRule"])] = true
			}
			// Aggregated into Kubernetes' view, edit or admin: the label grants as much as the rules.
			for k, v := range o.GetLabels() {
				if strings.HasPrefix(k, "rbac.authorization.k8s.io/aggregate-to-") {
					out[fmt.Sprintf("%s: label %s=%s", role, k, v)] = true
				}
			}
		case "ClusterRoleBinding", "RoleBinding":
			roleRef, _, _ := unstructured.NestedStringMap(o.Object, "roleRef")
			subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
			for _, s := range subjects {
				subject := s.(map[string]any)
				out[fmt.Sprintf("%s: %s %s to %s %s", role, roleRef["kind"], roleRef["name"], subject["kind"],
					qualified(fmt.Sprint(subject["namespace"]), fmt.Sprint(subject["name"])))] = true
			}
		}
	}
	return out
}

func qualified(namespace, name string) string {
	if namespace == "" || namespace == "<nil>" {
		return name
	}
	return namespace + "/" + name
}

func strs(v any) []string {
	list, _ := v.([]any)
	out := make([]string, 0, len(list))
	for _, s := range list {
		out = append(out, fmt.Sprint(s))
	}
	sort.Strings(out)
	return out
}

func union(a, b map[string]bool) map[string]bool {
	out := map[string]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}
