package controllers_test

import (
	"context"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// The API server refuses the status write that would say Paused (an admission policy), then
// accepts it again: the agent is paused meanwhile (the pods the controller holds are recorded
// before any push, and those writes pass), the flow does not claim Paused while it cannot store
// it, and the controller's own retry stores it once it can, with nothing else changing to wake
// the flow.
func TestIntegrationRefusedStatusWriteIsRetried(t *testing.T) {
	ns := namespace(t, true)
	topic := "persistent://public/default/refused-" + ns
	pod := startPod(t, ns, "worker-0", topic, testToken)
	lift := refusePausedStatus(t, ns)

	flow := newFlow(ns, "flow", topic, subflowv1.StatePaused)
	create(t, flow)
	eventually(t, "the agent paused", func() bool { return pod.Consumer.State() == protocol.Paused })
	if got := getFlow(t, flow); isTrue(got, subflowv1.ConditionPaused) {
		t.Fatalf("Paused stored although the API server refuses it: %+v", got.Status)
	}
	lift()
	waitFlowWithin(t, flow, maxRetry, "Paused written after the API server accepts it again", func(f *subflowv1.SubscriptionFlow) bool {
		return current(f) && isTrue(f, subflowv1.ConditionPaused)
	})
}

// refusePausedStatus makes the API server refuse every status write of a flow in ns that says
// Paused=True, and returns once it does (a policy takes effect a moment after it is created);
// the function it returns lifts the refusal.
func refusePausedStatus(t *testing.T, ns string) func() {
	t.Helper()
	ctx := context.Background()
	name := "refuse-paused-" + ns
	const refusal = "Paused status refused by the test"
	policy := &admissionv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionv1.Fail),
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{Operations: []admissionv1.OperationType{admissionv1.Update},
					Rule: admissionv1.Rule{APIGroups: []string{subflowv1.GroupVersion.Group}, APIVersions: []string{subflowv1.GroupVersion.Version},
						Resources: []string{"subscriptionflows/status"}}}}}},
			Validations: []admissionv1.Validation{{Message: refusal,
				Expression: `!(has(object.status) && has(object.status.conditions) && object.status.conditions.exists(c, c.type == 'Paused' && c.status == 'True'))`}},
		}}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: name,
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
			MatchResources: &admissionv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}}}}
	create(t, policy)
	t.Cleanup(func() { _ = k8s.Delete(ctx, policy) })
	create(t, binding)
	lifted := false
	lift := func() {
		if !lifted {
			lifted = true
			if err := k8s.Delete(ctx, binding); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(lift)

	// A probe flow that matches no pod, so that the controller leaves it alone once Ready says
	// so: a Paused status written to it shows when the policy is in force.
	probe := newFlow(ns, "probe", "", subflowv1.StateRunning)
	probe.Spec.Selector.MatchLabels = map[string]string{"app": "none"}
	create(t, probe)
	eventually(t, "the policy refusing Paused", func() bool {
		p := getFlow(t, probe)
		meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{Type: subflowv1.ConditionPaused, Status: metav1.ConditionTrue,
			Reason: "Probe", Message: "probing the admission policy"})
		err := k8s.Status().Update(ctx, p)
		return err != nil && strings.Contains(err.Error(), refusal)
	})
	return lift
}
