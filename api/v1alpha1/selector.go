package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// PodSelector is the flow's selector as the controller and the pod webhook apply it: an empty
// selector selects nothing (never every pod of the namespace).
func (f *SubscriptionFlow) PodSelector() (labels.Selector, error) {
	if len(f.Spec.Selector.MatchLabels) == 0 && len(f.Spec.Selector.MatchExpressions) == 0 {
		return labels.Nothing(), nil
	}
	return metav1.LabelSelectorAsSelector(&f.Spec.Selector)
}
