package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// list -l picks flows by label; -o wide adds subscription, topic, pods and selector; -o json,
// yaml and name print what kubectl get prints.
func TestListSelectsByLabelAndPrintsLikeKubectlGet(t *testing.T) {
	ns := namespace(t, "list-output")
	newFlow(t, ns, "orders", func(f *subflowv1.SubscriptionFlow) {
		f.Labels = map[string]string{"db": "orders"}
		f.Spec.Topic = "persistent://shop/orders/events"
		f.Spec.Selector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "b"}}}
	})
	newFlow(t, ns, "payments", func(f *subflowv1.SubscriptionFlow) { f.Labels = map[string]string{"db": "orders"} })
	newFlow(t, ns, "billing", func(f *subflowv1.SubscriptionFlow) { f.Labels = map[string]string{"db": "billing"} })
	setStatus(t, ns, "orders", func(f *subflowv1.SubscriptionFlow) {
		f.Status.EffectiveState, f.Status.StateSource = subflowv1.StatePaused, subflowv1.SourceOverride
		f.Status.Pods = subflowv1.PodCounts{Matched: 3, Synced: 2}
	})

	out := mustSucceed(t, "list", "-n", ns, "-l", "db=orders", "-o", "wide").stdout
	want := `^NAME +STATE +EFFECTIVE +PAUSED +READY +SOURCE +AGE +SUBSCRIPTION +TOPIC +PODS +SELECTOR\n` +
		`orders +Running +Paused +Override +\d+s +orders +persistent://shop/orders/events +2/3 +app=orders,tier in \(a,b\)\n` +
		`payments +Running +\d+s +payments +<all> +0/0 +app=payments\n$`
	if !regexp.MustCompile(want).MatchString(out) {
		t.Errorf("list -l db=orders -o wide:\n%s\nwant to match %s", out, want)
	}

	if out := mustSucceed(t, "list", "-n", ns, "-l", "db=orders", "-o", "name").stdout; out !=
		"subscriptionflow.subflow.dev/orders\nsubscriptionflow.subflow.dev/payments\n" {
		t.Errorf("list -o name:\n%s", out)
	}

	var list struct {
		APIVersion, Kind string
		Items            []map[string]any
	}
	if err := json.Unmarshal([]byte(mustSucceed(t, "list", "-n", ns, "-o", "json").stdout), &list); err != nil {
		t.Fatal(err)
	}
	if list.APIVersion != "v1" || list.Kind != "List" || len(list.Items) != 3 {
		t.Fatalf("list -o json: a %s %s of %d items, want a v1 List of 3", list.APIVersion, list.Kind, len(list.Items))
	}
	for _, item := range list.Items {
		meta := item["metadata"].(map[string]any)
		if item["apiVersion"] != "subflow.dev/v1alpha1" || item["kind"] != "SubscriptionFlow" || meta["managedFields"] != nil {
			t.Errorf("list -o json item %v: want apiVersion subflow.dev/v1alpha1, kind SubscriptionFlow, no managedFields", meta["name"])
		}
	}

	out = mustSucceed(t, "list", "-n", ns, "-l", "db=billing", "-o", "yaml").stdout
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	if items, _ := doc["items"].([]any); doc["kind"] != "List" || len(items) != 1 || !strings.Contains(out, "  kind: SubscriptionFlow\n") ||
		!strings.Contains(out, "    name: billing\n") {
		t.Errorf("list -l db=billing -o yaml:\n%s", out)
	}

	if out := mustSucceed(t, "list", "-n", ns, "-o", "jsonpath={.items[*].metadata.name}").stdout; out != "billing orders payments" {
		t.Errorf("list -o jsonpath: %q", out)
	}
	// As kubectl get: an empty list in json is a List with no items, not "No resources found".
	if r := mustSucceed(t, "list", "-n", ns, "-l", "db=none", "-o", "json"); !strings.Contains(r.stdout, `"items": []`) {
		t.Errorf("list -o json of nothing: %s", r)
	}
	if r := subflow("list", "-n", ns, "-l", "db=none"); r.code != 0 || r.stderr != "No resources found in "+ns+" namespace.\n" {
		t.Errorf("list -l matching nothing: %s", r)
	}
}

func TestOutputRefusesUnknownFormatsAndSelectors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"list", "-o", "table"}, `error: unable to match a printer suitable for the output format "table", allowed formats are: ` +
			"go-template, go-template-file, json, jsonpath, jsonpath-as-json, jsonpath-file, kyaml, name, template, templatefile, wide, yaml\n"},
		{[]string{"status", "orders", "-o", "xml"}, `error: unable to match a printer suitable for the output format "xml"`},
		{[]string{"list", "-l", "a in (b"}, `error: -l "a in (b" is not a label selector: `},
		{[]string{"status", "orders", "--timeout", "1m"}, "error: --timeout needs --watch: it ends the watch\n"},
	} {
		// No server is asked: the kubeconfig's server does not exist.
		r := subflow(append(tc.args, "--server", "https://127.0.0.1:1")...)
		if r.code != 1 || r.stdout != "" || !strings.HasPrefix(r.stderr, tc.want) {
			t.Errorf("%v: %s, want stderr starting %q", tc.args, r, tc.want)
		}
	}
}

// status -o yaml and json print the flow as kubectl get does; -o wide adds when each condition
// changed and the messages a pod received while paused.
func TestStatusOutputFormats(t *testing.T) {
	ns := namespace(t, "status-output")
	newFlow(t, ns, "orders", nil)
	transition := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	setStatus(t, ns, "orders", func(f *subflowv1.SubscriptionFlow) {
		f.Status.ObservedGeneration = f.Generation
		f.Status.EffectiveState, f.Status.StateSource = subflowv1.StatePaused, subflowv1.SourceSpec
		f.Status.Conditions = []metav1.Condition{{Type: subflowv1.ConditionReady, Status: metav1.ConditionTrue, Reason: subflowv1.ReasonSynced,
			Message: "all synced", ObservedGeneration: f.Generation, LastTransitionTime: metav1.NewTime(transition)}}
		f.Status.Agents = []subflowv1.AgentStatus{{Pod: "orders-0", Kind: "sidecar", AgentVersion: "v0.9.0", ProtocolVersion: 2,
			State: "Paused", Consumers: 1, HeldMessages: 3, ReceivedWhilePaused: 42}}
	})

	out := mustSucceed(t, "status", "orders", "-n", ns, "-o", "wide").stdout
	for _, row := range []string{
		`(?m)^  TYPE +STATUS +REASON +AGE +LAST TRANSITION +GENERATION +MESSAGE\n  Ready +True +Synced +\S+ +2026-03-01T12:00:00Z +1 +all synced\n`,
		`(?m)^  POD +KIND +VERSION +PROTOCOL +STATE +CONSUMERS +HELD +RECEIVED WHILE PAUSED +LAST SYNC +MESSAGE\n` +
			`  orders-0 +sidecar +v0.9.0 +2 +Paused +1 +3 +42 +<never> *\n`,
	} {
		if !regexp.MustCompile(row).MatchString(out) {
			t.Errorf("status -o wide does not match %s:\n%s", row, out)
		}
	}
	if out := mustSucceed(t, "status", "orders", "-n", ns).stdout; strings.Contains(out, "RECEIVED WHILE PAUSED") || strings.Contains(out, "LAST TRANSITION") {
		t.Errorf("status without -o wide shows the wide columns:\n%s", out)
	}

	out = mustSucceed(t, "status", "orders", "-n", ns, "-o", "yaml").stdout
	var flow subflowv1.SubscriptionFlow
	if err := yaml.UnmarshalStrict([]byte(out), &flow); err != nil {
		t.Fatalf("status -o yaml is not a SubscriptionFlow: %v\n%s", err, out)
	}
	if !strings.HasPrefix(out, "apiVersion: subflow.dev/v1alpha1\nkind: SubscriptionFlow\n") || flow.Status.Agents[0].ReceivedWhilePaused != 42 ||
		strings.Contains(out, "managedFields") {
		t.Errorf("status -o yaml:\n%s", out)
	}
	if out := mustSucceed(t, "status", "orders", "-n", ns, "-o", "name").stdout; out != "subscriptionflow.subflow.dev/orders\n" {
		t.Errorf("status -o name: %q", out)
	}
	if out := mustSucceed(t, "status", "orders", "-n", ns, "-o", "jsonpath={.status.effectiveState}").stdout; out != "Paused" {
		t.Errorf("status -o jsonpath: %q", out)
	}
}

// startStatusWatch runs `status --watch` in the background until ctx ends; the returned
// function waits for its result.
func startStatusWatch(t *testing.T, ctx context.Context, args ...string) (stdout *testkit.LockedBuffer, finished func() result) {
	t.Helper()
	stdout = &testkit.LockedBuffer{}
	done := make(chan result, 1)
	go func() {
		var stderr testkit.LockedBuffer
		code := runContext(ctx, append(args, "--kubeconfig", kubeconfig), stdout, &stderr)
		done <- result{stdout.String(), stderr.String(), code}
	}()
	return stdout, func() result {
		select {
		case r := <-done:
			return r
		case <-time.After(30 * time.Second):
			t.Fatal("status --watch did not return within 30s")
			return result{}
		}
	}
}

// status --watch prints the flow, again at each change, and ends when its context ends (as
// Ctrl-C ends it), successfully.
func TestStatusWatchReprintsEachChangeUntilInterrupted(t *testing.T) {
	ns := namespace(t, "status-watch")
	newFlow(t, ns, "orders", nil)
	setStatus(t, ns, "orders", runningStatus(metav1.ConditionTrue))
	ctx, interrupt := context.WithCancel(context.Background())
	defer interrupt()

	stdout, finished := startStatusWatch(t, ctx, "status", "orders", "-n", ns, "--watch")
	testkit.Eventually(t, 10*time.Second, "the first description", func() bool {
		return strings.Contains(stdout.String(), "Effective state: Running (source: Spec)\n")
	})
	setStatus(t, ns, "orders", pausedStatus(subflowv1.StatePaused))
	testkit.Eventually(t, 10*time.Second, "the description after the change", func() bool {
		return strings.Contains(stdout.String(), "Effective state: Paused (source: Override)\n")
	})
	interrupt()

	r := finished()
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("status --watch after Ctrl-C: %s", r)
	}
	descriptions := strings.Split(r.stdout, "\n\nName:")
	if len(descriptions) != 2 || !strings.Contains(descriptions[0], "Running") || !strings.Contains(descriptions[1], "Paused") {
		t.Errorf("want the flow described twice, Running then Paused, a blank line between:\n%s", r.stdout)
	}
}

// --timeout ends the watch successfully; the flow's deletion ends it with a line saying so;
// -o yaml --watch prints one document per change.
func TestStatusWatchEndsAtTimeoutOrDeletion(t *testing.T) {
	ns := namespace(t, "status-watch-end")
	newFlow(t, ns, "orders", nil)

	start := time.Now()
	r := mustSucceed(t, "status", "orders", "-n", ns, "--watch", "--timeout", "1s")
	if !strings.HasPrefix(r.stdout, "Name:            orders\n") || time.Since(start) < time.Second {
		t.Errorf("status --watch --timeout 1s returned after %s: %s", time.Since(start), r)
	}

	stdout, finished := startStatusWatch(t, context.Background(), "status", "orders", "-n", ns, "--watch", "-o", "yaml")
	testkit.Eventually(t, 10*time.Second, "the first document", func() bool { return strings.Contains(stdout.String(), "name: orders\n") })
	setStatus(t, ns, "orders", runningStatus(metav1.ConditionTrue))
	testkit.Eventually(t, 10*time.Second, "the second document", func() bool { return strings.Contains(stdout.String(), "---\n") })
	if err := k8s.Delete(context.Background(), getFlow(t, ns, "orders")); err != nil {
		t.Fatal(err)
	}
	r = finished()
	if r.code != 0 || !strings.HasSuffix(r.stdout, "\nsubscriptionflow.subflow.dev/orders deleted\n") ||
		strings.Count(r.stdout, "kind: SubscriptionFlow\n") != 2 {
		t.Errorf("status --watch -o yaml until deleted: %s", r)
	}

	if r := subflow("status", "gone", "-n", ns, "--watch"); r.code != 1 ||
		r.stderr != `Error from server (NotFound): subscriptionflows.subflow.dev "gone" not found`+"\n" {
		t.Errorf("status --watch of a missing flow: %s", r)
	}
}
