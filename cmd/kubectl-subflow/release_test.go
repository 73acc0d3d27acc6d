package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/testing/testenv"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// An on-call engineer bound only to the on-call role README documents (config/rbac) in the
// flow's namespace runs `kubectl subflow release` as the holding flow's status prints it, and
// the rule is released.
func TestReleaseWorksWithTheOnCallRole(t *testing.T) {
	ns := namespace(t, "release-oncall")
	user := "oncall-alice"
	bindOnCallRole(t, ns, user)
	testkit.Eventually(t, 10*time.Second, user+" may list flows in "+ns, func() bool {
		return subflow("list", "-n", ns, "--as", user).code == 0
	})
	stop := playController(t, ns, "orders-old", 2)
	defer stop()

	r := subflow("release", "orders-old", "-n", ns, "--selector", "app=orders", "--timeout", "20s", "--as", user)
	if r.code != 0 || r.stdout != "released the rule "+ns+"/orders-old in 2 pods\n" || r.stderr != "" {
		t.Fatalf("release as %s: %s", user, r)
	}
	err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "orders-old"}, &subflowv1.SubscriptionFlow{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("the flow release created is still there: %v", err)
	}
}

// bindOnCallRole creates the ClusterRole of config/rbac/oncall_role.yaml, as kustomize names
// it, and binds it to user in namespace ns only, as README says to.
func bindOnCallRole(t *testing.T, ns, user string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "rbac", "oncall_role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict(data, &role); err != nil {
		t.Fatal(err)
	}
	role.Name = "subflow-" + role.Name
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
	if err := k8s.Create(context.Background(), &role); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := k8s.Create(context.Background(), binding); err != nil {
		t.Fatal(err)
	}
}

// playController does for the flow name what the controller does (there is none in these
// tests): it adds the finalizer, reports the flow pushed to pods pods, and once the flow is
// deleted removes the finalizer. stop waits for it to end.
func playController(t *testing.T, ns, name string, pods int32) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	key := client.ObjectKey{Namespace: ns, Name: name}
	go func() {
		defer close(done)
		_ = wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			var flow subflowv1.SubscriptionFlow
			if err := k8s.Get(ctx, key, &flow); err != nil {
				return false, nil // not created yet, or gone
			}
			switch {
			case flow.DeletionTimestamp != nil:
				flow.Finalizers = slices.DeleteFunc(flow.Finalizers, func(f string) bool { return f == subflowv1.Finalizer })
				_ = k8s.Update(ctx, &flow) // a conflict is tried again at the next poll
			case !slices.Contains(flow.Finalizers, subflowv1.Finalizer):
				flow.Finalizers = append(flow.Finalizers, subflowv1.Finalizer)
				_ = k8s.Update(ctx, &flow)
			case flow.Status.ObservedGeneration != flow.Generation:
				flow.Status.ObservedGeneration = flow.Generation
				flow.Status.Pods = subflowv1.PodCounts{Matched: pods, Synced: pods}
				_ = k8s.Status().Update(ctx, &flow)
			}
			return false, nil
		})
	}()
	return func() { cancel(); <-done }
}
