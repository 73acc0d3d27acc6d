package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// dependencyDeployment is a stand-in for a database the consumers depend on: one pod of the
// example consumer, not opted in to subflow, consuming a topic of its own, whose readiness
// probe connects to probePort (the agent's control port, 9470, passes; any other fails).
// Recreate, as for a database: a changed probe replaces the pod instead of keeping the old one
// available beside it.
func dependencyDeployment(ns, name, brokerURL, adminURL string, probePort int) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: %[2]s, namespace: %[1]s}
spec:
  replicas: 1
  strategy: {type: Recreate}
  selector: {matchLabels: {app: %[2]s}}
  template:
    metadata:
      labels: {app: %[2]s}
    spec:
      terminationGracePeriodSeconds: 5
      containers:
      - name: db
        image: %[3]s
        imagePullPolicy: IfNotPresent
        env:
        - {name: PULSAR_URL, value: %[4]q}
        - {name: PULSAR_ADMIN_URL, value: %[5]q}
        - {name: TOPIC, value: "persistent://public/default/%[1]s-%[2]s"}
        - {name: SUBSCRIPTION, value: %[2]q}
        readinessProbe:
          tcpSocket: {port: %[6]d}
          periodSeconds: 1
          failureThreshold: 1
`, ns, name, image("subflow-example-consumer"), brokerURL, adminURL, probePort)
}

// pauseWhenFlow is a Running flow that pauses itself while Deployment dependency is not
// Available, read every 2 s, and resumes after 10 s of it being Available.
func pauseWhenFlow(ns, name, app, topic, subscription, dependency string) string {
	return flow(ns, name, app, topic, subscription, "Running") + fmt.Sprintf(`  pauseWhen:
  - name: %[1]s-down
    kubernetes: {apiVersion: apps/v1, kind: Deployment, name: %[1]s, conditionType: Available, status: "False"}
    interval: 2s
    resumeAfter: 10s
`, dependency)
}

// TestPauseWhenDependencyUnavailable: README's "A flow that pauses itself when its dependency
// fails" on a real cluster. The consumers' database Deployment loses its readiness (a probe
// that fails, as a database that stops answering), Available turns False, and the flow pauses
// itself: effective state Paused from the source Condition, the AutoPaused condition and event
// naming the condition and what was seen, kubectl subflow status showing it HOLDS, no message
// processed and no permit granted to the broker. Once the database is Available again and has
// stayed so for resumeAfter, the flow runs again, says so in an AutoResumed event, and every
// message produced is processed.
func TestPauseWhenDependencyUnavailable(t *testing.T) {
	const (
		ns, app, sub, db  = "shop-pausewhen", "orders-worker", "orders-ingest", "orders-db"
		goodPort, badPort = 9470, 9471 // the agent's control port; nothing listens on the other
		resumeAfter       = 10 * time.Second
	)
	topic := "persistent://public/default/" + ns
	selector := "app=" + app
	namespace(t, ns)
	t.Cleanup(func() { dumpOnFailure(t, ns) })
	brokerURL, adminURL := brokerService(t, ns)
	apply(t, dependencyDeployment(ns, db, brokerURL, adminURL, goodPort))
	// The database is up before the flow names it: its first reading is Available=True.
	kubectl(t, "rollout", "status", "deployment/"+db, "-n", ns, "--timeout=180s")
	apply(t, pauseWhenFlow(ns, sub, app, topic, sub, db))
	// The consumers start once the controller has made the namespace's token Secret: a pod
	// started before it reads its token only when the kubelet resyncs the volume.
	eventually(t, 30*time.Second, "the controller creates the agent token Secret", func() error {
		_, err := w.cluster.Kubectl(context.Background(), "get", "secret", "subflow-agent-token", "-n", ns)
		return err
	})
	goAgent.deploy(t, ns, app, 2, topic, sub, "")
	kubectl(t, "rollout", "status", "deployment/"+app, "-n", ns, "--timeout=180s")
	// Ready is True before the pods are matched (NoMatchingPods): wait for both consumers.
	eventually(t, 60*time.Second, "both consumers are reported running", func() error { return pausedColumnIs(t, ns, sub, "0/2") })
	kubectl(t, "wait", "sf/"+sub, "-n", ns, "--for=condition=Ready", "--timeout=120s")
	eventually(t, 30*time.Second, "the condition is read and does not hold", func() error {
		return flowIs(t, ns, sub, "Running", "Spec", "False", "Available=True")
	})
	if out := flowEvents(t, ns, sub, "AutoPaused"); out != "" {
		t.Fatalf("the flow paused itself while its database was up: %s", out)
	}

	seen := map[string]int{} // every payload any pod printed
	collect := func() {
		for p, n := range printed(t, ns, selector, "app") {
			seen[p] = max(seen[p], n)
		}
	}
	waitProcessed := func(what string, want []string) {
		t.Helper()
		eventually(t, 60*time.Second, what, func() error {
			collect()
			if m := missing(want, seen); len(m) > 0 {
				return fmt.Errorf("%d of %d not processed, e.g. %s", len(m), len(want), m[0])
			}
			return nil
		})
	}
	before := produce(t, topic, "before", 20)
	waitProcessed("the messages produced while the database is up are processed", before)

	// The database stops answering its readiness probe; Recreate replaces its only pod, and the
	// new one never becomes ready.
	broke := time.Now()
	setProbePort(t, ns, db, badPort)
	eventually(t, 60*time.Second, "the database Deployment is not Available", func() error {
		return deploymentAvailableIs(t, ns, db, "False")
	})
	eventually(t, 30*time.Second, "the flow pauses itself", func() error {
		return flowIs(t, ns, sub, "Paused", "Condition", "True", db+"-down", "Available=False")
	})
	t.Logf("probe broken -> flow Paused by its condition: %.1fs", time.Since(broke).Seconds())
	kubectl(t, "wait", "sf/"+sub, "-n", ns, "--for=condition=Paused", "--timeout=60s")
	eventually(t, 30*time.Second, "every pod is reported paused", func() error { return pausedColumnIs(t, ns, sub, "2/2") })
	eventually(t, 30*time.Second, "an AutoPaused event names the condition", func() error {
		return eventSays(t, ns, sub, "AutoPaused", "condition "+db+"-down holds", "Available=False")
	})
	status := kubectl(t, "subflow", "status", sub, "-n", ns)
	if !strings.Contains(status, db+"-down") || !strings.Contains(status, "HOLDS") || !strings.Contains(status, "Available=False") {
		t.Errorf("kubectl subflow status does not show %s-down holding on Available=False:\n%s", db, status)
	}

	permits := stats(t, topic, sub).permits()
	during := produce(t, topic, "during", 20)
	assertNothingProcessed(t, ns, selector, during, 5*time.Second)
	s := stats(t, topic, sub)
	if s.MsgBacklog != int64(len(during)) {
		t.Errorf("while Paused the broker's backlog is %d, want the %d messages produced during the pause", s.MsgBacklog, len(during))
	}
	if now := s.permits(); now > permits {
		t.Errorf("while Paused the consumers' permits at the broker grew from %d to %d", permits, now)
	}

	// The database answers again. The flow stays Paused until it has been Available for
	// resumeAfter, then runs and processes everything.
	setProbePort(t, ns, db, goodPort)
	eventually(t, 60*time.Second, "the database Deployment is Available again", func() error {
		return deploymentAvailableIs(t, ns, db, "True")
	})
	eventually(t, 60*time.Second, "the flow runs again", func() error {
		return flowIs(t, ns, sub, "Running", "Spec", "False", "Available=True")
	})
	// When each turned, by the API server's records (whole seconds): the Deployment's Available
	// and the flow's AutoPaused conditions.
	available := conditionSince(t, "deployment", ns, db, "Available")
	resumed := conditionSince(t, "sf", ns, sub, "AutoPaused")
	if held := resumed.Sub(available); held < resumeAfter-time.Second {
		t.Errorf("the flow ran again %s after its database was Available (%s), before resumeAfter (%s)", held, available.Format(time.RFC3339), resumeAfter)
	}
	t.Logf("database Available again -> the condition no longer holds: %s (resumeAfter %s, interval 2s)", resumed.Sub(available), resumeAfter)
	eventually(t, 30*time.Second, "an AutoResumed event names the condition", func() error {
		return eventSays(t, ns, sub, "AutoResumed", "condition "+db+"-down does not hold", "Available=True")
	})
	after := produce(t, topic, "after", 10)
	all := append(append(append([]string{}, before...), during...), after...)
	waitProcessed("every message produced is processed after the resume", all)
	eventually(t, 30*time.Second, "the broker's backlog drains", func() error {
		if s := stats(t, topic, sub); s.MsgBacklog != 0 {
			return fmt.Errorf("backlog %d", s.MsgBacklog)
		}
		return nil
	})
}

// setProbePort points the Deployment's readiness probe at port, as kubectl patch does it.
func setProbePort(t *testing.T, ns, name string, port int) {
	t.Helper()
	kubectl(t, "patch", "deployment", name, "-n", ns, "--type", "json", "-p",
		fmt.Sprintf(`[{"op":"replace","path":"/spec/template/spec/containers/0/readinessProbe/tcpSocket/port","value":%d}]`, port))
}

// deploymentAvailableIs checks the Deployment's Available condition, as kubectl shows it.
func deploymentAvailableIs(t *testing.T, ns, name, want string) error {
	got := strings.TrimSpace(kubectl(t, "get", "deployment", name, "-n", ns,
		"-o", `jsonpath={.status.conditions[?(@.type=="Available")].status}`))
	if got != want {
		return fmt.Errorf("Available is %q, want %q", got, want)
	}
	return nil
}

// conditionSince is the lastTransitionTime of a condition of an object.
func conditionSince(t *testing.T, kind, ns, name, condition string) time.Time {
	t.Helper()
	out := strings.TrimSpace(kubectl(t, "get", kind, name, "-n", ns,
		"-o", fmt.Sprintf(`jsonpath={.status.conditions[?(@.type==%q)].lastTransitionTime}`, condition)))
	at, err := time.Parse(time.RFC3339, out)
	if err != nil {
		t.Fatalf("%s %s condition %s: lastTransitionTime %q: %v", kind, name, condition, out, err)
	}
	return at
}

// flowIs checks the flow's effective state, what decided it, and its AutoPaused condition: its
// status and words its message must contain.
func flowIs(t *testing.T, ns, name, state, source, autoPaused string, words ...string) error {
	out := kubectl(t, "get", "sf", name, "-n", ns, "-o", `jsonpath={.status.effectiveState}|{.status.stateSource}|`+
		`{.status.conditions[?(@.type=="AutoPaused")].status}|{.status.conditions[?(@.type=="AutoPaused")].message}`)
	f := strings.SplitN(out, "|", 4)
	if len(f) != 4 {
		return fmt.Errorf("kubectl get sf printed %q", out)
	}
	if f[0] != state || f[1] != source || f[2] != autoPaused {
		return fmt.Errorf("effectiveState %q stateSource %q AutoPaused %q (%s), want %s %s %s", f[0], f[1], f[2], f[3], state, source, autoPaused)
	}
	for _, w := range words {
		if !strings.Contains(f[3], w) {
			return fmt.Errorf("the AutoPaused condition's message %q does not say %q", f[3], w)
		}
	}
	return nil
}

// eventSays checks that an event with reason about the flow has a message containing words.
func eventSays(t *testing.T, ns, flow, reason string, words ...string) error {
	out := flowEvents(t, ns, flow, reason)
	for _, msg := range strings.Split(out, "\n") {
		ok := msg != ""
		for _, w := range words {
			ok = ok && strings.Contains(msg, w)
		}
		if ok {
			return nil
		}
	}
	return fmt.Errorf("no %s event says %q; the %s events: %q", reason, words, reason, out)
}

// flowEvents lists the messages of the flow's events with reason, one a line.
func flowEvents(t *testing.T, ns, flow, reason string) string {
	return strings.TrimSpace(kubectl(t, "get", "events", "-n", ns, "--field-selector", "reason="+reason+",involvedObject.name="+flow,
		"-o", `jsonpath={range .items[*]}{.message}{"\n"}{end}`))
}

// dumpOnFailure logs what a user would look at when the test failed: the flows, the pods, the
// namespace's events and the tail of the controllers' logs.
func dumpOnFailure(t *testing.T, ns string) {
	if !t.Failed() {
		return
	}
	ctx := context.Background()
	for _, args := range [][]string{
		{"get", "sf", "-n", ns, "-o", "yaml"},
		{"get", "deployments,pods", "-n", ns, "-o", "wide"},
		{"get", "events", "-n", ns, "--sort-by=.lastTimestamp"},
		{"logs", "-n", "subflow-system", "-l", "app.kubernetes.io/component=controller", "--tail=60", "--prefix"},
	} {
		out, err := w.cluster.Kubectl(ctx, args...)
		t.Logf("kubectl %s (%v):\n%s", strings.Join(args, " "), err, out)
	}
}
