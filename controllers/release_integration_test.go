package controllers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/testing/podsim"
)

func patchPod(t *testing.T, ns, name, patch string) {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := k8s.Patch(context.Background(), pod, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
}

// agentFlows asks an agent which flow rules it holds, as the controller's own GET /state would.
func agentFlows(t *testing.T, p *podsim.Pod) []protocol.FlowSummary {
	t.Helper()
	return agentFlowsWith(t, p, testToken)
}

// seedRule puts a flow's rule into an agent directly, as an earlier controller would have.
func seedRule(t *testing.T, p *podsim.Pod, flow *subflowv1.SubscriptionFlow, revision int64, state protocol.State) {
	t.Helper()
	body, _ := json.Marshal(protocol.FlowRequest{UID: string(flow.UID), Revision: revision,
		Subscription: flow.Spec.Subscription, Topic: flow.Spec.Topic, State: state})
	url := fmt.Sprintf("http://%s%s/flows/%s/%s", p.Addr, protocol.PathPrefix, flow.Namespace, flow.Name)
	req, _ := http.NewRequest(http.MethodPut, url, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("seeding the rule: %s", resp.Status)
	}
}

func TestRelabelledPodIsReleased(t *testing.T) {
	ns := namespace(t, true)
	topic := "relabel-" + ns
	stay := startPod(t, ns, "worker-0", topic, testToken)
	leave := startPod(t, ns, "worker-1", topic, testToken)
	flow := newFlow(ns, "relabel", topic, subflowv1.StatePaused)
	create(t, flow)
	waitFlow(t, flow, "both paused", func(f *subflowv1.SubscriptionFlow) bool { return f.Status.Consumers.Halted == "2/2" })

	patchPod(t, ns, "worker-1", `{"metadata":{"labels":{"app":"elsewhere"}}}`)
	eventually(t, "the relabelled pod to run again", func() bool { return leave.Consumer.State() == protocol.Running })
	if len(agentFlows(t, leave)) != 0 {
		t.Fatalf("the relabelled pod still holds %+v", agentFlows(t, leave))
	}
	got := waitFlow(t, flow, "Ready with one holder", func(f *subflowv1.SubscriptionFlow) bool {
		return isTrue(f, subflowv1.ConditionReady) && len(f.Status.HeldBy) == 1
	})
	if got.Status.HeldBy[0] != "worker-0" || stay.Consumer.State() != protocol.Paused {
		t.Fatalf("heldBy %v, worker-0 %s", got.Status.HeldBy, stay.Consumer.State())
	}
}

func TestSelectorChangeReleasesPodsNoLongerSelected(t *testing.T) {
	ns := namespace(t, true)
	topic := "selector-" + ns
	a := startPod(t, ns, "worker-a", topic, testToken)
	b := startPod(t, ns, "worker-b", topic, testToken)
	patchPod(t, ns, "worker-a", `{"metadata":{"labels":{"shard":"a"}}}`)
	flow := newFlow(ns, "selector", topic, subflowv1.StatePaused)
	create(t, flow)
	waitFlow(t, flow, "both paused", func(f *subflowv1.SubscriptionFlow) bool { return f.Status.Consumers.Halted == "2/2" })

	patchFlow(t, flow, `{"spec":{"selector":{"matchLabels":{"app":"worker","shard":"a"}}}}`)
	eventually(t, "worker-b released", func() bool { return b.Consumer.State() == protocol.Running })
	if a.Consumer.State() != protocol.Paused {
		t.Fatalf("worker-a is %s", a.Consumer.State())
	}
}

// unmatchedRecordedHolder sets up what an earlier controller leaves behind when a pod stops
// matching while no controller runs: the pod's agent holds the flow's Paused rule and the flow's
// status records the pod as a holder, but the pod no longer matches.
func unmatchedRecordedHolder(t *testing.T, name string) (*podsim.Pod, *subflowv1.SubscriptionFlow) {
	t.Helper()
	ns := namespace(t, true)
	topic := name + "-" + ns
	p := startPod(t, ns, "worker-0", topic, testToken)
	patchPod(t, ns, "worker-0", `{"metadata":{"labels":{"app":"elsewhere"}}}`)
	flow := newFlow(ns, name, topic, subflowv1.StatePaused)
	create(t, flow)
	flow = waitFlow(t, flow, "Ready with no pods", func(f *subflowv1.SubscriptionFlow) bool {
		return isTrue(f, subflowv1.ConditionReady) && current(f)
	})
	seedRule(t, p, flow, 1, protocol.Paused)
	eventually(t, "seeded pause", func() bool { return p.Consumer.State() == protocol.Paused })
	status := flow.DeepCopy()
	status.Status.HeldBy = []string{"worker-0"}
	if err := k8s.Status().Patch(context.Background(), status, client.MergeFrom(flow)); err != nil {
		t.Fatal(err)
	}
	return p, flow
}

// TestRecordedHolderIsReleasedByAnotherController: the holder list in status is what a
// restarted controller (which remembers nothing) releases from.
func TestRecordedHolderIsReleasedByAnotherController(t *testing.T) {
	p, flow := unmatchedRecordedHolder(t, "durable")
	poke(t, flow)
	eventually(t, "the recorded holder released", func() bool { return p.Consumer.State() == protocol.Running })
	waitFlow(t, flow, "no holders left", func(f *subflowv1.SubscriptionFlow) bool { return len(f.Status.HeldBy) == 0 })
}

func TestDeletingAFlowReleasesRecordedHolders(t *testing.T) {
	p, flow := unmatchedRecordedHolder(t, "delholders")
	waitFlow(t, flow, "holder visible", func(f *subflowv1.SubscriptionFlow) bool { return len(f.Status.HeldBy) == 1 })
	if err := k8s.Delete(context.Background(), flow); err != nil {
		t.Fatal(err)
	}
	eventually(t, "flow removed", func() bool {
		return apierrors.IsNotFound(k8s.Get(context.Background(), client.ObjectKeyFromObject(flow), &subflowv1.SubscriptionFlow{}))
	})
	if p.Consumer.State() != protocol.Running || len(agentFlows(t, p)) != 0 {
		t.Fatalf("after deletion the unmatched holder is %s with %+v", p.Consumer.State(), agentFlows(t, p))
	}
}

func TestTerminatingPodIsNotPushedTo(t *testing.T) {
	ns := namespace(t, true)
	topic := "terminating-" + ns
	live := startPod(t, ns, "worker-0", topic, testToken)
	dying := startPod(t, ns, "worker-1", topic, testToken)
	patchPod(t, ns, "worker-1", `{"metadata":{"finalizers":["test.subflow.dev/hold"]}}`)
	t.Cleanup(func() { patchPod(t, ns, "worker-1", `{"metadata":{"finalizers":null}}`) })
	if err := k8s.Delete(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "worker-1"}}); err != nil {
		t.Fatal(err)
	}
	flow := newFlow(ns, "terminating", topic, subflowv1.StatePaused)
	create(t, flow)
	got := waitFlow(t, flow, "Paused", func(f *subflowv1.SubscriptionFlow) bool { return isTrue(f, subflowv1.ConditionPaused) })
	if live.Consumer.State() != protocol.Paused || dying.Consumer.State() != protocol.Running {
		t.Fatalf("live %s, terminating %s: want only the live pod paused", live.Consumer.State(), dying.Consumer.State())
	}
	if got.Status.Pods.Matched != 1 {
		t.Fatalf("matched %d, want the terminating pod left out", got.Status.Pods.Matched)
	}
}

func TestStaleAgentRevisionIsPassedInOneStep(t *testing.T) {
	ns := namespace(t, true)
	topic := "stale-" + ns
	p := startPod(t, ns, "worker-0", topic, testToken)
	patchPod(t, ns, "worker-0", `{"metadata":{"labels":{"app":"later"}}}`)
	flow := newFlow(ns, "stale", topic, subflowv1.StatePaused)
	create(t, flow)
	flow = waitFlow(t, flow, "Ready", func(f *subflowv1.SubscriptionFlow) bool { return isTrue(f, subflowv1.ConditionReady) && current(f) })
	// The agent already applied revision 100 of this flow (a previous leader's).
	seedRule(t, p, flow, 100, protocol.Running)
	patchPod(t, ns, "worker-0", `{"metadata":{"labels":{"app":"worker"}}}`)
	got := waitFlow(t, flow, "Paused past the stale revision", func(f *subflowv1.SubscriptionFlow) bool {
		return isTrue(f, subflowv1.ConditionPaused) && f.Status.Consumers.Halted == "1/1"
	})
	if p.Consumer.State() != protocol.Paused {
		t.Fatalf("agent is %s", p.Consumer.State())
	}
	if got.Status.Revision != 101 {
		t.Fatalf("revision %d, want 101: one step past the agent's 100", got.Status.Revision)
	}
}

func TestSpecProblemsStallWithObservedGeneration(t *testing.T) {
	ns := namespace(t, false)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "subflow-agent-token"},
		Data: map[string][]byte{"other": []byte(testToken)}}
	create(t, secret)
	tests := []struct {
		name    string
		mutate  func(*subflowv1.SubscriptionFlow)
		message string
	}{
		{"token secret without its key", func(f *subflowv1.SubscriptionFlow) {}, `has no key "token"`},
		{"selector In without values", func(f *subflowv1.SubscriptionFlow) {
			f.Spec.Selector = metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "app", Operator: metav1.LabelSelectorOpIn}}}
		}, "spec.selector"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			flow := newFlow(ns, fmt.Sprintf("bad-%d", i), "any", subflowv1.StatePaused)
			tt.mutate(flow)
			if err := k8s.Create(context.Background(), flow); err != nil {
				t.Skipf("the API server refuses it already: %v", err)
			}
			got := waitFlow(t, flow, "Stalled", func(f *subflowv1.SubscriptionFlow) bool { return isTrue(f, subflowv1.ConditionStalled) })
			stalled, ready := condition(got, subflowv1.ConditionStalled), condition(got, subflowv1.ConditionReady)
			if stalled.Reason != subflowv1.ReasonInvalidSpec || !strings.Contains(stalled.Message, tt.message) {
				t.Fatalf("Stalled %s: %s", stalled.Reason, stalled.Message)
			}
			if ready == nil || ready.Status != metav1.ConditionFalse || !current(got) {
				t.Fatalf("want Ready=False at the current generation: %+v", got.Status)
			}
		})
	}
}

// TestWindowWithoutOccurrenceStallsButStateApplies: a schedule the API accepts but that never
// fires names the window in Stalled while spec.state still drives the agents.
func TestWindowWithoutOccurrenceStallsButStateApplies(t *testing.T) {
	ns := namespace(t, true)
	topic := "nowindow-" + ns
	p := startPod(t, ns, "worker-0", topic, testToken)
	flow := newFlow(ns, "nowindow", topic, subflowv1.StatePaused)
	flow.Spec.MaintenanceWindows = []subflowv1.MaintenanceWindow{{Schedule: "0 0 30-31 2 *",
		Duration: metav1.Duration{Duration: time.Hour}, State: subflowv1.StateStopped}}
	create(t, flow)
	got := waitFlow(t, flow, "Stalled and Paused", func(f *subflowv1.SubscriptionFlow) bool {
		return isTrue(f, subflowv1.ConditionStalled) && isTrue(f, subflowv1.ConditionPaused)
	})
	if c := condition(got, subflowv1.ConditionStalled); c.Reason != subflowv1.ReasonInvalidSpec ||
		!strings.Contains(c.Message, "maintenanceWindows[0]") {
		t.Fatalf("Stalled %s: %s", c.Reason, c.Message)
	}
	if p.Consumer.State() != protocol.Paused {
		t.Fatalf("agent is %s", p.Consumer.State())
	}
	// The window goes: the flow is Ready again.
	patchFlow(t, flow, `{"spec":{"maintenanceWindows":null}}`)
	waitFlow(t, flow, "Ready", func(f *subflowv1.SubscriptionFlow) bool {
		return isTrue(f, subflowv1.ConditionReady) && condition(f, subflowv1.ConditionStalled) == nil
	})
}

// TestArbitrarySecretIsNeverSentToPods: a tokenSecretRef to a Secret that is not an
// agent-token Secret is refused, and its value never reaches a pod.
func TestArbitrarySecretIsNeverSentToPods(t *testing.T) {
	ns := namespace(t, true)
	topic := "secret-" + ns
	const password = "db-password-value"
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db"}, Data: map[string][]byte{"password": []byte(password)}})
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "labelled",
		Labels: map[string]string{"subflow.dev/agent-token": "true"}}, Data: map[string][]byte{"token": []byte(password)}})
	// An agent that would accept the password as its token: any push would show.
	p := startPod(t, ns, "worker-0", topic, password)
	for _, ref := range []subflowv1.SecretKeyRef{{Name: "db", Key: "password"}, {Name: "labelled", Key: "token"}} {
		t.Run(ref.Name, func(t *testing.T) {
			flow := newFlow(ns, "steal-"+ref.Name, topic, subflowv1.StatePaused)
			flow.Spec.Agent.TokenSecretRef = &ref
			create(t, flow)
			got := waitFlow(t, flow, "Stalled", func(f *subflowv1.SubscriptionFlow) bool { return isTrue(f, subflowv1.ConditionStalled) })
			if c := condition(got, subflowv1.ConditionStalled); c.Reason != subflowv1.ReasonInvalidSpec {
				t.Fatalf("Stalled %s: %s", c.Reason, c.Message)
			} else {
				t.Logf("refused: %s", c.Message)
			}
			if p.Consumer.State() != protocol.Running || len(agentFlowsWith(t, p, password)) != 0 {
				t.Fatalf("the pod received a push authenticated with the Secret's value")
			}
		})
	}
}

// TestMissingCustomTokenSecretSaysToCreateIt: the controller creates only the default token
// Secret; a tokenSecretRef naming one that does not exist (the controller granted get on it)
// stalls the flow saying what to create, instead of retrying a create that is refused.
func TestMissingCustomTokenSecretSaysToCreateIt(t *testing.T) {
	ns := namespace(t, true)
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "read-team-token"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}, ResourceNames: []string{"team-token"}}}}
	create(t, role)
	create(t, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "read-team-token"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: "User", Name: controllerUser}}})
	flow := newFlow(ns, "custom-token", "custom-token-"+ns, subflowv1.StatePaused)
	flow.Spec.Agent.TokenSecretRef = &subflowv1.SecretKeyRef{Name: "team-token", Key: "token"}
	create(t, flow)
	got := waitFlow(t, flow, "Stalled", func(f *subflowv1.SubscriptionFlow) bool { return isTrue(f, subflowv1.ConditionStalled) })
	if c := condition(got, subflowv1.ConditionStalled); c.Reason != subflowv1.ReasonInvalidSpec || !strings.Contains(c.Message, "Secret "+ns+"/team-token does not exist: the controller creates only subflow-agent-token") {
		t.Fatalf("Stalled %s: %q, want InvalidSpec saying to create the Secret", c.Reason, c.Message)
	}
}

// agentFlowsWith is agentFlows authenticated with token; nil when the agent refuses it.
func agentFlowsWith(t *testing.T, p *podsim.Pod, token string) []protocol.FlowSummary {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+p.Addr+protocol.PathPrefix+"/state", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st protocol.AgentState
	_ = json.NewDecoder(resp.Body).Decode(&st)
	return st.Flows
}

// TestRotatedTokenRecoversWithoutResync: pods on another token stall the flow; once the Secret
// holds their token, the controller's retry (not the hour-long resync) recovers.
func TestRotatedTokenRecoversWithoutResync(t *testing.T) {
	ns := namespace(t, true)
	topic := "rotate-" + ns
	p := startPod(t, ns, "worker-0", topic, "rotated-token")
	flow := newFlow(ns, "rotate", topic, subflowv1.StatePaused)
	create(t, flow)
	waitFlow(t, flow, "AgentAuthFailed", func(f *subflowv1.SubscriptionFlow) bool {
		c := condition(f, subflowv1.ConditionStalled)
		return c != nil && c.Reason == subflowv1.ReasonAgentAuthFailed
	})
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "subflow-agent-token"}}
	if err := k8s.Patch(context.Background(), secret, client.RawPatch(types.MergePatchType,
		[]byte(`{"stringData":{"token":"rotated-token"}}`))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the agent paused with the rotated token", func() bool { return p.Consumer.State() == protocol.Paused })
}
