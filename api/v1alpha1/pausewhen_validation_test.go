package v1alpha1_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

func dbDown() subflowv1.PauseCondition {
	return subflowv1.PauseCondition{Name: "orders-db", Kubernetes: &subflowv1.ObjectConditionSource{
		APIVersion: "apps/v1", Kind: "Deployment", Name: "orders-db", ConditionType: "Available", Status: "False"}}
}

func lagAbove(q string) subflowv1.PauseCondition {
	above := resource.MustParse(q)
	return subflowv1.PauseCondition{Name: "lag", Prometheus: &subflowv1.PrometheusSource{Query: "max(lag_seconds)", Above: &above}}
}

func TestAPIServerRefusesPauseConditionsThatMakeNoSense(t *testing.T) {
	dur := func(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }
	q := func(s string) *resource.Quantity { v := resource.MustParse(s); return &v }
	tests := []struct {
		name    string
		mutate  func(*subflowv1.PauseCondition)
		wantErr string
	}{
		{"no source", func(c *subflowv1.PauseCondition) { c.Kubernetes = nil }, "set exactly one source: kubernetes or prometheus"},
		{"two sources", func(c *subflowv1.PauseCondition) { c.Prometheus = lagAbove("1").Prometheus }, "set exactly one source: kubernetes or prometheus"},
		{"a name that is not a DNS label", func(c *subflowv1.PauseCondition) { c.Name = "Orders DB" }, "spec.pauseWhen[0].name"},
		{"sub-second interval", func(c *subflowv1.PauseCondition) { c.Interval = dur(500 * time.Millisecond) }, "interval must be from 1s to 1h"},
		{"resumeAfter under the minimum hold", func(c *subflowv1.PauseCondition) { c.ResumeAfter = dur(time.Second) }, "resumeAfter must be from 10s to 24h"},
		{"a for of days", func(c *subflowv1.PauseCondition) { c.For = dur(48 * time.Hour) }, "for must be at most 24h"},
		{"unknown onError", func(c *subflowv1.PauseCondition) { c.OnError = "Ignore" }, `Unsupported value: "Ignore"`},
		{"a condition status that is none", func(c *subflowv1.PauseCondition) { c.Kubernetes.Status = "Down" }, `Unsupported value: "Down"`},
		{"neither above nor below", func(c *subflowv1.PauseCondition) { *c = lagAbove("1"); c.Prometheus.Above = nil }, "set exactly one of above or below"},
		{"above and below", func(c *subflowv1.PauseCondition) { *c = lagAbove("1"); c.Prometheus.Below = q("0") }, "set exactly one of above or below"},
		{"resumeBelow with below", func(c *subflowv1.PauseCondition) {
			*c = lagAbove("1")
			c.Prometheus.Above, c.Prometheus.Below, c.Prometheus.ResumeBelow = nil, q("1"), q("2")
		}, "resumeBelow goes with above"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			flow := validFlow(fmt.Sprintf("pausewhen-invalid-%d", i))
			c := dbDown()
			tt.mutate(&c)
			flow.Spec.PauseWhen = []subflowv1.PauseCondition{c}
			err := k8s.Create(context.Background(), flow)
			if err == nil {
				_ = k8s.Delete(context.Background(), flow)
				t.Fatalf("API server accepted %s", tt.name)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %q\ndoes not contain %q", err, tt.wantErr)
			}
		})
	}
	t.Run("more than 8 conditions", func(t *testing.T) {
		flow := validFlow("pausewhen-too-many")
		for i := range subflowv1.MaxPauseConditions + 1 {
			c := dbDown()
			c.Name = fmt.Sprintf("c%d", i)
			flow.Spec.PauseWhen = append(flow.Spec.PauseWhen, c)
		}
		if err := k8s.Create(context.Background(), flow); err == nil || !strings.Contains(err.Error(), "must have at most 8 items") {
			t.Fatalf("9 conditions: %v, want refused", err)
		}
	})
	t.Run("two conditions of one name", func(t *testing.T) {
		flow := validFlow("pausewhen-same-name")
		flow.Spec.PauseWhen = []subflowv1.PauseCondition{dbDown(), dbDown()}
		if err := k8s.Create(context.Background(), flow); err == nil || !strings.Contains(err.Error(), "Duplicate value") {
			t.Fatalf("two conditions named orders-db: %v, want refused", err)
		}
	})
}

func TestAPIServerAcceptsPauseConditionsAndDefaults(t *testing.T) {
	ctx := context.Background()
	flow := validFlow("pausewhen-valid")
	lag := lagAbove("1500m")
	resume := resource.MustParse("0.5")
	lag.Prometheus.ResumeBelow = &resume
	lag.Interval = &metav1.Duration{Duration: time.Second}
	flow.Spec.PauseWhen = []subflowv1.PauseCondition{dbDown(), lag}
	if err := k8s.Create(ctx, flow); err != nil {
		t.Fatalf("valid conditions refused: %v", err)
	}
	t.Cleanup(func() { _ = k8s.Delete(ctx, flow) })
	got := &subflowv1.SubscriptionFlow{}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(flow), got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.PauseWhen[0].OnError != subflowv1.OnErrorHold {
		t.Errorf("onError default %q, want Hold", got.Spec.PauseWhen[0].OnError)
	}
	if a := got.Spec.PauseWhen[1].Prometheus.Above; a == nil || a.AsApproximateFloat64() != 1.5 {
		t.Errorf("above %v, want 1.5", a)
	}
}
