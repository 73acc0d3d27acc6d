package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/testing/testenv"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// TestMonitoringQueriesReturnSeries scrapes the demo's controller and agents with a real
// Prometheus, pauses the flow, and checks that every Grafana dashboard query and every metric
// selector of every alert returns series; then resumes and sees Prometheus follow.
func TestMonitoringQueriesReturnSeries(t *testing.T) {
	testkit.PrometheusBinary(t) // before the world starts: skip early without it
	if testing.Short() {
		t.Skip("runs the demo's world and Prometheus")
	}
	checks, skips := monitoringQueries(t)
	defined, err := ksmConfigMetrics(filepath.Join(testenv.RepoRoot(), "config", "monitoring", "kube-state-metrics.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := checkSkips(skips, defined); err != nil {
		t.Fatal(err)
	}
	for _, s := range skips {
		t.Logf("skipped (%s come from kube-state-metrics, which the demo does not run): %s: %s",
			strings.Join(s.metrics, ", "), s.where, s.promQL)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	started := time.Now()
	w, err := startWorld(ctx, 3, brokerURLs{})
	if w != nil {
		t.Cleanup(w.close)
	}
	if err != nil {
		t.Fatal(err)
	}
	prom := startPrometheus(t, w)
	t.Logf("world and Prometheus up after %s", time.Since(started).Round(time.Millisecond))
	prom.waitForTargets(t, 1+len(w.pods))

	d := &demo{w: w}
	if err := d.createFlow(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.pause(ctx); err != nil {
		t.Fatal(err)
	}
	// A matched pod whose agent is gone: the push to it fails (the push errors panel) and the
	// flow counts an Unreachable agent.
	gone := addPodWithoutAgent(ctx, t, w)

	phase := time.Now()
	if missing := prom.waitForSeries(t, checks, 30*time.Second); len(missing) > 0 {
		for _, q := range missing {
			t.Errorf("no series while paused: %s: %s", q.where, q.promQL)
		}
		t.Log(prom.targets())
		t.FailNow()
	}
	t.Logf("all %d queries returned series %s after the pause (%d skipped)", len(checks),
		time.Since(phase).Round(time.Millisecond), len(skips))
	if n, err := prom.series(`subflow_flow_pausd{namespace=~"shop"}`); err != nil || n != 0 {
		t.Fatalf("a misspelt metric gave %d series, %v: the check cannot tell a wrong query", n, err)
	}
	// The alerts whose condition the demo now shows: their expressions (without `for`) match.
	firing := alertQueries(t, "SubflowFlowPausedTooLong", "SubflowAgentsUnreachable")
	if missing := prom.waitForSeries(t, firing, 30*time.Second); len(missing) > 0 {
		for _, q := range missing {
			t.Errorf("%s does not match a flow paused by spec with an unreachable agent: %s", q.where, q.promQL)
		}
	}

	if err := w.k8s.Delete(ctx, gone); err != nil {
		t.Fatal(err)
	}
	if err := d.patch(ctx, `{"spec":{"state":"Running"}}`); err != nil {
		t.Fatal(err)
	}
	if err := d.waitFor(ctx, "Running again", func(f *subflowv1.SubscriptionFlow) bool {
		return ready(f) && f.Status.EffectiveState == subflowv1.StateRunning && f.Status.Consumers.Running == int32(len(w.pods))
	}); err != nil {
		t.Fatal(err)
	}
	resumed := []query{
		{"the flow is not paused", fmt.Sprintf(`subflow_flow_paused{namespace="shop", name=%q, state="Running"} == 0`, flowName)},
		{"every agent runs its consumer", fmt.Sprintf(`sum(subflow_agent_consumer_state{namespace="shop", state="Running"}) == %d`, len(w.pods))},
		{"no agent is unreachable", fmt.Sprintf(`subflow_flow_agents{namespace="shop", name=%q, state="Unreachable"} == 0`, flowName)},
	}
	if missing := prom.waitForSeries(t, resumed, 30*time.Second); len(missing) > 0 {
		for _, q := range missing {
			t.Errorf("after the resume, Prometheus does not show that %s: %s", q.where, q.promQL)
		}
	}
	t.Logf("whole run %s", time.Since(started).Round(time.Millisecond))
}

// alertQueries returns the expressions of the named alerts.
func alertQueries(t *testing.T, names ...string) []query {
	t.Helper()
	rules, err := ruleQueries(filepath.Join(testenv.RepoRoot(), "config", "monitoring", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var out []query
	for _, name := range names {
		i := slices.IndexFunc(rules, func(q query) bool { return q.where == "alert "+name })
		if i < 0 {
			t.Fatalf("prometheusrule.yaml has no alert %s", name)
		}
		out = append(out, rules[i])
	}
	return out
}

// addPodWithoutAgent registers a matched, running Pod whose agent port has nothing listening.
func addPodWithoutAgent(ctx context.Context, t *testing.T, w *world) *corev1.Pod {
	t.Helper()
	addr, err := freeLoopbackAddr()
	if err != nil {
		t.Fatal(err)
	}
	var port int
	if _, err := fmt.Sscanf(addr[strings.LastIndexByte(addr, ':')+1:], "%d", &port); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "orders-worker-gone", Labels: map[string]string{"app": "orders-worker"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Image: "orders-worker:demo",
			Ports: []corev1.ContainerPort{{Name: "subflow", ContainerPort: int32(port)}}}}},
	}
	if err := w.k8s.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1"}
	if err := w.k8s.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	return pod
}

// promServer is a running Prometheus and its HTTP API.
type promServer struct {
	url string
}

// startPrometheus starts a real Prometheus scraping the world's controller and agents.
func startPrometheus(t *testing.T, w *world) *promServer {
	t.Helper()
	config, err := scrapeConfig(w)
	if err != nil {
		t.Fatal(err)
	}
	return &promServer{url: testkit.StartPrometheus(t, config)}
}

// scrapeConfig scrapes every second: the controller with honor_labels (its series carry the
// flow's namespace), each agent with the namespace and pod labels Kubernetes discovery adds.
func scrapeConfig(w *world) ([]byte, error) {
	type staticConfig struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	agents := []staticConfig{}
	for _, p := range w.pods {
		agents = append(agents, staticConfig{[]string{fmt.Sprintf("127.0.0.1:%d", p.Port)},
			map[string]string{"namespace": namespace, "pod": p.Name}})
	}
	return yaml.Marshal(map[string]any{
		"global": map[string]string{"scrape_interval": "1s", "evaluation_interval": "1s"},
		"scrape_configs": []map[string]any{
			{"job_name": "subflow-controller", "honor_labels": true, "static_configs": []staticConfig{
				{[]string{w.metricsAddr}, map[string]string{"namespace": "subflow-system"}}}},
			{"job_name": "subflow-agents", "static_configs": agents},
		},
	})
}

// series runs an instant query and counts the series it returns; a query Prometheus rejects is
// an error.
func (p *promServer) series(promQL string) (int, error) {
	resp, err := http.Get(p.url + "/api/v1/query?" + url.Values{"query": {promQL}}.Encode())
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string            `json:"resultType"`
			Result     []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return 0, fmt.Errorf("HTTP %d: %w", resp.StatusCode, err)
	}
	if body.Status != "success" {
		return 0, fmt.Errorf("HTTP %d: %s", resp.StatusCode, body.Error)
	}
	if body.Data.ResultType != "vector" && body.Data.ResultType != "matrix" {
		return 0, fmt.Errorf("result type %s, not series", body.Data.ResultType)
	}
	return len(body.Data.Result), nil
}

// waitForSeries polls the queries until each has returned series once, and returns those that
// never did within timeout. A query Prometheus rejects fails the test at once.
func (p *promServer) waitForSeries(t *testing.T, queries []query, timeout time.Duration) []query {
	t.Helper()
	pending := queries
	testkit.Poll{Within: timeout, Every: 250 * time.Millisecond}.Until(func() bool {
		var still []query
		for _, q := range pending {
			n, err := p.series(q.promQL)
			if err != nil {
				t.Fatalf("%s: %s: %v", q.where, q.promQL, err)
			}
			if n == 0 {
				still = append(still, q)
			}
		}
		pending = still
		return len(still) == 0
	})
	return pending
}

// waitForTargets waits until Prometheus scrapes n targets successfully.
func (p *promServer) waitForTargets(t *testing.T, n int) {
	t.Helper()
	q := []query{{"every target is up", fmt.Sprintf(`count(up == 1) == %d`, n)}}
	if missing := p.waitForSeries(t, q, 30*time.Second); len(missing) > 0 {
		t.Fatalf("fewer than %d targets up after 30s:\n%s", n, p.targets())
	}
}

// targets describes the scrape targets' health, for failure messages.
func (p *promServer) targets() string {
	resp, err := http.Get(p.url + "/api/v1/targets")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var body struct {
		Data struct {
			ActiveTargets []struct {
				ScrapeURL string `json:"scrapeUrl"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"activeTargets"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return err.Error()
	}
	var lines []string
	for _, target := range body.Data.ActiveTargets {
		lines = append(lines, fmt.Sprintf("target %s: %s %s", target.ScrapeURL, target.Health, target.LastError))
	}
	return strings.Join(lines, "\n")
}
