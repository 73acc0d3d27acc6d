package controllers

import (
	"context"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// selectorOf converts a flow's selector; an empty selector matches nothing.
func selectorOf(flow *subflowv1.SubscriptionFlow) (labels.Selector, error) {
	if len(flow.Spec.Selector.MatchLabels) == 0 && len(flow.Spec.Selector.MatchExpressions) == 0 {
		return labels.Nothing(), nil
	}
	return metav1.LabelSelectorAsSelector(&flow.Spec.Selector)
}

// matchedPods lists the live pods a flow selects, sorted by name.
func (r *SubscriptionFlowReconciler) matchedPods(ctx context.Context, flow *subflowv1.SubscriptionFlow) ([]corev1.Pod, error) {
	selector, err := selectorOf(flow)
	if err != nil {
		return nil, err
	}
	var list corev1.PodList
	if err := r.List(ctx, &list, client.InNamespace(flow.Namespace), client.MatchingLabelsSelector{Selector: selector}); err != nil {
		return nil, err
	}
	pods := list.Items[:0]
	for _, pod := range list.Items {
		if pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
			pods = append(pods, pod)
		}
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	return pods, nil
}

// agentBaseURL is where a pod's agent listens: the container port named "subflow", else the
// flow's spec.agent.port (by name or number), else the default port. Empty if the pod has no IP.
func agentBaseURL(pod *corev1.Pod, spec subflowv1.AgentSpec) string {
	if pod.Status.PodIP == "" {
		return ""
	}
	port := int32(protocol.DefaultPort)
	if named, ok := containerPort(pod, protocol.PortName); ok {
		port = named
	} else if spec.Port != nil {
		if spec.Port.IntVal > 0 {
			port = spec.Port.IntVal
		} else if named, ok := containerPort(pod, spec.Port.StrVal); ok {
			port = named
		}
	}
	return fmt.Sprintf("http://%s:%d", pod.Status.PodIP, port)
}

func containerPort(pod *corev1.Pod, name string) (int32, bool) {
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == name {
				return p.ContainerPort, true
			}
		}
	}
	return 0, false
}

// flowsForPod maps a pod to the flows in its namespace whose selector matches it.
func (r *SubscriptionFlowReconciler) flowsForPod(ctx context.Context, obj client.Object) []reconcile.Request {
	var flows subflowv1.SubscriptionFlowList
	if err := r.List(ctx, &flows, client.InNamespace(obj.GetNamespace())); err != nil {
		return nil
	}
	var requests []reconcile.Request
	for i := range flows.Items {
		selector, err := selectorOf(&flows.Items[i])
		if err == nil && selector.Matches(labels.Set(obj.GetLabels())) {
			requests = append(requests, reconcile.Request{NamespacedName: types.NamespacedName{
				Namespace: flows.Items[i].Namespace, Name: flows.Items[i].Name}})
		}
	}
	return requests
}

// podChangesAgentReach lets through only pod updates that can change which agents a flow
// reaches or whether an agent restarted: labels, IP, phase, ports, deletion, container restarts.
var podChangesAgentReach = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		oldPod, okOld := e.ObjectOld.(*corev1.Pod)
		newPod, okNew := e.ObjectNew.(*corev1.Pod)
		if !okOld || !okNew {
			return true
		}
		return !labels.Equals(oldPod.Labels, newPod.Labels) ||
			oldPod.Status.PodIP != newPod.Status.PodIP ||
			oldPod.Status.Phase != newPod.Status.Phase ||
			(oldPod.DeletionTimestamp == nil) != (newPod.DeletionTimestamp == nil) ||
			restarts(oldPod) != restarts(newPod)
	},
}

func restarts(pod *corev1.Pod) int32 {
	var n int32
	for _, s := range pod.Status.ContainerStatuses {
		n += s.RestartCount
	}
	return n
}
