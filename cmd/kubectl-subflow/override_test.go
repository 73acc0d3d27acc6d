package main

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

func overrides(flow *subflowv1.SubscriptionFlow) map[string]string {
	out := map[string]string{}
	for _, key := range []string{subflowv1.OverrideStateAnnotation, subflowv1.OverrideUntilAnnotation, subflowv1.OverrideReasonAnnotation} {
		if v, ok := flow.Annotations[key]; ok {
			out[key] = v
		}
	}
	return out
}

func TestPauseSetsOverrideWithEndAndReason(t *testing.T) {
	ns := namespace(t, "pause-for")
	before := newFlow(t, ns, "orders", nil)

	start := time.Now()
	r := mustSucceed(t, "pause", "orders", "--for", "30m", "--reason", "INC-4711 db failover", "-n", ns)
	end := time.Now()

	flow := getFlow(t, ns, "orders")
	got := overrides(flow)
	if got[subflowv1.OverrideStateAnnotation] != "Paused" || got[subflowv1.OverrideReasonAnnotation] != "INC-4711 db failover" {
		t.Fatalf("annotations %v", got)
	}
	until, err := time.Parse(time.RFC3339, got[subflowv1.OverrideUntilAnnotation])
	if err != nil {
		t.Fatalf("override-until is not RFC 3339: %v", err)
	}
	if until.Before(start.Add(30*time.Minute).Add(-time.Second)) || until.After(end.Add(30*time.Minute)) {
		t.Errorf("override-until %s is not 30m after the command ran (%s..%s)", until, start, end)
	}
	want := fmt.Sprintf("subscriptionflow.subflow.dev/orders paused until %s (reason: INC-4711 db failover)\n", until.Format(time.RFC3339))
	if r.stdout != want {
		t.Errorf("stdout %q, want %q", r.stdout, want)
	}
	if flow.Annotations["team"] != "orders" || flow.Generation != before.Generation {
		t.Errorf("other annotations or the spec changed: annotations %v, generation %d -> %d", flow.Annotations, before.Generation, flow.Generation)
	}
}

// A new override replaces the earlier one whole: no end or reason of the old one survives.
func TestOverrideReplacesEarlierOneAndClearRemovesIt(t *testing.T) {
	ns := namespace(t, "override-sequence")
	newFlow(t, ns, "orders", nil)
	steps := []struct {
		args      []string
		want      map[string]string
		wantUntil bool
		stdout    string
	}{
		{[]string{"pause", "orders", "--for", "30m", "--reason", "INC-1"},
			map[string]string{subflowv1.OverrideStateAnnotation: "Paused", subflowv1.OverrideReasonAnnotation: "INC-1"}, true, "paused until "},
		{[]string{"stop", "orders"},
			map[string]string{subflowv1.OverrideStateAnnotation: "Stopped"}, false,
			"subscriptionflow.subflow.dev/orders stopped until cleared (kubectl subflow clear orders -n override-sequence)\n"},
		{[]string{"resume", "orders", "--for", "1h"},
			map[string]string{subflowv1.OverrideStateAnnotation: "Running"}, true, "resumed until "},
		{[]string{"clear", "orders"}, map[string]string{}, false,
			"subscriptionflow.subflow.dev/orders override cleared: spec.state and maintenance windows decide\n"},
		{[]string{"clear", "orders"}, map[string]string{}, false, "override cleared"},
	}
	for _, step := range steps {
		r := mustSucceed(t, append(step.args, "-n", ns)...)
		if !strings.Contains(r.stdout, step.stdout) {
			t.Errorf("%v: stdout %q, want it to contain %q", step.args, r.stdout, step.stdout)
		}
		flow := getFlow(t, ns, "orders")
		got := overrides(flow)
		_, hasUntil := got[subflowv1.OverrideUntilAnnotation]
		delete(got, subflowv1.OverrideUntilAnnotation)
		if !maps.Equal(got, step.want) || hasUntil != step.wantUntil {
			t.Errorf("%v: override annotations %v (until present: %v), want %v (until: %v)", step.args, overrides(flow), hasUntil, step.want, step.wantUntil)
		}
		if flow.Annotations["team"] != "orders" {
			t.Errorf("%v: removed an unrelated annotation: %v", step.args, flow.Annotations)
		}
	}
}

// Without -n the kubeconfig context's namespace applies, as with kubectl; --context switches it.
func TestNamespaceComesFromContextAndFlags(t *testing.T) {
	namespace(t, contextNS)
	namespace(t, otherContextNS)
	namespace(t, "explicit")
	for _, ns := range []string{contextNS, otherContextNS, "explicit"} {
		newFlow(t, ns, "orders", nil)
	}
	mustSucceed(t, "pause", "orders")
	mustSucceed(t, "stop", "orders", "--context", otherContext)
	mustSucceed(t, "resume", "orders", "--context", otherContext, "--namespace", "explicit")
	for ns, want := range map[string]string{contextNS: "Paused", otherContextNS: "Stopped", "explicit": "Running"} {
		if got := getFlow(t, ns, "orders").Annotations[subflowv1.OverrideStateAnnotation]; got != want {
			t.Errorf("namespace %s: override %q, want %q", ns, got, want)
		}
	}
	if r := subflow("pause", "orders", "--context", "no-such-context"); r.code != 1 || !strings.Contains(r.stderr, "context was not found for specified context: no-such-context") {
		t.Errorf("unknown context: %s", r)
	}
}

func TestMissingFlowReadsLikeKubectl(t *testing.T) {
	ns := namespace(t, "not-found")
	want := "Error from server (NotFound): subscriptionflows.subflow.dev \"missing\" not found\n"
	for _, args := range [][]string{
		{"pause", "missing"}, {"resume", "missing", "--for", "5m"}, {"stop", "missing"}, {"clear", "missing"},
		{"seek", "missing", "--index", "1"}, {"status", "missing"}, {"wait", "missing", "--for", "paused"},
	} {
		r := subflow(append(args, "-n", ns)...)
		if r.code != 1 || r.stderr != want || r.stdout != "" {
			t.Errorf("%v: %s, want exit 1 and stderr %q", args, r, want)
		}
	}
}

// Every refused input names the problem, exits 1 and leaves the flow exactly as it was.
func TestBadInputIsRefusedAndChangesNothing(t *testing.T) {
	ns := namespace(t, "bad-input")
	newFlow(t, ns, "orders", nil)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"pause"}, "error: NAME is required"},
		{[]string{"pause", "orders", "orders-2"}, "error: exactly one NAME is expected, got 2"},
		{[]string{"pause", ""}, "error: NAME must not be empty"},
		{[]string{"pause", "orders", "--for", "garbage"}, `error: invalid argument "garbage" for "--for" flag`},
		{[]string{"pause", "orders", "--for", "-5m"}, "error: --for must be a positive duration such as 30m or 2h, got -5m0s"},
		{[]string{"pause", "orders", "--for", "0s"}, "error: --for must be a positive duration"},
		{[]string{"pause", "orders", "--for", "9000h"}, "error: --for must be at most 8784h0m0s"},
		{[]string{"stop", "orders", "--reason", "two\nlines"}, "error: --reason must be one line of printable text"},
		{[]string{"stop", "orders", "--reason", strings.Repeat("x", 1025)}, "error: --reason is 1025 bytes long, at most 1024 are allowed"},
		{[]string{"pause", "orders", "--state", "Frozen"}, "error: unknown flag: --state"},
		{[]string{"freeze", "orders"}, `error: unknown command "freeze" for "kubectl subflow"`},
		{[]string{"seek", "orders"}, "error: give exactly one of --index (non-partitioned topic) or --partition P=N"},
		{[]string{"seek", "orders", "--index", "-1"}, "error: --index must be 0 or more, got -1"},
		{[]string{"seek", "orders", "--index", "abc"}, `error: invalid argument "abc" for "--index" flag`},
		{[]string{"seek", "orders", "--index", "1", "--partition", "0=1"}, "error: give exactly one of --index"},
		{[]string{"seek", "orders", "--partition", "0"}, `error: --partition "0": want P=N`},
		{[]string{"seek", "orders", "--partition", "-1=5"}, `error: --partition "-1=5": want P=N`},
		{[]string{"seek", "orders", "--partition", "0=-5"}, `error: --partition "0=-5": want P=N`},
		{[]string{"seek", "orders", "--partition", "4294967296=5"}, `error: --partition "4294967296=5": want P=N`},
		{[]string{"seek", "orders", "--partition", "0=1", "--partition", "0=2"}, "error: --partition 0 is given twice"},
		{[]string{"seek", "orders", "--index", "1", "--id", strings.Repeat("a", 129)}, "error: --id is 129 characters long, at most 128"},
		// The API server's own rule: partitions belong to one partitioned topic (spec.topic).
		{[]string{"seek", "orders", "--partition", "0=1"}, "Error from server (Invalid): "},
		{[]string{"seek", "orders", "--partition", "0=1"}, "seek.partitions needs spec.topic"},
		{[]string{"wait", "orders"}, `error: --for must be paused, stopped or running, got ""`},
		{[]string{"wait", "orders", "--for", "frozen"}, `error: --for must be paused, stopped or running, got "frozen"`},
		{[]string{"wait", "orders", "--for", "paused", "--timeout", "-1s"}, "error: --timeout must be a positive duration"},
		{[]string{"status"}, "error: NAME is required"},
		{[]string{"list", "orders"}, "error: list takes no arguments"},
	}
	before := getFlow(t, ns, "orders")
	for _, tt := range tests {
		r := subflow(append(tt.args, "-n", ns)...)
		kubectlStyle := strings.HasPrefix(r.stderr, "error: ") || strings.HasPrefix(r.stderr, "Error from server (")
		if r.code != 1 || !strings.Contains(r.stderr, tt.want) || !kubectlStyle || r.stdout != "" {
			t.Errorf("%q: %s, want exit 1 and a kubectl-style stderr containing %q", tt.args, r, tt.want)
		}
	}
	if after := getFlow(t, ns, "orders"); after.ResourceVersion != before.ResourceVersion {
		t.Errorf("refused input changed the flow: resourceVersion %s -> %s", before.ResourceVersion, after.ResourceVersion)
	}
}

// An on-call engineer with read rights only can look but not change: the API server's refusal
// is shown as kubectl shows it, and the flow stays as it was.
func TestReadOnlyUserIsRefusedLikeKubectl(t *testing.T) {
	ns := namespace(t, "read-only")
	newFlow(t, ns, "orders", nil)
	grantRead(t, "viewer")
	before := getFlow(t, ns, "orders")
	asViewer := func(args ...string) result {
		var stdout, stderr bytes.Buffer
		code := run(append(args, "-n", ns, "--kubeconfig", viewerKubeconfig), &stdout, &stderr)
		return result{stdout.String(), stderr.String(), code}
	}

	if r := asViewer("status", "orders"); r.code != 0 || !strings.Contains(r.stdout, "Name:            orders\n") {
		t.Errorf("status as viewer: %s", r)
	}
	want := `Error from server (Forbidden): subscriptionflows.subflow.dev "orders" is forbidden: User "viewer" cannot patch resource "subscriptionflows" in API group "subflow.dev" in the namespace "read-only"` + "\n"
	for _, args := range [][]string{{"pause", "orders"}, {"clear", "orders"}, {"seek", "orders", "--index", "1"}} {
		if r := asViewer(args...); r.code != 1 || r.stderr != want {
			t.Errorf("%v as viewer: %s, want stderr %q", args, r, want)
		}
	}
	if after := getFlow(t, ns, "orders"); after.ResourceVersion != before.ResourceVersion {
		t.Error("a refused change changed the flow")
	}
}

// grantRead lets user get, list and watch SubscriptionFlows everywhere.
func grantRead(t *testing.T, user string) {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "subflow-viewer"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{subflowv1.GroupVersion.Group}, Resources: []string{"subscriptionflows"},
			Verbs: []string{"get", "list", "watch"}}},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "subflow-viewer"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}
	for _, obj := range []client.Object{role, binding} {
		if err := k8s.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	// RBAC takes effect asynchronously in the API server's authorizer cache.
	testkit.Eventually(t, 10*time.Second, "the viewer can read flows", func() bool {
		var stdout, stderr bytes.Buffer
		return run([]string{"list", "-A", "--kubeconfig", viewerKubeconfig}, &stdout, &stderr) == 0
	})
}
