package pausewhen

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

func TestObjectConditionReadsTheObjectsStatus(t *testing.T) {
	db := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders-db"},
		Status: appsv1.DeploymentStatus{Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionFalse}}}}
	reader := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(db).Build()
	now := time.Now()
	cond := ObjectCondition{APIVersion: "apps/v1", Kind: "Deployment", Namespace: "shop", Name: "orders-db", ConditionType: "Available", Status: "False"}

	if r := cond.Read(context.Background(), reader, now); r.Verdict != Unhealthy || r.Seen != "Available=False" {
		t.Errorf("a Deployment not Available: %v %q, want Unhealthy Available=False", r.Verdict, r.Seen)
	}
	db.Status.Conditions[0].Status = corev1.ConditionTrue
	if err := reader.Status().Update(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	if r := cond.Read(context.Background(), reader, now); r.Verdict != Healthy || r.Seen != "Available=True" {
		t.Errorf("an Available Deployment: %v %q, want Healthy Available=True", r.Verdict, r.Seen)
	}
	missing := cond
	missing.Name = "gone"
	if r := missing.Read(context.Background(), reader, now); r.Verdict != Unknown || r.Err == nil || !strings.Contains(r.Err.Error(), "Deployment gone not found") {
		t.Errorf("a Deployment that is not there: %v %v, want Unknown naming it", r.Verdict, r.Err)
	}
	noSuchCondition := cond
	noSuchCondition.ConditionType = "Ready"
	if r := noSuchCondition.Read(context.Background(), reader, now); r.Verdict != Unknown || r.Err == nil || !strings.Contains(r.Err.Error(), "has no condition Ready") {
		t.Errorf("a condition the object does not have: %v %v, want Unknown naming it", r.Verdict, r.Err)
	}
}

// The query source against a real Prometheus scraping a dependency's metrics every second.
func TestQueryReadsARealPrometheus(t *testing.T) {
	registry := prometheus.NewRegistry()
	lag := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "orders_db_replication_lag_seconds"}, []string{"replica"})
	registry.MustRegister(lag)
	lag.WithLabelValues("a").Set(5000)
	target := httptest.NewServer(promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	defer target.Close()
	config := fmt.Sprintf("global: {scrape_interval: 1s}\nscrape_configs:\n- job_name: dependency\n  static_configs: [{targets: [%q]}]\n", strings.TrimPrefix(target.URL, "http://"))
	prom, err := NewPrometheus(testkit.StartPrometheus(t, []byte(config)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	q := Query{PromQL: `max(orders_db_replication_lag_seconds)`, Thresholds: Thresholds{Above: ptr(1000), ResumeBelow: ptr(10)}}
	var r Reading
	testkit.Eventually(t, 30*time.Second, "Prometheus to have scraped the lag", func() bool {
		r = q.Read(ctx, prom, time.Now())
		return r.Verdict != Unknown
	})
	if r.Verdict != Unhealthy || r.Seen != "5000" {
		t.Fatalf("lag 5000 above 1000: %v %q (%v), want Unhealthy 5000", r.Verdict, r.Seen, r.Err)
	}
	lag.WithLabelValues("a").Set(3)
	testkit.Eventually(t, 30*time.Second, "the lag under the resume threshold", func() bool {
		r = q.Read(ctx, prom, time.Now())
		return r.Verdict == Healthy && r.Seen == "3"
	})

	lag.WithLabelValues("b").Set(1)
	twoSeries := Query{PromQL: `orders_db_replication_lag_seconds`, Thresholds: q.Thresholds}
	testkit.Eventually(t, 30*time.Second, "two series refused", func() bool {
		r = twoSeries.Read(ctx, prom, time.Now())
		return r.Verdict == Unknown && r.Err != nil && strings.Contains(r.Err.Error(), "returned 2 series, want 1")
	})
	absent := Query{PromQL: `orders_db_missing_metric`, Thresholds: q.Thresholds}
	if r := absent.Read(ctx, prom, time.Now()); r.Verdict != Unknown || r.Err == nil || !strings.Contains(r.Err.Error(), "returned 0 series") {
		t.Errorf("a query without a value: %v %v, want Unknown saying so", r.Verdict, r.Err)
	}
	nan := Query{PromQL: `vector(0) / 0`, Thresholds: q.Thresholds}
	if r := nan.Read(ctx, prom, time.Now()); r.Verdict != Unknown || r.Err == nil {
		t.Errorf("a NaN: %v %v, want Unknown", r.Verdict, r.Err)
	}
	if r := (Query{PromQL: "up{", Thresholds: q.Thresholds}).Read(ctx, prom, time.Now()); r.Verdict != Unknown || r.Err == nil || !strings.Contains(r.Err.Error(), "bad_data") {
		t.Errorf("a query Prometheus refuses: %v %v, want Unknown with its error", r.Verdict, r.Err)
	}
	gone, err := NewPrometheus("http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	if r := q.Read(ctx, gone, time.Now()); r.Verdict != Unknown || r.Err == nil {
		t.Errorf("an unreachable Prometheus: %v %v, want Unknown", r.Verdict, r.Err)
	}
	if r := q.Read(ctx, nil, time.Now()); r.Verdict != Unknown || r.Err == nil || !strings.Contains(r.Err.Error(), "--prometheus-url") {
		t.Errorf("no Prometheus configured: %v %v, want Unknown naming the flag", r.Verdict, r.Err)
	}
}
