package main

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
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
	// Every flow that refuses is named, not only the first.
	r = asViewer("pause", "-l", "fleet="+prefix, "-A")
	if r.code != 1 || !strings.Contains(r.stderr, "none of the 4 flows was changed: 2 refuse the change:") ||
		!strings.Contains(r.stderr, "\n  "+b+"/orders: ") || !strings.Contains(r.stderr, "\n  "+b+"/users: ") ||
		strings.Contains(r.stderr, a+"/") || r.stdout != "" {
		t.Fatalf("pause -A with two flows refusing: %s", r)
	}
	for _, f := range [][2]string{{a, "orders"}, {a, "billing"}, {b, "orders"}, {b, "users"}} {
		if got := overrideOf(t, f[0], f[1]); got != "" {
			t.Errorf("%s/%s got override %q from a refused fleet switch", f[0], f[1], got)
		}
	}
}

// Flows that pass the dry run but refuse the change itself (an admission policy changed in
// between, a flow deleted): the others are changed and named, and every one that refused is
// named with why.
func TestFleetSwitchNamesEveryFlowThatRefused(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = subflowv1.AddToScheme(scheme)
	var objs []client.Object
	var keys []types.NamespacedName
	for _, name := range []string{"a", "b", "c", "d"} {
		objs = append(objs, &subflowv1.SubscriptionFlow{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}})
		keys = append(keys, types.NamespacedName{Namespace: "ns", Name: name})
	}
	refusing := map[string]bool{"b": true, "d": true}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if len((&client.PatchOptions{}).ApplyOptions(opts).DryRun) == 0 && refusing[obj.GetName()] {
				return fmt.Errorf("admission webhook denied the request: %s is frozen", obj.GetName())
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
	}).Build()
	var changed []string
	err := patchAnnotations(context.Background(), c, keys, map[string]any{subflowv1.OverrideStateAnnotation: "Paused"},
		func(key types.NamespacedName) { changed = append(changed, key.Name) })
	want := "2 of the 4 flows were changed; 2 refused the change:\n  ns/b: admission webhook denied the request: b is frozen\n" +
		"  ns/d: admission webhook denied the request: d is frozen"
	if err == nil || err.Error() != want {
		t.Fatalf("error %v, want %q", err, want)
	}
	if sort.Strings(changed); strings.Join(changed, ",") != "a,c" {
		t.Fatalf("named as changed: %v, want a and c", changed)
	}
}
