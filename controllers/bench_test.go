package controllers_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/controllers"
	"github.com/subflow-dev/subflow/internal/testing/podsim"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// startAgents runs n simulated pods sharing one Pulsar client, each with one consumer of topic,
// and registers their Pod objects.
func startAgents(b *testing.B, ns, topic string, n int) []*podsim.Pod {
	b.Helper()
	return startPods(b, ns, topic, n, false)
}

// startPods starts n agent pods, or sidecar pods (each with its own client through its
// sidecar), and registers their Pod objects.
func startPods(b *testing.B, ns, topic string, n int, sidecars bool) []*podsim.Pod {
	b.Helper()
	shared, err := pulsar.NewClient(pulsar.ClientOptions{URL: broker.ServiceURL(), Logger: nopLogger})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(shared.Close)
	pods := make([]*podsim.Pod, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 32)
	for i := range pods {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			name := fmt.Sprintf("agent-%04d", i)
			p, err := podsim.Start(podsim.Options{Name: name, Client: shared, Token: testToken, Topic: topic,
				Subscription: "ingest", Type: pulsar.Shared, ReceiverQueueSize: 1,
				Sidecar: sidecars, ServiceURL: broker.ServiceURL()})
			if err != nil {
				errs <- err
				return
			}
			pods[i] = p
			createPod(b, ns, name, p.Port)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		for _, p := range pods {
			p.Close()
		}
	})
	return pods
}

// BenchmarkPausePropagation measures kubectl patch -> every agent's consumer Paused, through
// the real API server, controller and HTTP agents on loopback. Per-agent latencies come from
// each consumer's own state-change time (one sample per agent per round); "all" is when the
// last agent paused (one sample per round). At least 100 rounds run, so that a p99 is not
// simply the maximum of a handful.
//
// The hanging=1 variants add one matched pod whose agent accepts the connection and never
// answers: the figures are the healthy agents', to set beside the run without it. The
// sidecars=N variants are pods whose plain client goes through a protocol sidecar instead,
// paused through the same control API, to set beside agents=N.
func BenchmarkPausePropagation(b *testing.B) {
	for _, tc := range []struct {
		agents, hanging int
		sidecars        bool
	}{{10, 0, false}, {10, 1, false}, {100, 0, false}, {100, 1, false}, {1000, 0, false}, {10, 0, true}, {100, 0, true}, {1000, 0, true}} {
		name := fmt.Sprintf("agents=%d", tc.agents)
		if tc.sidecars {
			name = fmt.Sprintf("sidecars=%d", tc.agents)
		}
		if tc.hanging > 0 {
			name += fmt.Sprintf(",hanging=%d", tc.hanging)
		}
		n := tc.agents
		b.Run(name, func(b *testing.B) {
			ns := namespace(b, true)
			topic := "bench-" + ns
			pods := startPods(b, ns, topic, n, tc.sidecars)
			for i := range tc.hanging {
				startHangingAgent(b, ns, fmt.Sprintf("hanging-%d", i))
			}
			flow := newFlow(ns, "bench", topic, subflowv1.StateRunning)
			if err := k8s.Create(context.Background(), flow); err != nil {
				b.Fatal(err)
			}
			waitAll(b, pods, protocol.Running)
			// Warm-up cycle: the controller opens its keep-alive connections to every agent.
			patchBench(b, flow, `{"spec":{"state":"Paused"}}`)
			waitAll(b, pods, protocol.Paused)
			patchBench(b, flow, `{"spec":{"state":"Running"}}`)
			waitAll(b, pods, protocol.Running)
			var perAgent, all []time.Duration
			b.ResetTimer()
			for i := 0; i < max(b.N, minRounds); i++ {
				start := time.Now()
				patchBench(b, flow, `{"spec":{"state":"Paused"}}`)
				waitAll(b, pods, protocol.Paused)
				last := time.Duration(0)
				for _, p := range pods {
					d := p.Status().Since.Sub(start)
					perAgent = append(perAgent, d)
					last = max(last, d)
				}
				all = append(all, last)
				b.StopTimer()
				patchBench(b, flow, `{"spec":{"state":"Running"}}`)
				waitAll(b, pods, protocol.Running)
				b.StartTimer()
			}
			b.ReportMetric(testkit.Millis(testkit.Percentile(perAgent, 50)), "p50-ms")
			b.ReportMetric(testkit.Millis(testkit.Percentile(perAgent, 99)), "p99-ms")
			b.ReportMetric(float64(len(perAgent)), "agent-samples")
			b.ReportMetric(testkit.Millis(testkit.Percentile(all, 50)), "all-p50-ms")
			b.ReportMetric(testkit.Millis(testkit.Percentile(all, 99)), "all-p99-ms")
			b.ReportMetric(float64(len(all)), "rounds")
		})
	}
}

// BenchmarkFullResync measures a full resync - every flow reconciled and pushed to every
// matched agent - for 1000 flows x 10 pods, over at least 3 passes, and the process's resident
// memory afterwards. make bench runs it in a go test process of its own; the process also holds
// the test broker and the 10 agents, so the RSS is an upper bound for the controller. The
// suite's own manager resyncs hourly, so it stays idle once the flows are Ready.
func BenchmarkFullResync(b *testing.B) {
	const flows, podsPerFlow = 1000, 10
	ns := namespace(b, true)
	startAgents(b, ns, "resync-"+ns, podsPerFlow)
	var keys []client.ObjectKey
	for i := 0; i < flows; i++ {
		flow := newFlow(ns, fmt.Sprintf("flow-%04d", i), "", subflowv1.StatePaused)
		flow.Spec.Subscription = fmt.Sprintf("sub-%04d", i)
		if err := k8s.Create(context.Background(), flow); err != nil {
			b.Fatal(err)
		}
		keys = append(keys, client.ObjectKeyFromObject(flow))
	}
	waitAllFlowsSynced(b, ns, flows, podsPerFlow)
	r := &controllers.SubscriptionFlowReconciler{Client: cached, Scheme: k8s.Scheme(), Clock: clock,
		Agents: controllers.NewHTTPAgentClient(5*time.Second, nil)}
	passes := max(b.N, 3)
	b.ResetTimer()
	for range passes {
		resyncAll(b, r, keys)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(passes), "resync-ms")
	b.ReportMetric(float64(passes), "passes")
	b.ReportMetric(rssMiB(), "rss-MiB")
}

// waitAllFlowsSynced waits for the running controller's own first pass, so that the measured
// resync does not compete with it: every flow reconciled at its generation and pushed to its
// pods. Not Ready: the agents have no consumer of the flows' subscriptions, and a flow whose
// subscription has no consumer is not Ready.
func waitAllFlowsSynced(b *testing.B, ns string, n int, pods int32) {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var list subflowv1.SubscriptionFlowList
		if err := k8s.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			b.Fatal(err)
		}
		synced := 0
		var behind *subflowv1.SubscriptionFlow
		for i := range list.Items {
			f := &list.Items[i]
			if f.Status.ObservedGeneration == f.Generation && f.Status.Pods.Synced == pods {
				synced++
			} else if behind == nil {
				behind = f
			}
		}
		if synced == n {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d flows synced to their %d pods; %s is not: %+v", synced, n, pods, behind.Name, behind.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// resyncAll reconciles every flow with the manager's default concurrency.
func resyncAll(b *testing.B, r *controllers.SubscriptionFlowReconciler, keys []client.ObjectKey) {
	work := make(chan client.ObjectKey)
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for key := range work {
				if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: key}); err != nil {
					b.Error(err)
				}
			}
		}()
	}
	for _, key := range keys {
		work <- key
	}
	close(work)
	wg.Wait()
}

// startHangingAgent registers a pod whose agent accepts connections and never answers.
func startHangingAgent(b *testing.B, ns, name string) {
	b.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // the server notices the client leave only after the body
		<-r.Context().Done()
	}))
	b.Cleanup(srv.Close)
	createPod(b, ns, name, srv.Listener.Addr().(*net.TCPAddr).Port)
}

func patchBench(b *testing.B, flow *subflowv1.SubscriptionFlow, patch string) {
	if err := k8s.Patch(context.Background(), flow, client.RawPatch("application/merge-patch+json", []byte(patch))); err != nil {
		b.Fatal(err)
	}
}

func waitAll(b *testing.B, pods []*podsim.Pod, want protocol.State) {
	deadline := time.Now().Add(60 * time.Second)
	for _, p := range pods {
		for p.Status().State != want {
			if time.Now().After(deadline) {
				b.Fatalf("%s still %s, want %s", p.Name, p.Status().State, want)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
}

// rssMiB reads the resident set of this process (controller, agents and broker together, so an
// upper bound for the controller alone).
func rssMiB() float64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if fields := strings.Fields(line); len(fields) >= 2 && fields[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(fields[1], 64)
			return kb / 1024
		}
	}
	return 0
}

// BenchmarkReleaseAfterRelabel measures label change -> the relabelled pod's consumer runs
// again (its agent got the DELETE), one sample per pod: each round relabels 10 of 20 pods out
// of a Paused flow, then back. 10 rounds per iteration, so >= 100 samples.
func BenchmarkReleaseAfterRelabel(b *testing.B) {
	ns := namespace(b, true)
	topic := "release-" + ns
	pods := startAgents(b, ns, topic, 20)
	flow := newFlow(ns, "release", topic, subflowv1.StatePaused)
	if err := k8s.Create(context.Background(), flow); err != nil {
		b.Fatal(err)
	}
	waitAll(b, pods, protocol.Paused)
	moved := pods[:10]
	relabel := func(app string) {
		for _, p := range moved {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: p.Name}}
			patch := fmt.Sprintf(`{"metadata":{"labels":{"app":%q}}}`, app)
			if err := k8s.Patch(context.Background(), pod, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
				b.Fatal(err)
			}
		}
	}
	var samples []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for range 10 {
			start := time.Now()
			relabel("elsewhere")
			waitAll(b, moved, protocol.Running)
			for _, p := range moved {
				samples = append(samples, p.Consumer.Status().Since.Sub(start))
			}
			b.StopTimer()
			relabel("worker")
			waitAll(b, moved, protocol.Paused)
			b.StartTimer()
		}
	}
	reportLatencies(b, samples)
}

// BenchmarkNewPodReached measures a new matched pod's Pod object created -> its agent Paused
// by the controller's Pod watch (no resync), one sample per pod, 100 pods per iteration.
func BenchmarkNewPodReached(b *testing.B) {
	ns := namespace(b, true)
	topic := "reach-" + ns
	flow := newFlow(ns, "reach", topic, subflowv1.StatePaused)
	if err := k8s.Create(context.Background(), flow); err != nil {
		b.Fatal(err)
	}
	shared, err := pulsar.NewClient(pulsar.ClientOptions{URL: broker.ServiceURL(), Logger: nopLogger})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(shared.Close)
	var samples []time.Duration
	for i := 0; i < b.N; i++ {
		for j := range 100 {
			b.StopTimer()
			name := fmt.Sprintf("pod-%d-%02d", i, j)
			p, err := podsim.Start(podsim.Options{Name: name, Client: shared, Token: testToken, Topic: topic,
				Subscription: "ingest", Type: pulsar.Shared, ReceiverQueueSize: 1})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(p.Close)
			b.StartTimer()
			start := time.Now()
			createPod(b, ns, name, p.Port)
			waitAll(b, []*podsim.Pod{p}, protocol.Paused)
			samples = append(samples, p.Consumer.Status().Since.Sub(start))
		}
	}
	reportLatencies(b, samples)
}

// minRounds is the fewest rounds a latency benchmark runs, for >= 100 samples per figure.
const minRounds = 100

func reportLatencies(b *testing.B, samples []time.Duration) {
	b.ReportMetric(testkit.Millis(testkit.Percentile(samples, 50)), "p50-ms")
	b.ReportMetric(testkit.Millis(testkit.Percentile(samples, 99)), "p99-ms")
	b.ReportMetric(float64(len(samples)), "samples")
}
