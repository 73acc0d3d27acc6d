package main

import (
	"bytes"
	"context"
	"regexp"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// version names the plugin's version, the controller's from its Deployment's image, and counts
// the pods per agent version the flows reported, each pod once.
func TestVersionNamesPluginControllerAndAgents(t *testing.T) {
	ctx := context.Background()
	system := namespace(t, "version-system")
	ns := namespace(t, "version-flows")
	labels := map[string]string{componentLabel: "controller", partOfLabel: "subflow", nameLabel: "subflow",
		"app.kubernetes.io/instance": "subflow"}
	controller := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: system, Name: "subflow-controller", Labels: labels},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{
				{Name: "kube-rbac-proxy", Image: "kube-rbac-proxy:v0.18.0"},
				{Name: "manager", Image: "localhost:5000/subflow-controller:v0.4.1"},
			}}}},
	}
	if err := k8s.Create(ctx, controller); err != nil {
		t.Fatal(err)
	}
	controller.Status.Replicas, controller.Status.ReadyReplicas = 2, 1
	if err := k8s.Status().Update(ctx, controller); err != nil {
		t.Fatal(err)
	}
	agent := func(pod, version, kind string, protocol int32) subflowv1.AgentStatus {
		return subflowv1.AgentStatus{Pod: pod, AgentVersion: version, Kind: kind, ProtocolVersion: protocol, State: "Running"}
	}
	newFlow(t, ns, "orders", nil)
	setStatus(t, ns, "orders", func(f *subflowv1.SubscriptionFlow) {
		f.Status.Agents = []subflowv1.AgentStatus{agent("orders-0", "v0.4.1", "sidecar", 2), agent("orders-1", "v0.4.1", "sidecar", 2),
			agent("shared-0", "v0.3.0", "agent", 1), {Pod: "orders-2", State: "Unreachable"}}
	})
	newFlow(t, ns, "audit", nil) // selects shared-0 too: counted once
	setStatus(t, ns, "audit", func(f *subflowv1.SubscriptionFlow) {
		f.Status.Agents = []subflowv1.AgentStatus{agent("shared-0", "v0.3.0", "agent", 1), agent("audit-0", "(devel) 3f2a1b", "agent", 2)}
	})
	newFlow(t, ns, "fresh", nil) // not reconciled yet: no agents

	out := mustSucceed(t, "version", "-n", ns).stdout
	want := `^Plugin:     \S.*\n` +
		`Controller: v0.4.1 \(image localhost:5000/subflow-controller:v0.4.1; Deployment version-system/subflow-controller, 1/2 replicas ready\)\n` +
		`Agents:     5 pods in 3 flows in namespace version-flows\n` +
		`  VERSION +KIND +PROTOCOL +PODS +FLOWS\n` +
		`  v0.4.1 +sidecar +2 +2 +1\n` +
		`  \(devel\)-3f2a1b +agent +2 +1 +1\n` +
		`  v0.3.0 +agent +1 +1 +2\n` +
		`  - +- +- +1 +1\n$`
	if !regexp.MustCompile(want).MatchString(out) {
		t.Errorf("version:\n%s\nwant to match\n%s", out, want)
	}

	// Elsewhere: no controller there, and no flow.
	empty := namespace(t, "version-empty")
	out = mustSucceed(t, "version", "-n", empty, "--controller-namespace", empty).stdout
	want = `^Plugin:     \S.*\n` +
		`Controller: not found: no Deployment in namespace version-empty is labelled app.kubernetes.io/component=controller and ` +
		`app.kubernetes.io/part-of=subflow or app.kubernetes.io/name=subflow \(is subflow installed, or in a namespace you may not read\?\)\n` +
		`Agents:     0 pods in 0 flows in namespace version-empty\n$`
	if !regexp.MustCompile(want).MatchString(out) {
		t.Errorf("version where there is no controller:\n%s\nwant to match\n%s", out, want)
	}
}

// An on-call engineer who may read flows in one namespace but no Deployment still sees the
// plugin's and the agents' versions, and why the controller's is unknown.
func TestVersionWithoutRightsOnDeployments(t *testing.T) {
	ns := namespace(t, "version-rbac")
	newFlow(t, ns, "orders", nil)
	setStatus(t, ns, "orders", func(f *subflowv1.SubscriptionFlow) {
		f.Status.Agents = []subflowv1.AgentStatus{{Pod: "orders-0", AgentVersion: "v0.4.1", Kind: "sidecar", ProtocolVersion: 2}}
	})
	user := "version-reader"
	bindInNamespace(t, ns, user, rbacv1.PolicyRule{APIGroups: []string{subflowv1.GroupVersion.Group}, Resources: []string{"subscriptionflows"},
		Verbs: []string{"get", "list"}})

	var r result
	testkit.Eventually(t, 10*time.Second, user+" may list flows", func() bool {
		r = subflow("version", "-n", ns, "--as", user)
		return r.code == 0
	})
	want := `^Plugin:     \S.*\n` +
		`Controller: unknown: you may not list Deployments in any namespace \(give --controller-namespace with the controller's namespace\)\n` +
		`Agents:     1 pod in 1 flow in namespace version-rbac\n` +
		`  VERSION +KIND +PROTOCOL +PODS +FLOWS\n  v0.4.1 +sidecar +2 +1 +1\n$`
	if !regexp.MustCompile(want).MatchString(r.stdout) || r.stderr != "" {
		t.Errorf("version as %s: %s\nwant stdout to match\n%s", user, r, want)
	}
}

// bindInNamespace grants user the rule in namespace ns only.
func bindInNamespace(t *testing.T, ns, user string, rule rbacv1.PolicyRule) {
	t.Helper()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user}, Rules: []rbacv1.PolicyRule{rule}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
	for _, obj := range []client.Object{role, binding} {
		if err := k8s.Create(context.Background(), obj); err != nil {
			t.Fatal(err)
		}
	}
}

// version --client names the plugin's version and reaches no cluster: it succeeds with none.
func TestVersionClientOnly(t *testing.T) {
	var stdout, stderr bytes.Buffer
	version = "v9.9.9"
	defer func() { version = "" }()
	code := run([]string{"version", "--client", "--server", "https://127.0.0.1:1"}, &stdout, &stderr)
	if code != 0 || stdout.String() != "Plugin:     v9.9.9\n" || stderr.Len() != 0 {
		t.Errorf("version --client without a cluster: exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
}

func TestVersionOfABuild(t *testing.T) {
	var stdout, stderr bytes.Buffer
	version = "v9.9.9"
	defer func() { version = "" }()
	run([]string{"version", "--server", "https://127.0.0.1:1"}, &stdout, &stderr)
	if stdout.String() != "Plugin:     v9.9.9\n" {
		t.Errorf("version of a release build: stdout %q, stderr %q", stdout.String(), stderr.String())
	}
}
