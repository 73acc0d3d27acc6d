package controllers

import (
	"context"
	"net"
	"sort"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// matchedPods lists the pods a flow selects that have not finished, sorted by name.
// Terminating pods are included (they still hold the rule) but are not pushed to.
// The pods are the cache's own objects: only read, never mutated, here and by the callers.
func (r *SubscriptionFlowReconciler) matchedPods(ctx context.Context, flow *subflowv1.SubscriptionFlow, selector labels.Selector) ([]*corev1.Pod, error) {
	all, err := r.namespacePods(ctx, flow.Namespace)
	if err != nil {
		return nil, err
	}
	var pods []*corev1.Pod
	for _, pod := range all {
		if selector.Matches(labels.Set(pod.Labels)) && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
			pods = append(pods, pod)
		}
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	return pods, nil
}

// namespacePods reads the namespace's cached pods in place from the manager's pod informer
// (podIndex). A list through the client copies every Pod struct into a new slice, which for
// a flow of 10 000 pods was held through the flow's pushes, and again in the collector's
// headroom (BENCHMARKS.md, BenchmarkFleetPause; docs/fleet-scale-findings.md). A reconciler
// run without a manager (a benchmark), or with a cache of one informer per namespace, lists
// through the client.
func (r *SubscriptionFlowReconciler) namespacePods(ctx context.Context, namespace string) ([]*corev1.Pod, error) {
	if r.podIndex == nil {
		var list corev1.PodList
		if err := r.List(ctx, &list, client.InNamespace(namespace), client.UnsafeDisableDeepCopy); err != nil {
			return nil, err
		}
		pods := make([]*corev1.Pod, len(list.Items))
		for i := range list.Items {
			pods[i] = &list.Items[i]
		}
		return pods, nil
	}
	objs, err := r.podIndex.ByIndex(toolscache.NamespaceIndex, namespace)
	if err != nil {
		return nil, err
	}
	pods := make([]*corev1.Pod, 0, len(objs))
	for _, obj := range objs {
		if pod, ok := obj.(*corev1.Pod); ok {
			pods = append(pods, pod)
		}
	}
	return pods, nil
}

// pushable reports whether the controller should push to a pod's agent: it has an address and
// is not terminating (a terminating pod keeps the state it has until it goes).
func pushable(pod *corev1.Pod) bool {
	return pod.Status.PodIP != "" && pod.DeletionTimestamp.IsZero()
}

// agentBaseURL is where a pod's agent listens: the container port named "subflow" (http) or
// "subflow-https" (https), else the flow's spec.agent.port (by name or number), else the
// default port. Empty if the pod has no IP.
func agentBaseURL(pod *corev1.Pod, spec subflowv1.AgentSpec) string {
	if pod.Status.PodIP == "" {
		return ""
	}
	scheme, port := "http", int32(protocol.DefaultPort)
	if named, ok := containerPort(pod, protocol.PortName); ok {
		port = named
	} else if named, ok := containerPort(pod, protocol.TLSPortName); ok {
		scheme, port = "https", named
	} else if spec.Port != nil {
		if spec.Port.IntVal > 0 {
			port = spec.Port.IntVal
		} else if named, ok := containerPort(pod, spec.Port.StrVal); ok {
			port = named
			if spec.Port.StrVal == protocol.TLSPortName {
				scheme = "https"
			}
		}
	}
	return scheme + "://" + net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(int(port)))
}

// namesAgentPort reports whether agentBaseURL finds the port in the pod or the flow rather than
// falling back to the default.
func namesAgentPort(pod *corev1.Pod, spec subflowv1.AgentSpec) bool {
	if _, ok := containerPort(pod, protocol.PortName); ok {
		return true
	}
	if _, ok := containerPort(pod, protocol.TLSPortName); ok {
		return true
	}
	if spec.Port == nil {
		return false
	}
	if spec.Port.IntVal > 0 {
		return true
	}
	_, ok := containerPort(pod, spec.Port.StrVal)
	return ok
}

// containerPort is the port named name where an agent can serve it (subflowv1.ContainerPortOf,
// the rule the pod webhook applies too).
func containerPort(pod *corev1.Pod, name string) (int32, bool) {
	_, port, ok := subflowv1.ContainerPortOf(pod, name)
	return port, ok
}

// podEvents maps pod events to the flows that select the pod, before or after the change, or
// that hold a rule in it: a pod that stops matching must be released, which only a flow that
// knew it can do.
func (r *SubscriptionFlowReconciler) podEvents() handler.EventHandler {
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.enqueueFlowsFor(ctx, q, e.Object)
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.enqueueFlowsFor(ctx, q, e.ObjectOld, e.ObjectNew)
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.memory.forgetPod(e.Object.GetUID())
			r.enqueueFlowsFor(ctx, q, e.Object)
		},
	}
}

func (r *SubscriptionFlowReconciler) enqueueFlowsFor(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request], pods ...client.Object) {
	var flows subflowv1.SubscriptionFlowList
	// Read-only: each pod event of a start or a rollout would otherwise deep-copy every flow of
	// the namespace.
	if err := r.List(ctx, &flows, client.InNamespace(pods[0].GetNamespace()), client.UnsafeDisableDeepCopy); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing flows for a pod event failed")
		return
	}
	for i := range flows.Items {
		flow := &flows.Items[i]
		if r.flowConcernsPod(flow, pods...) {
			q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: flow.Namespace, Name: flow.Name}})
		}
	}
}

func (r *SubscriptionFlowReconciler) flowConcernsPod(flow *subflowv1.SubscriptionFlow, pods ...client.Object) bool {
	selector, selErr := flow.PodSelector()
	for _, pod := range pods {
		if selErr == nil && selector.Matches(labels.Set(pod.GetLabels())) {
			return true
		}
		if r.memory.holds(flow, pod.GetName()) {
			return true
		}
	}
	return false
}

// podChangesAgentReach lets through only pod updates that can change which agents a flow
// reaches or whether an agent restarted: labels, IP, phase, deletion, container restarts (a
// pod's container ports cannot change once it is created).
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

// restarts counts the pod's container restarts, native sidecars' included (the agent may run
// in one): a restarted agent has lost its rules.
func restarts(pod *corev1.Pod) int32 {
	var n int32
	for _, s := range pod.Status.ContainerStatuses {
		n += s.RestartCount
	}
	for _, s := range pod.Status.InitContainerStatuses {
		n += s.RestartCount
	}
	return n
}
