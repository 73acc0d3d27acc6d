package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/testkit"
)

// fleet creates, across two namespaces, three flows labelled db=orders and one db=users, each
// also labelled fleet=prefix so that a test's -A selects its own flows only.
func fleet(t *testing.T, prefix string) (a, b string) {
	t.Helper()
	a, b = namespace(t, prefix+"-a"), namespace(t, prefix+"-b")
	label := func(db string) func(*subflowv1.SubscriptionFlow) {
		return func(f *subflowv1.SubscriptionFlow) { f.Labels = map[string]string{"db": db, "fleet": prefix} }
	}
	newFlow(t, a, "orders", label("orders"))
	newFlow(t, a, "billing", label("orders"))
	newFlow(t, b, "orders", label("orders"))
	newFlow(t, b, "users", label("users"))
	return a, b
}

func overrideOf(t *testing.T, ns, name string) string {
	t.Helper()
	return getFlow(t, ns, name).Annotations[subflowv1.OverrideStateAnnotation]
}

// pause -l ... -A overrides every matching flow in every namespace, and only those, naming
// each; without -A only the namespace's; clear -l removes them; wait -l waits for all of them
// and names the ones not there yet.
func TestFleetSwitchActsOnEveryMatchingFlowAcrossNamespaces(t *testing.T) {
	const prefix = "fleet"
	a, b := fleet(t, prefix)
	r := mustSucceed(t, "pause", "-l", "db=orders,fleet="+prefix, "-A", "--for", "30m", "--reason", "INC-9 failover")
	for _, want := range []string{"subscriptionflow.subflow.dev/billing -n " + a + " paused until ",
		"subscriptionflow.subflow.dev/orders -n " + a + " paused until ", "subscriptionflow.subflow.dev/orders -n " + b + " paused until "} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, r.stdout)
		}
	}
	if n := strings.Count(r.stdout, "\n"); n != 3 {
		t.Errorf("%d lines, want one per changed flow:\n%s", n, r.stdout)
	}
	for _, f := range [][2]string{{a, "orders"}, {a, "billing"}, {b, "orders"}} {
		if got := overrideOf(t, f[0], f[1]); got != "Paused" {
			t.Errorf("%s/%s override %q, want Paused", f[0], f[1], got)
		}
	}
	if got := overrideOf(t, b, "users"); got != "" {
		t.Errorf("the db=users flow got override %q", got)
	}

	mustSucceed(t, "clear", "-l", "db=orders,fleet="+prefix, "-n", a)
	if overrideOf(t, a, "orders") != "" || overrideOf(t, a, "billing") != "" || overrideOf(t, b, "orders") != "Paused" {
		t.Fatal("clear -l -n touched the wrong flows")
	}

	mustSucceed(t, "pause", "-l", "db=orders,fleet="+prefix, "-A")
	setStatus(t, a, "orders", pausedStatus(subflowv1.StatePaused))
	setStatus(t, a, "billing", pausedStatus(subflowv1.StatePaused))
	r = subflow("wait", "-l", "db=orders,fleet="+prefix, "-A", "--for", "paused", "--timeout", "1s")
	if r.code != 1 || !strings.Contains(r.stderr, "1 are not") || !strings.Contains(r.stderr, "orders -n "+b) ||
		strings.Contains(r.stderr, "billing") {
		t.Fatalf("wait with one flow behind: %s", r)
	}
	setStatus(t, b, "orders", pausedStatus(subflowv1.StatePaused))
	if r := mustSucceed(t, "wait", "-l", "db=orders,fleet="+prefix, "-A", "--for", "paused"); !strings.Contains(r.stdout, "3 flows condition met: paused") {
		t.Fatalf("wait: %s", r)
	}
}

// Bad selectors and argument mixes are refused before anything changes; a selector matching
// nothing says so.
func TestFleetSwitchBadInputChangesNothing(t *testing.T) {
	const prefix = "fleetbad"
	a, _ := fleet(t, prefix)
	before := getFlow(t, a, "orders").ResourceVersion
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"pause", "-l", "db in (", "-A"}, `-l "db in (" is not a label selector`},
		{[]string{"pause", "orders", "-l", "db=orders,fleet=" + prefix, "-n", a}, "give NAME or -l SELECTOR, not both"},
		{[]string{"stop", "-A"}, "-A needs -l SELECTOR"},
		{[]string{"resume", "-l", "db=nothing", "-A"}, "no SubscriptionFlow in any namespace matches -l db=nothing: nothing changed"},
		{[]string{"wait", "-l", "db=nothing", "-n", a, "--for", "paused"}, "no SubscriptionFlow in namespace " + a + " matches -l db=nothing"},
	} {
		if r := subflow(tc.args...); r.code != 1 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: %s, want stderr with %q", tc.args, r, tc.want)
		}
	}
	if getFlow(t, a, "orders").ResourceVersion != before {
		t.Fatal("refused input changed a flow")
	}
}

// A user who may patch flows in one namespace but not the other: pause -l -A is refused and
// changes no flow at all, not even those it could patch.
func TestFleetSwitchRBACRefusalChangesNone(t *testing.T) {
	const prefix = "fleetrbac"
	a, b := fleet(t, prefix)
	ctx := context.Background()
	grant := func(obj client.Object) {
		if err := k8s.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	viewer := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "viewer"}}
	grant(&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "fleet-list"}, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{subflowv1.GroupVersion.Group}, Resources: []string{"subscriptionflows"}, Verbs: []string{"get", "list", "watch"}}}})
	grant(&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "fleet-list"}, Subjects: viewer,
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "fleet-list"}})
	grant(&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: a, Name: "fleet-patch"}, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{subflowv1.GroupVersion.Group}, Resources: []string{"subscriptionflows"}, Verbs: []string{"patch"}}}})
	grant(&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: a, Name: "fleet-patch"}, Subjects: viewer,
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "fleet-patch"}})
	asViewer := func(args ...string) result {
		var stdout, stderr bytes.Buffer
		code := run(append(args, "--kubeconfig", viewerKubeconfig), &stdout, &stderr)
		return result{stdout.String(), stderr.String(), code}
	}
	// RBAC takes effect asynchronously in the API server's authorizer cache.
	testkit.Eventually(t, 10*time.Second, "the viewer may patch in "+a, func() bool {
		return asViewer("pause", "-l", "db=orders,fleet="+prefix, "-n", a, "--for", "1m").code == 0
	})
	mustSucceed(t, "clear", "-l", "db=orders,fleet="+prefix, "-n", a)

	r := asViewer("pause", "-l", "db=orders,fleet="+prefix, "-A")
	if r.code != 1 || !strings.Contains(r.stderr, "forbidden") || !strings.Contains(r.stderr, "none of the 3 flows was changed") || r.stdout != "" {
		t.Fatalf("pause -A without rights in %s: %s", b, r)
	}
	for _, f := range [][2]string{{a, "orders"}, {a, "billing"}, {b, "orders"}} {
		if got := overrideOf(t, f[0], f[1]); got != "" {
			t.Errorf("%s/%s got override %q from a refused fleet switch", f[0], f[1], got)
		}
	}
}
