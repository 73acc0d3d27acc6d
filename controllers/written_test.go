package controllers

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

func flowWithCondition(uid types.UID, status metav1.ConditionStatus) *subflowv1.SubscriptionFlow {
	f := &subflowv1.SubscriptionFlow{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "f", UID: uid}}
	meta.SetStatusCondition(&f.Status.Conditions, metav1.Condition{Type: subflowv1.ConditionBacklogAtRisk, Status: status, Reason: "R"})
	return f
}

// A read that lags the controller's own write is compared with what was written, so that a
// transition is announced once; a recreated flow or a forgotten one starts from what was read.
func TestEventsCompareWithTheLastWrittenStatus(t *testing.T) {
	var b writtenBook
	stale := flowWithCondition("u1", metav1.ConditionFalse)
	if b.before(stale) != stale {
		t.Fatal("nothing written yet: want the read copy")
	}
	written := flowWithCondition("u1", metav1.ConditionTrue)
	b.set(written)
	written.Status.Conditions[0].Status = metav1.ConditionUnknown // later changes to the flow are not the record
	if got := b.before(stale); !meta.IsStatusConditionTrue(got.Status.Conditions, subflowv1.ConditionBacklogAtRisk) {
		t.Fatalf("a stale read: got %+v, want the written True", got.Status.Conditions)
	}
	recreated := flowWithCondition("u2", metav1.ConditionFalse)
	if b.before(recreated) != recreated {
		t.Fatal("a recreated flow (new UID) must start from its own status")
	}
	b.forget(types.NamespacedName{Namespace: "ns", Name: "f"})
	if b.before(stale) != stale {
		t.Fatal("a forgotten flow must start from the read copy")
	}
}
