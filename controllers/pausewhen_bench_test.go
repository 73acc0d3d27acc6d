package controllers_test

import (
	"bytes"
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// realTime makes the reconciler's clock follow the wall clock while a benchmark runs, so that
// conditions fall due, and the controller requeues them, as in production.
func realTime(b testing.TB) {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			clock.SetTime(time.Now())
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	b.Cleanup(func() { close(stop); <-done; clock.SetTime(time.Now()) })
}

// BenchmarkConditionPause measures a dependency turning unavailable (its Deployment's Available
// condition written False) -> every one of 10 agents' consumers Paused, with the condition read
// every second by the controller's own requeues (target: p99 <= interval + 1 s). Each round
// then makes the dependency available again and waits out resumeAfter (10 s) until every
// consumer runs, so a round takes about 12 s: at least 20 rounds, 200 agent samples.
func BenchmarkConditionPause(b *testing.B) {
	realTime(b)
	ns := namespace(b, true)
	topic := "bench-" + ns
	pods := startPods(b, ns, topic, 10, false)
	db := benchDependency(b, ns, "orders-db")
	flow := newFlow(ns, "bench", topic, subflowv1.StateRunning)
	flow.Spec.PauseWhen = []subflowv1.PauseCondition{{Name: "db-down", Interval: &metav1.Duration{Duration: time.Second},
		ResumeAfter: &metav1.Duration{Duration: 10 * time.Second},
		Kubernetes:  &subflowv1.ObjectConditionSource{APIVersion: "apps/v1", Kind: "Deployment", Name: "orders-db", ConditionType: "Available", Status: "False"}}}
	if err := k8s.Create(context.Background(), flow); err != nil {
		b.Fatal(err)
	}
	waitAll(b, pods, protocol.Running)
	var perAgent, all []time.Duration
	b.ResetTimer()
	for range max(b.N, 20) {
		start := time.Now()
		benchAvailable(b, db, corev1.ConditionFalse)
		waitAll(b, pods, protocol.Paused)
		last := time.Duration(0)
		for _, p := range pods {
			d := p.Status().Since.Sub(start)
			perAgent = append(perAgent, d)
			last = max(last, d)
		}
		all = append(all, last)
		b.StopTimer()
		benchAvailable(b, db, corev1.ConditionTrue)
		waitAll(b, pods, protocol.Running)
		b.StartTimer()
	}
	b.ReportMetric(testkit.Millis(testkit.Percentile(perAgent, 50)), "p50-ms")
	b.ReportMetric(testkit.Millis(testkit.Percentile(perAgent, 99)), "p99-ms")
	b.ReportMetric(float64(len(perAgent)), "agent-samples")
	b.ReportMetric(testkit.Millis(testkit.Percentile(all, 99)), "all-p99-ms")
	b.ReportMetric(float64(len(all)), "rounds")
}

func benchDependency(b *testing.B, ns, name string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "db", Image: "db"}}}}}}
	if err := k8s.Create(context.Background(), d); err != nil {
		b.Fatal(err)
	}
	benchAvailable(b, d, corev1.ConditionTrue)
	return d
}

func benchAvailable(b *testing.B, d *appsv1.Deployment, available corev1.ConditionStatus) {
	d.Status.Conditions = []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: available, Reason: "Bench",
		LastUpdateTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if err := k8s.Status().Update(context.Background(), d); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkConditionEvaluation measures what 1000 flows, each with one kubernetes condition read
// every 10 s, cost the controller once their first readings are in: the API server's GETs of
// the conditions' objects per interval (goal: one per distinct object, here 10, since flows
// asking the same share a reading), every API request the controller makes per interval, and
// the controller's CPU per interval (this process: the controller is the only work in it, the
// API server and etcd run apart). The flows match no pod, so the figures are the conditions'
// alone. Measured over 3 intervals of the wall clock.
func BenchmarkConditionEvaluation(b *testing.B) {
	const flows, objects, interval = 1000, 10, 10 * time.Second
	realTime(b)
	ns := namespace(b, true)
	for i := range objects {
		benchDependency(b, ns, fmt.Sprintf("db-%d", i))
	}
	for i := range flows {
		flow := newFlow(ns, fmt.Sprintf("flow-%04d", i), "eval-"+ns, subflowv1.StateRunning)
		flow.Spec.Selector = metav1.LabelSelector{MatchLabels: map[string]string{"app": "none"}}
		flow.Spec.PauseWhen = []subflowv1.PauseCondition{{Name: "db-down", Interval: &metav1.Duration{Duration: interval},
			Kubernetes: &subflowv1.ObjectConditionSource{APIVersion: "apps/v1", Kind: "Deployment", Name: fmt.Sprintf("db-%d", i%objects),
				ConditionType: "Available", Status: "False"}}}
		if err := k8s.Create(context.Background(), flow); err != nil {
			b.Fatal(err)
		}
	}
	testkit.Poll{Within: 5 * time.Minute, Every: time.Second}.Eventually(b, "every flow's first reading", func() bool {
		var list subflowv1.SubscriptionFlowList
		if err := k8s.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			return false
		}
		read := 0
		for _, f := range list.Items {
			if len(f.Status.PauseWhen) == 1 && f.Status.PauseWhen[0].Seen == "Available=True" {
				read++
			}
		}
		return read == flows
	})
	const window = 3 * interval
	b.ResetTimer()
	gets, all := apiRequests(b)
	cpu := processCPU(b)
	start := time.Now()
	<-time.After(window) // a measuring window of the wall clock, not a wait for an event
	elapsed := time.Since(start)
	gets2, all2 := apiRequests(b)
	cpu2 := processCPU(b)
	b.StopTimer()
	intervals := float64(elapsed) / float64(interval)
	b.ReportMetric(float64(gets2-gets)/intervals, "object-gets/interval")
	b.ReportMetric(float64(objects), "distinct-objects")
	b.ReportMetric(float64(all2-all)/intervals, "api-requests/interval")
	b.ReportMetric(testkit.Millis(cpu2-cpu)/intervals, "cpu-ms/interval")
	b.ReportMetric(float64(flows), "flows")
}

// apiRequests reads the API server's request counters: GETs of Deployments, and every request
// but the watches (which stay open) and the test's own reads of these metrics.
func apiRequests(b *testing.B) (deploymentGets, all int64) {
	b.Helper()
	cs, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		b.Fatal(err)
	}
	raw, err := cs.RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		b.Fatal(err)
	}
	for _, m := range families["apiserver_request_total"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		n := int64(m.GetCounter().GetValue())
		if labels["verb"] == "WATCH" || labels["verb"] == "CONNECT" || labels["resource"] == "" && labels["verb"] == "GET" {
			continue
		}
		all += n
		if labels["resource"] == "deployments" && labels["verb"] == "GET" {
			deploymentGets += n
		}
	}
	return deploymentGets, all
}

// processCPU is the CPU time this process has used, user and system.
func processCPU(b *testing.B) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
