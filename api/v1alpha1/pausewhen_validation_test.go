package v1alpha1_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
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

func paymentsProbe() subflowv1.PauseCondition {
	return subflowv1.PauseCondition{Name: "payments", HTTP: &subflowv1.HTTPSource{
		Service: subflowv1.HTTPServiceReference{Name: "payments", Port: intstr.FromString("http")}}}
}

func fastLags() subflowv1.PauseCondition {
	return subflowv1.PauseCondition{Name: "fast-lags", Backlog: &subflowv1.BacklogSource{Subscription: "orders-fast", Above: 10000}}
}

func TestAPIServerRefusesPauseConditionsThatMakeNoSense(t *testing.T) {
	dur := func(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }
	q := func(s string) *resource.Quantity { v := resource.MustParse(s); return &v }
	tests := []struct {
		name    string
		mutate  func(*subflowv1.PauseCondition)
		wantErr string
	}{
		{"no source", func(c *subflowv1.PauseCondition) { c.Kubernetes = nil }, "set exactly one source: kubernetes, prometheus, http or backlog"},
		{"two sources", func(c *subflowv1.PauseCondition) { c.Prometheus = lagAbove("1").Prometheus }, "set exactly one source: kubernetes, prometheus, http or backlog"},
		{"a probe beside an object", func(c *subflowv1.PauseCondition) { c.HTTP = paymentsProbe().HTTP }, "set exactly one source"},
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
		{"a probe of port 0", func(c *subflowv1.PauseCondition) {
			*c = paymentsProbe()
			c.HTTP.Service.Port = intstr.FromInt32(0)
		}, "port must be a number from 1 to 65535 or a port name"},
		{"a probe of an empty port name", func(c *subflowv1.PauseCondition) {
			*c = paymentsProbe()
			c.HTTP.Service.Port = intstr.FromString("")
		}, "port must be a number from 1 to 65535 or a port name"},
		{"a probe path that is a URL", func(c *subflowv1.PauseCondition) {
			*c = paymentsProbe()
			c.HTTP.Service.Path = "http://169.254.169.254/"
		}, "spec.pauseWhen[0].http.service.path"},
		{"a probe of a Service name that is none", func(c *subflowv1.PauseCondition) {
			*c = paymentsProbe()
			c.HTTP.Service.Name = "payments.other-namespace"
		}, "spec.pauseWhen[0].http.service.name"},
		{"a healthy range upside down", func(c *subflowv1.PauseCondition) {
			*c = paymentsProbe()
			c.HTTP.HealthyStatus = &subflowv1.StatusRange{Min: 399, Max: 200}
		}, "healthyStatus.min must not exceed healthyStatus.max"},
		{"a status code that is none", func(c *subflowv1.PauseCondition) {
			*c = paymentsProbe()
			c.HTTP.HealthyStatus = &subflowv1.StatusRange{Min: 200, Max: 700}
		}, "spec.pauseWhen[0].http.healthyStatus.max"},
		{"a probe timeout of a minute", func(c *subflowv1.PauseCondition) {
			*c = paymentsProbe()
			c.HTTP.Timeout = dur(time.Minute)
		}, "timeout must be from 10ms to 5s"},
		{"an unknown scheme", func(c *subflowv1.PauseCondition) {
			*c = paymentsProbe()
			c.HTTP.Scheme = "gopher"
		}, `Unsupported value: "gopher"`},
		{"a backlog beside an object", func(c *subflowv1.PauseCondition) { c.Backlog = fastLags().Backlog }, "set exactly one source"},
		{"a backlog of the flow's own subscription", func(c *subflowv1.PauseCondition) {
			*c = fastLags()
			c.Backlog.Subscription = validFlow("x").Spec.Subscription
		}, "a backlog condition reads another subscription than the flow's own"},
		{"a backlog subscription with a newline", func(c *subflowv1.PauseCondition) {
			*c = fastLags()
			c.Backlog.Subscription = "orders\nfast"
		}, "subscription must not hold control characters"},
		{"a negative backlog threshold", func(c *subflowv1.PauseCondition) {
			*c = fastLags()
			c.Backlog.Above = -1
		}, "spec.pauseWhen[0].backlog.above"},
		{"a backlog resuming above its trip", func(c *subflowv1.PauseCondition) {
			*c = fastLags()
			c.Backlog.ResumeBelow = ptr(int64(20000))
		}, "resumeBelow must not exceed above"},
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
	numeric := paymentsProbe()
	numeric.Name = "payments-tls"
	numeric.HTTP.Service.Port = intstr.FromInt32(8443)
	numeric.HTTP.Scheme = "HTTPS"
	numeric.HTTP.HealthyStatus = &subflowv1.StatusRange{Min: 200, Max: 299}
	numeric.HTTP.Timeout = &metav1.Duration{Duration: 500 * time.Millisecond}
	backlog := fastLags()
	backlog.Backlog.ResumeBelow = ptr(int64(1000))
	flow.Spec.PauseWhen = []subflowv1.PauseCondition{dbDown(), lag, paymentsProbe(), numeric, backlog}
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
	if h := got.Spec.PauseWhen[2].HTTP; h.Scheme != "HTTP" || h.Service.Path != "/" || h.Service.Port != intstr.FromString("http") {
		t.Errorf("probe defaults: scheme %q, path %q, port %s; want HTTP, /, http", h.Scheme, h.Service.Path, h.Service.Port.String())
	}
}

func ptr[T any](v T) *T { return &v }
