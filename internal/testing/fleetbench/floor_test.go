package fleetbench

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/controllers"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// BenchmarkAPIFloor measures, without any controller, what the API server of these benchmarks
// takes for the calls one reconcile of a flow transition makes - read the token Secret, write
// status, post an event - for 100 flows at once, from 8 or 32 clients in parallel. It is the
// floor under "100 flows x 10 pods patched together" on this machine, whatever the controller
// does with its pushes.
func BenchmarkAPIFloor(b *testing.B) {
	for _, workers := range []int{8, 32} {
		for _, calls := range []string{"status", "secret+status+event"} {
			b.Run(fmt.Sprintf("flows=100,workers=%d,calls=%s", workers, calls), func(b *testing.B) {
				s := shape{flows: 100, namespaces: 10, state: subflowv1.StateRunning}
				w := newWorld(b, s)
				var all []time.Duration
				w.cpuTimed = Metrics{}
				rounds := max(b.N, envInt("FLEETBENCH_ROUNDS", 100))
				b.ResetTimer()
				for round := range rounds {
					w.timed(func(start time.Time) {
						w.eachFlow(b, workers, func(f flowRef) error { return w.transition(f, int64(round+1), calls != "status") })
						all = append(all, time.Since(start))
					})
				}
				b.StopTimer()
				b.ReportMetric(testkit.Millis(testkit.Percentile(all, 50)), "all-p50-ms")
				b.ReportMetric(testkit.Millis(testkit.Percentile(all, 99)), "all-p99-ms")
				b.ReportMetric(float64(len(all)), "rounds")
				for _, name := range []string{"apiserver", "etcd", "bench"} {
					b.ReportMetric(w.cpuTimed["cpu:"+name]/float64(rounds), "cpu-"+name+"-s/round")
				}
			})
		}
	}
}

// eachFlow runs do for every flow on n goroutines.
func (w *world) eachFlow(b *testing.B, n int, do func(flowRef) error) {
	work := make(chan flowRef)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for f := range work {
				if err := do(f); err != nil {
					mu.Lock()
					first = cmpOr(first, err)
					mu.Unlock()
				}
			}
		}()
	}
	for _, f := range w.flows {
		work <- f
	}
	close(work)
	wg.Wait()
	must(b, first)
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// transition makes the API calls of one reconcile that changes a flow's state.
func (w *world) transition(f flowRef, revision int64, all bool) error {
	ctx := context.Background()
	if all {
		var secret corev1.Secret
		if err := w.c.Get(ctx, types.NamespacedName{Namespace: f.key.Namespace, Name: controllers.DefaultTokenSecret}, &secret); err != nil {
			return err
		}
	}
	flow := &subflowv1.SubscriptionFlow{ObjectMeta: metav1.ObjectMeta{Namespace: f.key.Namespace, Name: f.key.Name}}
	patch := fmt.Sprintf(`{"status":{"revision":%d,"observedGeneration":1,"conditions":[{"type":"Ready","status":"True","reason":"AgentsSynced",`+
		`"message":"revision %d","lastTransitionTime":%q}]}}`, revision, revision, time.Now().UTC().Format(time.RFC3339))
	if err := w.c.Status().Patch(ctx, flow, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		return err
	}
	if !all {
		return nil
	}
	return w.c.Create(ctx, &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.key.Namespace, GenerateName: f.key.Name + "-"},
		EventTime:  metav1.NewMicroTime(time.Now()), ReportingController: "fleetbench", ReportingInstance: "fleetbench",
		Action: "Reconcile", Reason: "Paused", Type: corev1.EventTypeNormal, Note: "floor",
		Regarding: corev1.ObjectReference{Kind: "SubscriptionFlow", Namespace: f.key.Namespace, Name: f.key.Name, APIVersion: subflowv1.GroupVersion.String()},
	})
}
