package controllers

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// A status is written when what the API server would store changes, not when a time differs
// below the second it stores.
func TestStatusChangedAsTheAPIServerStoresIt(t *testing.T) {
	since := time.Date(2026, 12, 5, 23, 36, 43, 0, time.UTC)
	stored := subflowv1.SubscriptionFlowStatus{EffectiveState: subflowv1.StatePaused,
		PauseWhen: []subflowv1.PauseConditionStatus{{Name: "db-down", Holds: true, Since: &metav1.Time{Time: since}, Seen: "Available=False"}}}
	computed := *stored.DeepCopy()
	computed.PauseWhen[0].Since = &metav1.Time{Time: since.Add(286 * time.Millisecond)} // the tracker's, to the nanosecond
	if statusChanged(stored, computed) {
		t.Error("a since differing below the second reads as a change: every reconcile would write a status that stores nothing")
	}
	computed.PauseWhen[0].Since = &metav1.Time{Time: since.Add(time.Second)}
	if !statusChanged(stored, computed) {
		t.Error("a since a second later reads as no change")
	}
	computed = *stored.DeepCopy()
	computed.EffectiveState = subflowv1.StateRunning
	if !statusChanged(stored, computed) {
		t.Error("a new effective state reads as no change")
	}
}
