package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/subflow-dev/subflow/agent/protocol"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// minRounds makes a p99 more than the maximum of a handful of samples.
const minRounds = 30

// BenchmarkSuiteSetup reports how long the suite's setup took in this process: one sample of
// each step, as a user starting the suite meets them. The cluster's start is its components'
// start, the images' import and the node's readiness (the node's binaries and the images were
// built before); then the broker's start on the host, and helm install --wait of the chart with
// two replicas.
func BenchmarkSuiteSetup(b *testing.B) {
	for range b.N {
		// The steps ran once, before any test or benchmark: nothing here repeats them.
	}
	b.ReportMetric(w.setup.cluster.Seconds(), "cluster-start-s")
	b.ReportMetric(w.setup.broker.Seconds(), "broker-start-s")
	b.ReportMetric(w.setup.chart.Seconds(), "chart-install-s")
	b.ReportMetric(1, "samples")
}

// BenchmarkPatchToEveryPodPaused measures kubectl patch -> every real pod's consumer Paused, on
// the real cluster: 10 pods of a Deployment of the example consumer, the installed controller,
// the broker on the host. Each pod's agent is asked for its state (GET /subflow/v1/state at the
// pod's IP, with the namespace's token); a consumer's latency is its own state-change time
// minus the patch's start (one clock: the pods run on this machine). "all" is the last pod's.
func BenchmarkPatchToEveryPodPaused(b *testing.B) {
	const ns, app, sub, pods = "bench-patch", "orders-worker", "orders-ingest", 10
	topic := "persistent://public/default/" + ns
	namespace(b, ns)
	brokerURL, adminURL := brokerService(b, ns)
	apply(b, consumerDeployment(ns, app, pods, brokerURL, adminURL, topic, sub))
	apply(b, flow(ns, sub, app, topic, sub, "Running"))
	kubectl(b, "rollout", "status", "deployment/"+app, "-n", ns, "--timeout=180s")
	kubectl(b, "wait", "sf/"+sub, "-n", ns, "--for=condition=Ready", "--timeout=120s")
	agents := podAgents(b, ns, "app="+app)
	patch := func(state string) time.Time {
		start := time.Now()
		kubectl(b, "patch", "sf", sub, "-n", ns, "--type", "merge", "-p", `{"spec":{"state":"`+state+`"}}`)
		return start
	}
	waitAll := func(state protocol.State) []time.Time {
		var since []time.Time
		eventually(b, 60*time.Second, "every pod "+string(state), func() error {
			since = since[:0]
			for _, a := range agents {
				t, err := a.since(state)
				if err != nil {
					return err
				}
				since = append(since, t)
			}
			return nil
		})
		return since
	}
	patch("Paused") // warm-up: the controller's connections to every pod
	waitAll(protocol.Paused)
	patch("Running")
	waitAll(protocol.Running)

	var perPod, all []time.Duration
	b.ResetTimer()
	for i := 0; i < max(b.N, minRounds); i++ {
		start := patch("Paused")
		last := time.Duration(0)
		for _, t := range waitAll(protocol.Paused) {
			perPod = append(perPod, t.Sub(start))
			last = max(last, t.Sub(start))
		}
		all = append(all, last)
		b.StopTimer()
		patch("Running")
		waitAll(protocol.Running)
		b.StartTimer()
	}
	b.ReportMetric(testkit.Millis(testkit.Percentile(perPod, 50)), "p50-ms")
	b.ReportMetric(testkit.Millis(testkit.Percentile(perPod, 99)), "p99-ms")
	b.ReportMetric(float64(len(perPod)), "pod-samples")
	b.ReportMetric(testkit.Millis(testkit.Percentile(all, 50)), "all-p50-ms")
	b.ReportMetric(testkit.Millis(testkit.Percentile(all, 99)), "all-p99-ms")
	b.ReportMetric(float64(len(all)), "rounds")
}

// podAgent is one pod's agent, asked as the controller asks it.
type podAgent struct{ url, token string }

func podAgents(tb testing.TB, ns, selector string) []podAgent {
	token := kubectl(tb, "get", "secret", "subflow-agent-token", "-n", ns, "-o", `go-template={{.data.token | base64decode}}`)
	var agents []podAgent
	for _, ip := range strings.Fields(kubectl(tb, "get", "pods", "-n", ns, "-l", selector, "-o", "jsonpath={.items[*].status.podIP}")) {
		agents = append(agents, podAgent{url: fmt.Sprintf("http://%s:%d%s/state", ip, protocol.DefaultPort, protocol.PathPrefix), token: token})
	}
	return agents
}

// since is when the pod's consumers all reached state (the latest of their change times), or an
// error while one is elsewhere.
func (a podAgent) since(state protocol.State) (time.Time, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.url, nil)
	if err != nil {
		return time.Time{}, err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return time.Time{}, err
	}
	defer resp.Body.Close()
	var s protocol.AgentState
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		return time.Time{}, err
	}
	if len(s.Consumers) == 0 {
		return time.Time{}, fmt.Errorf("%s: no consumer", a.url)
	}
	var latest time.Time
	for _, c := range s.Consumers {
		if c.State != state {
			return time.Time{}, fmt.Errorf("%s: consumer %s", a.url, c.State)
		}
		if c.Since.After(latest) {
			latest = c.Since
		}
	}
	return latest, nil
}
