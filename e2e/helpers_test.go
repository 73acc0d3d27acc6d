package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// kubectl runs kubectl as the cluster's administrator and fails the test on an error.
func kubectl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := w.cluster.Kubectl(context.Background(), args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// apply applies manifests given as YAML.
func apply(t testing.TB, manifests string) {
	t.Helper()
	path := t.TempDir() + "/m.yaml"
	writeFile(t, path, manifests)
	kubectl(t, "apply", "-f", path)
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// eventually polls fn every 200 ms until it returns nil, and fails with its last error after
// timeout.
func eventually(t testing.TB, timeout time.Duration, what string, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s: %v", what, timeout, err)
		}
		time.Sleep(200 * time.Millisecond) // polling interval
	}
}

// brokerService makes a Service without a selector, and its endpoints, for the broker on the
// host: how pods in a cluster reach a Pulsar run outside it. It returns the broker URL and the
// admin URL as pods use them (the Service's ClusterIP: the cluster has no DNS).
func brokerService(t testing.TB, ns string) (brokerURL, adminURL string) {
	apply(t, fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: pulsar, namespace: %[1]s}
spec:
  ports:
  - {name: pulsar, port: 6650, targetPort: %[2]s}
  - {name: http, port: 8080, targetPort: %[3]s}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: pulsar-host
  namespace: %[1]s
  labels: {kubernetes.io/service-name: pulsar}
addressType: IPv4
ports:
- {name: pulsar, port: %[2]s, protocol: TCP}
- {name: http, port: %[3]s, protocol: TCP}
endpoints:
- addresses: [%[4]q]
`, ns, w.brokerPort, w.adminPort, w.brokerIP))
	ip := strings.TrimSpace(kubectl(t, "get", "service", "pulsar", "-n", ns, "-o", "jsonpath={.spec.clusterIP}"))
	return "pulsar://" + ip + ":6650", "http://" + ip + ":8080"
}

// namespace creates a namespace (with labels, e.g. Pod Security) and deletes it at the test's end.
func namespace(t testing.TB, name string, labels ...string) {
	kubectl(t, "create", "namespace", name)
	if len(labels) > 0 {
		kubectl(t, append([]string{"label", "namespace", name}, labels...)...)
	}
	t.Cleanup(func() {
		// The flows go first, while the controller runs: it releases their pods.
		_, _ = w.cluster.Kubectl(context.Background(), "delete", "subscriptionflows", "--all", "-n", name, "--wait", "--timeout=60s")
		_, _ = w.cluster.Kubectl(context.Background(), "delete", "namespace", name, "--wait=false")
	})
}

// produce sends n unbatched messages "prefix-i" from the host and returns their payloads.
func produce(t *testing.T, topic, prefix string, n int) []string {
	t.Helper()
	testkit.ProduceUnbatched(t, w.pulsar, topic, prefix, n)
	sent := make([]string, n)
	for i := range sent {
		sent[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return sent
}

// printed reads what the app containers of the pods matching selector printed: the example
// consumer prints "<message id> <payload>" for each message it processed. It returns each
// payload's count.
func printed(t *testing.T, ns, selector, container string) map[string]int {
	t.Helper()
	counts, err := readPrinted(ns, selector, container)
	if err != nil {
		t.Fatal(err)
	}
	return counts
}

func readPrinted(ns, selector, container string) (map[string]int, error) {
	ctx := context.Background()
	pods, err := w.cluster.Kubectl(ctx, "get", "pods", "-n", ns, "-l", selector, "-o", "jsonpath={.items[*].metadata.name}")
	if err != nil {
		return nil, err
	}
	counts := map[string]int{}
	for _, pod := range strings.Fields(pods) {
		out, err := w.cluster.Kubectl(ctx, "logs", pod, "-n", ns, "-c", container)
		if err != nil {
			continue // a pod not started yet printed nothing
		}
		for _, line := range strings.Split(out, "\n") {
			if payload, ok := printedPayload(line); ok {
				counts[payload]++
			}
		}
	}
	return counts, nil
}

// printedPayload reads one line an application printed: the example consumer prints
// "<message id> <payload>", the stock-client peers a JSON object per event.
func printedPayload(line string) (string, bool) {
	if strings.HasPrefix(line, "{") {
		var ev struct{ Event, Value string }
		if json.Unmarshal([]byte(line), &ev) != nil || ev.Event != "message" {
			return "", false
		}
		return ev.Value, true
	}
	_, payload, ok := strings.Cut(line, " ")
	return payload, ok && strings.Contains(payload, "-")
}

// missing lists the payloads in want that counts does not have.
func missing(want []string, counts map[string]int) []string {
	var m []string
	for _, p := range want {
		if counts[p] == 0 {
			m = append(m, p)
		}
	}
	sort.Strings(m)
	return m
}

// subscriptionStats is the part of the broker's topic stats the tests read.
type subscriptionStats struct {
	MsgBacklog    int64 `json:"msgBacklog"`
	MsgOutCounter int64 `json:"msgOutCounter"`
	Consumers     []struct {
		ConsumerName     string `json:"consumerName"`
		AvailablePermits int64  `json:"availablePermits"`
	} `json:"consumers"`
}

// permits is the sum of the permits the broker holds for the subscription's consumers.
func (s subscriptionStats) permits() int64 {
	var n int64
	for _, c := range s.Consumers {
		n += c.AvailablePermits
	}
	return n
}

// stats reads the subscription's stats from the broker's admin API, as an operator would.
func stats(t *testing.T, topic, subscription string) subscriptionStats {
	t.Helper()
	name := strings.TrimPrefix(topic, "persistent://")
	resp, err := http.Get(w.admin + "/admin/v2/persistent/" + name + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var s struct {
		Subscriptions map[string]subscriptionStats `json:"subscriptions"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	return s.Subscriptions[subscription]
}
