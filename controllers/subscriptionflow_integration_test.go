package controllers_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/controllers"
	"github.com/subflow-dev/subflow/internal/testing/podsim"
)

var nopLogger = log.DefaultNopLogger()

func TestPatchPausedStopsEveryAgentAndResumeLosesNothing(t *testing.T) {
	ns := namespace(t, true)
	topic := "orders-" + ns
	pods := []*podsim.Pod{startPod(t, ns, "worker-0", topic, testToken), startPod(t, ns, "worker-1", topic, testToken),
		startPod(t, ns, "worker-2", topic, testToken)}
	flow := newFlow(ns, "orders", topic, subflowv1.StateRunning)
	create(t, flow)
	produce(t, topic, "before", 100)
	eventually(t, "100 messages consumed while Running", func() bool { return totalReceived(pods...) == 100 })
	waitFlow(t, flow, "Ready while Running", func(f *subflowv1.SubscriptionFlow) bool { return isTrue(f, subflowv1.ConditionReady) })

	patchFlow(t, flow, `{"spec":{"state":"Paused"}}`)
	got := waitFlow(t, flow, "Ready and Paused", func(f *subflowv1.SubscriptionFlow) bool {
		return current(f) && isTrue(f, subflowv1.ConditionReady) && isTrue(f, subflowv1.ConditionPaused)
	})
	if got.Status.Consumers.Paused != 3 || got.Status.Consumers.Total != 3 || got.Status.Consumers.Halted != "3/3" {
		t.Fatalf("consumers %+v, want 3/3 paused", got.Status.Consumers)
	}
	if got.Status.EffectiveState != subflowv1.StatePaused || got.Status.StateSource != subflowv1.SourceSpec {
		t.Fatalf("effective %s from %s", got.Status.EffectiveState, got.Status.StateSource)
	}
	for _, p := range pods {
		if p.Consumer.State() != protocol.Paused {
			t.Fatalf("%s is %s after Paused=True", p.Name, p.Consumer.State())
		}
	}
	barrier(t, pods)
	flowsAtPause := len(broker.Flows(topic, "ingest"))
	deliveredAtPause := totalReceived(pods...)

	produce(t, topic, "during", 100)
	// The broker dispatches what permits remain (at most a receiver queue per consumer); the gate
	// holds it. Nothing reaches the application and no new permit is granted.
	eventually(t, "backlog to build on the broker", func() bool { return broker.Subscription(topic, "ingest").Backlog >= 70 })
	if n := totalReceived(pods...); n != deliveredAtPause {
		t.Fatalf("%d messages reached the application while paused", n-deliveredAtPause)
	}
	barrier(t, pods) // every FLOW a client queued by now has reached the broker
	if flows := broker.Flows(topic, "ingest"); len(flows) != flowsAtPause {
		t.Fatalf("broker received %d FLOW commands while paused: %+v", len(flows)-flowsAtPause, flows[flowsAtPause:])
	}

	patchFlow(t, flow, `{"spec":{"state":"Running"}}`)
	eventually(t, "every message delivered after resume", func() bool { return totalReceived(pods...) == 200 })
	seen := map[string]bool{}
	for _, p := range pods {
		for _, payload := range p.Payloads() {
			seen[payload] = true
		}
	}
	if len(seen) != 200 {
		t.Fatalf("%d distinct messages delivered, want 200", len(seen))
	}
	got = waitFlow(t, flow, "Ready and not Paused", func(f *subflowv1.SubscriptionFlow) bool {
		return current(f) && isTrue(f, subflowv1.ConditionReady) && condition(f, subflowv1.ConditionPaused).Reason == subflowv1.ReasonRunning
	})
	if got.Status.Consumers.Running != 3 {
		t.Fatalf("consumers %+v, want 3 running", got.Status.Consumers)
	}
}

func TestPodCreatedWhilePausedIsPausedQuickly(t *testing.T) {
	ns := namespace(t, true)
	topic := "late-" + ns
	startPod(t, ns, "worker-0", topic, testToken)
	flow := newFlow(ns, "late", topic, subflowv1.StatePaused)
	create(t, flow)
	waitFlow(t, flow, "Paused", func(f *subflowv1.SubscriptionFlow) bool { return isTrue(f, subflowv1.ConditionPaused) })

	late, err := podsim.Start(podsim.Options{Name: "worker-1", ServiceURL: broker.ServiceURL(), Token: testToken,
		Topic: topic, Subscription: "ingest", Type: pulsar.Shared, ReceiverQueueSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	start := time.Now()
	createPod(t, ns, "worker-1", late.Port)
	eventually(t, "the new pod to be paused", func() bool { return late.Consumer.State() == protocol.Paused })
	t.Logf("new pod paused %s after its IP was set", time.Since(start))
	waitFlow(t, flow, "2/2 paused", func(f *subflowv1.SubscriptionFlow) bool {
		return f.Status.Consumers.Halted == "2/2" && isTrue(f, subflowv1.ConditionPaused)
	})
}

func TestUnreachableAgentIsNamedAndWrongTokenStalls(t *testing.T) {
	ns := namespace(t, true)
	topic := "bad-" + ns
	// A pod whose agent port is closed.
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := closed.Addr().(*net.TCPAddr).Port
	closed.Close()
	createPod(t, ns, "worker-down", port)
	flow := newFlow(ns, "bad", topic, subflowv1.StatePaused)
	create(t, flow)
	got := waitFlow(t, flow, "AgentsUnreachable", func(f *subflowv1.SubscriptionFlow) bool {
		c := condition(f, subflowv1.ConditionReady)
		return c != nil && c.Reason == subflowv1.ReasonAgentsUnreachable
	})
	if msg := condition(got, subflowv1.ConditionReady).Message; !strings.Contains(msg, "worker-down") {
		t.Fatalf("Ready message %q does not name the pod", msg)
	}
	if !isTrue(got, subflowv1.ConditionReconciling) || got.Status.Pods.Unreachable != 1 {
		t.Fatalf("want Reconciling and 1 unreachable: %+v", got.Status)
	}
	if c := condition(got, subflowv1.ConditionReconciling); c.Reason != subflowv1.ReasonProgressing {
		t.Fatalf("Reconciling reason %s", c.Reason)
	}
	waitEvent(t, ns, "bad", "AgentUnreachable", 1)

	// A pod whose agent has another token: Stalled, and the agent changes nothing.
	deletePod(t, ns, "worker-down")
	stranger := startPod(t, ns, "worker-stranger", topic, "another-token")
	got = waitFlow(t, flow, "Stalled on the token", func(f *subflowv1.SubscriptionFlow) bool { return isTrue(f, subflowv1.ConditionStalled) })
	if c := condition(got, subflowv1.ConditionStalled); c.Reason != subflowv1.ReasonAgentAuthFailed || !strings.Contains(c.Message, "worker-stranger") {
		t.Fatalf("Stalled %s: %s", c.Reason, c.Message)
	}
	if condition(got, subflowv1.ConditionReconciling) != nil {
		t.Fatal("Reconciling present while Stalled")
	}
	if stranger.Consumer.State() != protocol.Running {
		t.Fatalf("agent with another token changed to %s", stranger.Consumer.State())
	}
	waitEvent(t, ns, "bad", "AgentAuthFailed", 1)
}

// barrier returns once every command each pod's client queued before the call reached the
// broker: pulsar-client-go sends a consumer's commands in order on one connection, and
// GetLastMessageIDs waits for the broker's answer. The agent's tests use the same barrier.
func barrier(t *testing.T, pods []*podsim.Pod) {
	t.Helper()
	for _, p := range pods {
		if _, err := p.Consumer.GetLastMessageIDs(); err != nil {
			t.Fatalf("barrier on %s: %v", p.Name, err)
		}
	}
}

func deletePod(t *testing.T, ns, name string) {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := k8s.Delete(context.Background(), pod, client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}

func TestAgentRestartIsResynced(t *testing.T) {
	ns := namespace(t, true)
	topic := "restart-" + ns
	first := startPod(t, ns, "worker-0", topic, testToken)
	flow := newFlow(ns, "restart", topic, subflowv1.StatePaused)
	create(t, flow)
	waitFlow(t, flow, "Paused", func(f *subflowv1.SubscriptionFlow) bool { return isTrue(f, subflowv1.ConditionPaused) })

	// The process restarts in the same pod: same address, an agent that knows nothing.
	first.Close()
	again, err := podsim.Start(podsim.Options{Name: "worker-0", ServiceURL: broker.ServiceURL(), Token: testToken,
		Topic: topic, Subscription: "ingest", Type: pulsar.Shared, ReceiverQueueSize: 10, Addr: first.Addr})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if again.Consumer.State() != protocol.Running {
		t.Fatalf("restarted agent starts %s", again.Consumer.State())
	}
	// The kubelet reports the container restart; the controller pushes again.
	pod := &corev1.Pod{}
	if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "worker-0"}, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status.ContainerStatuses[0].RestartCount++
	if err := k8s.Status().Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the restarted agent to be paused again", func() bool { return again.Consumer.State() == protocol.Paused })
}

func TestMaintenanceWindowAndOverride(t *testing.T) {
	ns := namespace(t, true)
	topic := "window-" + ns
	p := startPod(t, ns, "worker-0", topic, testToken)
	at := func(hhmm string) time.Time {
		tm, _ := time.Parse(time.RFC3339, "2026-11-28T"+hhmm+":00Z")
		return tm
	}
	clock.SetTime(at("00:30"))
	defer clock.SetTime(time.Now())
	flow := newFlow(ns, "window", topic, subflowv1.StateRunning)
	flow.Spec.MaintenanceWindows = []subflowv1.MaintenanceWindow{{Schedule: "0 1 * * *",
		Duration: metav1.Duration{Duration: time.Hour}, TimeZone: "UTC", State: subflowv1.StatePaused}}
	create(t, flow)
	got := waitFlow(t, flow, "Running before the window", func(f *subflowv1.SubscriptionFlow) bool {
		return isTrue(f, subflowv1.ConditionReady) && f.Status.EffectiveState == subflowv1.StateRunning
	})
	if got.Status.NextTransitionTime == nil || !got.Status.NextTransitionTime.Time.Equal(at("01:00")) {
		t.Fatalf("nextTransitionTime %v, want the window start", got.Status.NextTransitionTime)
	}

	clock.SetTime(at("01:10"))
	poke(t, flow)
	got = waitFlow(t, flow, "Paused by the window", func(f *subflowv1.SubscriptionFlow) bool {
		return f.Status.StateSource == subflowv1.SourceWindow && isTrue(f, subflowv1.ConditionPaused)
	})
	if p.Consumer.State() != protocol.Paused || !got.Status.NextTransitionTime.Time.Equal(at("02:00")) {
		t.Fatalf("consumer %s, next %v", p.Consumer.State(), got.Status.NextTransitionTime)
	}

	// The on-call engineer lets it run until 01:30, without touching Git.
	patchFlow(t, flow, fmt.Sprintf(`{"metadata":{"annotations":{%q:"Running",%q:"2026-11-28T01:30:00Z"}}}`,
		subflowv1.OverrideStateAnnotation, subflowv1.OverrideUntilAnnotation))
	waitFlow(t, flow, "Running by override", func(f *subflowv1.SubscriptionFlow) bool {
		return f.Status.StateSource == subflowv1.SourceOverride && f.Status.EffectiveState == subflowv1.StateRunning
	})
	eventually(t, "consumer running by override", func() bool { return p.Consumer.State() == protocol.Running })

	clock.SetTime(at("01:40"))
	poke(t, flow)
	got = waitFlow(t, flow, "expired override ignored", func(f *subflowv1.SubscriptionFlow) bool {
		return f.Status.StateSource == subflowv1.SourceWindow && isTrue(f, subflowv1.ConditionPaused)
	})
	if msg := condition(got, subflowv1.ConditionReady).Message; !strings.Contains(msg, "expired") {
		t.Fatalf("expired override not reported: %q", msg)
	}

	clock.SetTime(at("02:05"))
	poke(t, flow)
	waitFlow(t, flow, "Running after the window", func(f *subflowv1.SubscriptionFlow) bool {
		return f.Status.StateSource == subflowv1.SourceSpec && f.Status.EffectiveState == subflowv1.StateRunning &&
			isTrue(f, subflowv1.ConditionReady)
	})
	if p.Consumer.State() != protocol.Running {
		t.Fatalf("consumer %s after the window", p.Consumer.State())
	}
}

func TestSeekExecutesOnceAndAgainForNewID(t *testing.T) {
	ns := namespace(t, true)
	topic := "seek-" + ns
	pods := []*podsim.Pod{startPod(t, ns, "worker-0", topic, testToken), startPod(t, ns, "worker-1", topic, testToken)}
	produce(t, topic, "m", 30)
	eventually(t, "30 consumed", func() bool { return totalReceived(pods...) == 30 })
	// Grouped acks still pending in a client when the cursor moves back make that client drop the
	// replayed messages as duplicates; a seek comes after the acks reached the broker.
	waitAcked(t, topic)

	index := int64(10)
	flow := newFlow(ns, "seek", topic, subflowv1.StateRunning)
	flow.Spec.Seek = &subflowv1.SeekSpec{ID: "replay-1", Index: &index}
	create(t, flow)
	got := waitFlow(t, flow, "SeekCompleted", func(f *subflowv1.SubscriptionFlow) bool { return isTrue(f, subflowv1.ConditionSeekCompleted) })
	// The executor is the first pod by name among those that answered the seek's push in time
	// (seekExecutor, unit-tested): on a loaded machine worker-0 may answer late.
	if s := got.Status.Seek; (s.Executor != "worker-0" && s.Executor != "worker-1") || len(s.Positions) != 1 || s.Positions[0].Index != 10 || s.Positions[0].MessageID == "" {
		t.Fatalf("seek status %+v", s)
	}
	waitEvent(t, ns, "seek", "SeekCompleted", 1)
	eventually(t, "messages 10..29 redelivered once", func() bool { return totalReceived(pods...) == 50 }, func() string {
		return fmt.Sprintf("received %v and %v, seek %+v", pods[0].Payloads(), pods[1].Payloads(), getFlow(t, flow).Status.Seek)
	})

	waitAcked(t, topic)
	// Retried reconciles do not seek again; a new id does.
	poke(t, flow)
	index = 25
	patchFlow(t, flow, `{"spec":{"seek":{"id":"replay-2","index":25}}}`)
	got = waitFlow(t, flow, "second seek", func(f *subflowv1.SubscriptionFlow) bool {
		return f.Status.Seek != nil && f.Status.Seek.ID == "replay-2" && isTrue(f, subflowv1.ConditionSeekCompleted)
	})
	eventually(t, "messages 25..29 redelivered", func() bool { return totalReceived(pods...) == 55 })
	if n := totalReceived(pods...); n != 55 {
		t.Fatalf("%d delivered, want 55: a seek ran more than once", n)
	}
}

// waitAcked waits until every delivered message's ack reached the broker.
func waitAcked(t *testing.T, topic string) {
	t.Helper()
	eventually(t, "acks on the broker", func() bool {
		st := broker.Subscription(topic, "ingest")
		unacked := int64(0)
		for _, c := range st.Consumers {
			unacked += c.Unacked
		}
		return st.Backlog == 0 && unacked == 0
	})
}

func TestDeletingAFlowHonoursDeletionPolicy(t *testing.T) {
	for _, policy := range []subflowv1.DeletionPolicy{subflowv1.DeletionResume, subflowv1.DeletionRetain} {
		t.Run(string(policy), func(t *testing.T) {
			ns := namespace(t, true)
			topic := "delete-" + ns
			p := startPod(t, ns, "worker-0", topic, testToken)
			flow := newFlow(ns, "gone", topic, subflowv1.StatePaused)
			flow.Spec.DeletionPolicy = policy
			create(t, flow)
			waitFlow(t, flow, "Paused", func(f *subflowv1.SubscriptionFlow) bool { return isTrue(f, subflowv1.ConditionPaused) })
			if err := k8s.Delete(context.Background(), flow); err != nil {
				t.Fatal(err)
			}
			eventually(t, "flow removed", func() bool {
				return apierrors.IsNotFound(k8s.Get(context.Background(), client.ObjectKeyFromObject(flow), &subflowv1.SubscriptionFlow{}))
			})
			want := protocol.Running
			if policy == subflowv1.DeletionRetain {
				want = protocol.Paused
			}
			if got := p.Consumer.State(); got != want {
				t.Fatalf("after deletion with %s the consumer is %s, want %s", policy, got, want)
			}
		})
	}
}

func TestTokenSecretIsCreatedWhenMissing(t *testing.T) {
	ns := namespace(t, false)
	flow := newFlow(ns, "fresh", "any", subflowv1.StatePaused)
	create(t, flow)
	got := waitFlow(t, flow, "Ready with no pods", func(f *subflowv1.SubscriptionFlow) bool {
		c := condition(f, subflowv1.ConditionReady)
		return c != nil && c.Reason == subflowv1.ReasonNoMatchingPods
	})
	secret := &corev1.Secret{}
	if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: controllers.DefaultTokenSecret}, secret); err != nil {
		t.Fatalf("token secret not created: %v", err)
	}
	if len(secret.Data[controllers.DefaultTokenKey]) < 32 {
		t.Fatalf("token too short: %q", secret.Data[controllers.DefaultTokenKey])
	}
	if got.Status.Revision < 1 || !current(got) {
		t.Fatalf("status %+v", got.Status)
	}
}

// One flow over an agent pod and a sidecar pod (a plain client through the protocol sidecar,
// strict mode): Paused halts both, the status names each pod's kind, nothing produced during
// the pause reaches either application and no FLOW reaches the broker; Running delivers all.
func TestFlowPausesAgentAndSidecarPodsAlike(t *testing.T) {
	ns := namespace(t, true)
	topic := "mixed-" + ns
	pods := []*podsim.Pod{startPod(t, ns, "agent-0", topic, testToken),
		startPodWith(t, ns, podsim.Options{Name: "sidecar-0", Token: testToken, Topic: topic, Sidecar: true, StrictPause: true})}
	flow := newFlow(ns, "mixed", topic, subflowv1.StateRunning)
	create(t, flow)
	produce(t, topic, "before", 40)
	eventually(t, "40 messages consumed while Running", func() bool { return totalReceived(pods...) == 40 })

	patchFlow(t, flow, `{"spec":{"state":"Paused"}}`)
	got := waitFlow(t, flow, "Ready and Paused", func(f *subflowv1.SubscriptionFlow) bool {
		return current(f) && isTrue(f, subflowv1.ConditionReady) && isTrue(f, subflowv1.ConditionPaused)
	})
	kinds := map[string]string{}
	for _, a := range got.Status.Agents {
		kinds[a.Pod] = a.Kind
	}
	if kinds["agent-0"] != protocol.KindAgent || kinds["sidecar-0"] != protocol.KindSidecar || got.Status.Consumers.Halted != "2/2" {
		t.Fatalf("status agents %+v, consumers %+v: want agent-0 an agent, sidecar-0 a sidecar, 2/2 halted", got.Status.Agents, got.Status.Consumers)
	}
	flowsAtPause, deliveredAtPause := len(broker.Flows(topic, "ingest")), totalReceived(pods...)
	produce(t, topic, "during", 40)
	eventually(t, "backlog to build on the broker", func() bool { return broker.Subscription(topic, "ingest").Backlog >= 20 })
	if n := totalReceived(pods...); n != deliveredAtPause {
		t.Fatalf("%d messages reached the applications while paused", n-deliveredAtPause)
	}
	if flows := broker.Flows(topic, "ingest"); len(flows) != flowsAtPause {
		t.Fatalf("the broker received %d FLOW commands while paused: %+v", len(flows)-flowsAtPause, flows[flowsAtPause:])
	}

	patchFlow(t, flow, `{"spec":{"state":"Running"}}`)
	eventually(t, "every message delivered after resume", func() bool {
		seen := map[string]bool{}
		for _, p := range pods {
			for _, payload := range p.Payloads() {
				seen[payload] = true
			}
		}
		return len(seen) == 80
	})
}
