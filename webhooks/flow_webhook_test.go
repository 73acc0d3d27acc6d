package webhooks_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

func flow(ns string, annotations map[string]string) *subflowv1.SubscriptionFlow {
	return &subflowv1.SubscriptionFlow{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "orders-", Annotations: annotations},
		Spec: subflowv1.SubscriptionFlowSpec{Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "orders"}},
			Subscription: "orders-ingest"},
	}
}

func override(state, until string) map[string]string {
	a := map[string]string{subflowv1.OverrideStateAnnotation: state}
	if until != "" {
		a[subflowv1.OverrideUntilAnnotation] = until
	}
	return a
}

// warnings records the admission warnings the API server passes on, as kubectl prints them.
type warnings struct {
	mu   sync.Mutex
	seen []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = append(w.seen, text)
}

func (w *warnings) text() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.seen, "\n")
}

func TestOverrideAnnotationsAreValidated(t *testing.T) {
	ns := namespace(t, k8s)
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	refused := []struct {
		name        string
		annotations map[string]string
		want        string
	}{
		{"a typo in the state", override("Pausd", ""),
			`annotation subflow.dev/override-state="Pausd" is not a state: want Running, Paused or Stopped (any letter case)`},
		{"an unreadable end", override("Paused", "tomorrow 18:00"),
			`annotation subflow.dev/override-until="tomorrow 18:00" cannot be read: want an RFC 3339 time such as 2026-11-30T18:00:00Z`},
	}
	for _, tc := range refused {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			err := k8s.Create(context.Background(), flow(ns, tc.annotations))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("creating the flow: %v, want a refusal saying %q", err, tc.want)
			}
		})
	}
	for _, annotations := range []map[string]string{override("Paused", ""), override("stopped", future), override("Running", ""),
		{subflowv1.OverrideReasonAnnotation: "INC-4711"}, nil} {
		if err := k8s.Create(context.Background(), flow(ns, annotations)); err != nil {
			t.Errorf("creating a flow with %v: %v", annotations, err)
		}
	}
}

func TestOverrideTypoOnUpdateChangesNothing(t *testing.T) {
	ns := namespace(t, k8s)
	f := flow(ns, override("Paused", ""))
	if err := k8s.Create(context.Background(), f); err != nil {
		t.Fatal(err)
	}
	patch := client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"annotations":{"subflow.dev/override-state":"Stoped"}}}`))
	err := k8s.Patch(context.Background(), f.DeepCopy(), patch)
	if err == nil || !strings.Contains(err.Error(), "want Running, Paused or Stopped") {
		t.Fatalf("patching override-state=Stoped: %v, want a refusal naming the states", err)
	}
	var stored subflowv1.SubscriptionFlow
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(f), &stored); err != nil {
		t.Fatal(err)
	}
	if got := stored.Annotations[subflowv1.OverrideStateAnnotation]; got != "Paused" {
		t.Fatalf("after the refused patch override-state = %q, want Paused", got)
	}
}

// TestOverrideWarnings: what is readable but probably not meant is admitted with a warning.
func TestOverrideWarnings(t *testing.T) {
	ns := namespace(t, k8s)
	seen := &warnings{}
	cfg := rest.CopyConfig(shared.cfg)
	cfg.WarningHandler = seen
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	annotations := override("Paused", "2020-01-01T00:00:00Z")
	annotations["subflow.dev/overide-state"] = "Paused"
	if err := c.Create(context.Background(), flow(ns, annotations)); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"annotation subflow.dev/override-until=2020-01-01T00:00:00Z has already passed: the override is ignored",
		"annotation subflow.dev/overide-state is not one subflow reads (subflow.dev/override-state, subflow.dev/override-until, subflow.dev/override-reason)"} {
		if !strings.Contains(seen.text(), want) {
			t.Errorf("warnings %q do not say %q", seen.text(), want)
		}
	}
}

// A pauseWhen query that is not PromQL is refused at admission, by Prometheus's own parser,
// naming the condition; a valid one passes, and an update that leaves the query as stored is
// not judged again.
func TestPauseWhenQueriesAreParsed(t *testing.T) {
	ns := namespace(t, k8s)
	withQuery := func(q string) *subflowv1.SubscriptionFlow {
		f := flow(ns, nil)
		above := resource.MustParse("30")
		f.Spec.PauseWhen = []subflowv1.PauseCondition{{Name: "lag", Prometheus: &subflowv1.PrometheusSource{Query: q, Above: &above}}}
		return f
	}
	err := k8s.Create(context.Background(), withQuery(`max(pg_replication_lag_seconds{cluster="orders"}`))
	if err == nil || !strings.Contains(err.Error(), "spec.pauseWhen[0].prometheus.query is not PromQL") {
		t.Fatalf("creating a flow with an unclosed query: %v, want it refused naming the condition", err)
	}
	valid := withQuery(`max(pg_replication_lag_seconds{cluster="orders"})`)
	if err := k8s.Create(context.Background(), valid); err != nil {
		t.Fatalf("a valid query refused: %v", err)
	}
	patch := []byte(`{"spec":{"pauseWhen":[{"name":"lag","prometheus":{"query":"rate(x[5m]","above":"30"}}]}}`)
	if err := k8s.Patch(context.Background(), valid, client.RawPatch(types.MergePatchType, patch)); err == nil || !strings.Contains(err.Error(), "is not PromQL") {
		t.Fatalf("an update to an unclosed query: %v, want it refused", err)
	}
}
