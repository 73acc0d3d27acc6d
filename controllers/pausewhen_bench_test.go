package controllers_test

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/testkit"
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
