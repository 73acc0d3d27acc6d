package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// consumerDeployment is a Deployment of the example consumer (the Go agent linked in), opted in
// by its label only.
func consumerDeployment(ns, name string, replicas int, brokerURL, adminURL, topic, subscription string) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: %[2]s, namespace: %[1]s}
spec:
  replicas: %[3]d
  selector: {matchLabels: {app: %[2]s}}
  template:
    metadata:
      labels: {app: %[2]s, subflow.dev/inject: agent}
    spec:
      terminationGracePeriodSeconds: 5
      containers:
      - name: app
        image: %[4]s
        imagePullPolicy: IfNotPresent
        env:
        - {name: PULSAR_URL, value: %[5]q}
        - {name: PULSAR_ADMIN_URL, value: %[6]q}
        - {name: TOPIC, value: %[7]q}
        - {name: SUBSCRIPTION, value: %[8]q}
`, ns, name, replicas, image("subflow-example-consumer"), brokerURL, adminURL, topic, subscription)
}

func flow(ns, name, app, topic, subscription, state string) string {
	return fmt.Sprintf(`apiVersion: subflow.dev/v1alpha1
kind: SubscriptionFlow
metadata: {name: %[2]s, namespace: %[1]s}
spec:
  selector: {matchLabels: {app: %[3]s}}
  subscription: %[5]s
  topic: %[4]s
  state: %[6]s
`, ns, name, app, topic, subscription, state)
}

// TestPauseRolloutResume: Deployments of each kind of consumer - Go with the agent linked in,
// Java and Python behind the sidecar - onboarded by their label, are paused with kubectl patch
// during an incident; while Paused each Deployment is restarted and scaled up, and no pod - old
// or new - hands a message to the application, nor grants the broker a permit; after the resume
// every message produced is processed.
func TestPauseRolloutResume(t *testing.T) {
	kinds(t, everyConsumer, func(t *testing.T, k consumerKind) {
		ns, app, sub := namespaceFor("shop-roll", k), "orders-worker", "orders-ingest"
		topic := "persistent://public/default/" + ns
		selector := "app=" + app
		namespace(t, ns)
		k.deploy(t, ns, app, k.replicas, topic, sub, "")
		apply(t, flow(ns, sub, app, topic, sub, "Running"))
		kubectl(t, "rollout", "status", "deployment/"+app, "-n", ns, "--timeout=180s")
		kubectl(t, "wait", "sf/"+sub, "-n", ns, "--for=condition=Ready", "--timeout=120s")

		seen := map[string]int{} // every payload any pod printed, across pods that come and go
		collect := func() {
			for p, n := range printed(t, ns, selector, "app") {
				seen[p] = max(seen[p], n)
			}
		}
		before := produce(t, topic, "before", 30)
		eventually(t, 60*time.Second, "the messages produced before the pause are processed", func() error {
			collect()
			if m := missing(before, seen); len(m) > 0 {
				return fmt.Errorf("%d not processed, e.g. %s", len(m), m[0])
			}
			return nil
		})

		// The incident: pause with kubectl patch, wait as README says.
		kubectl(t, "patch", "sf", sub, "-n", ns, "--type", "merge", "-p", `{"spec":{"state":"Paused"}}`)
		kubectl(t, "wait", "sf/"+sub, "-n", ns, "--for=condition=Paused", "--timeout=60s")
		eventually(t, 60*time.Second, "every pod is reported paused", func() error {
			return pausedColumnIs(t, ns, sub, fmt.Sprintf("%d/%d", k.replicas, k.replicas))
		})
		permits := stats(t, topic, sub).permits()
		during := produce(t, topic, "during", 30)
		assertNothingProcessed(t, ns, selector, during, 5*time.Second)
		if now := stats(t, topic, sub).permits(); now > permits {
			t.Errorf("while Paused the consumers' permits at the broker grew from %d to %d", permits, now)
		}

		// Roll the consumers and scale up while Paused: the new pods consume nothing either.
		kubectl(t, "rollout", "restart", "deployment/"+app, "-n", ns)
		kubectl(t, "rollout", "status", "deployment/"+app, "-n", ns, "--timeout=180s")
		kubectl(t, "scale", "deployment/"+app, "-n", ns, fmt.Sprintf("--replicas=%d", k.replicas+1))
		kubectl(t, "rollout", "status", "deployment/"+app, "-n", ns, "--timeout=180s")
		eventually(t, 60*time.Second, "the restarted and added pods are reported paused", func() error {
			return pausedColumnIs(t, ns, sub, fmt.Sprintf("%d/%d", k.replicas+1, k.replicas+1))
		})
		assertNothingProcessed(t, ns, selector, during, 5*time.Second)
		s := stats(t, topic, sub)
		if s.MsgBacklog != int64(len(during)) {
			t.Errorf("while Paused the broker's backlog is %d, want the %d messages produced during the pause", s.MsgBacklog, len(during))
		}
		// A sidecar holds the first FLOW of a consumer born paused; the agent cannot stop the
		// client's (it holds what that grant brings: docs/design.md 3.5, Reconnect).
		if now := s.permits(); k.mode == "sidecar" && now != 0 {
			t.Errorf("the pods started while Paused granted the broker %d permits: %+v", now, s.Consumers)
		}

		// Resume: every message is processed.
		kubectl(t, "patch", "sf", sub, "-n", ns, "--type", "merge", "-p", `{"spec":{"state":"Running"}}`)
		eventually(t, 60*time.Second, "every message produced is processed after the resume", func() error {
			collect()
			if m := missing(append(before, during...), seen); len(m) > 0 {
				return fmt.Errorf("%d not processed, e.g. %s", len(m), m[0])
			}
			return nil
		})
		eventually(t, 30*time.Second, "the broker's backlog drains", func() error {
			if s := stats(t, topic, sub); s.MsgBacklog != 0 {
				return fmt.Errorf("backlog %d", s.MsgBacklog)
			}
			return nil
		})
	})
}

// assertPausedColumn checks kubectl get sf's PAUSED column, as an engineer reads it.
func assertPausedColumn(t *testing.T, ns, name, want string) {
	t.Helper()
	if err := pausedColumnIs(t, ns, name, want); err != nil {
		t.Fatal(err)
	}
}

func pausedColumnIs(t *testing.T, ns, name, want string) error {
	out := kubectl(t, "get", "sf", name, "-n", ns)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		return fmt.Errorf("kubectl get sf printed %q", out)
	}
	header, row := strings.Fields(lines[0]), strings.Fields(lines[1])
	for i, h := range header {
		if h == "PAUSED" && i < len(row) {
			if row[i] != want {
				return fmt.Errorf("PAUSED is %s, want %s:\n%s", row[i], want, out)
			}
			return nil
		}
	}
	return fmt.Errorf("no PAUSED column:\n%s", out)
}

// assertNothingProcessed watches the applications' output for the window: no payload of
// paused may appear. The window is an observation, not a synchronisation: a pause that leaks
// shows within it.
func assertNothingProcessed(t *testing.T, ns, selector string, paused []string, window time.Duration) {
	t.Helper()
	deadline := time.Now().Add(window)
	for {
		now := printed(t, ns, selector, "app")
		var leaked []string
		for _, p := range paused {
			if now[p] > 0 {
				leaked = append(leaked, p)
			}
		}
		if len(leaked) > 0 {
			t.Fatalf("while Paused the applications processed %d messages: %v", len(leaked), leaked)
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(500 * time.Millisecond) // polling interval of the observation
	}
}
