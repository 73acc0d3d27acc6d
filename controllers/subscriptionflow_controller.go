// Package controllers holds the SubscriptionFlow reconciler: it computes the effective state of
// each flow, pushes it to the agents of the selected pods and writes what they report into status.
package controllers

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// Permissions, least privilege: Secrets are read one by one (get) and created when missing; the
// controller never lists or watches them.
// +kubebuilder:rbac:groups=subflow.dev,resources=subscriptionflows,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=subflow.dev,resources=subscriptionflows/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=subflow.dev,resources=subscriptionflows/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;create
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Defaults for the reconciler's tunables.
const (
	DefaultResync        = 5 * time.Minute
	DefaultParallelism   = 64
	DefaultPushTimeout   = 5 * time.Second
	notReadyRetry        = 2 * time.Second
	releaseGiveUpAfter   = 2 * time.Minute
	maxConcurrentFlows   = 8
	eventActionReconcile = "Reconcile"
)

// Clock tells the time; tests move a fake one across maintenance windows and override expiry.
type Clock interface{ Now() time.Time }

// RealClock is the wall clock.
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// SubscriptionFlowReconciler reconciles SubscriptionFlow objects.
type SubscriptionFlowReconciler struct {
	client.Client
	Scheme   *runtime.Scheme
	Agents   AgentClient
	Clock    Clock
	Recorder events.EventRecorder
	// Resync is the periodic fallback push; watches on flows and pods are the main path.
	Resync time.Duration
	// Parallelism bounds concurrent pushes per flow.
	Parallelism int
}

func (r *SubscriptionFlowReconciler) parallelism() int {
	if r.Parallelism > 0 {
		return r.Parallelism
	}
	return DefaultParallelism
}

func (r *SubscriptionFlowReconciler) resync() time.Duration {
	if r.Resync > 0 {
		return r.Resync
	}
	return DefaultResync
}

// Reconcile drives one SubscriptionFlow toward its effective state.
func (r *SubscriptionFlowReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	flow := &subflowv1.SubscriptionFlow{}
	if err := r.Get(ctx, req.NamespacedName, flow); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !flow.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, flow)
	}
	if err := r.patchFinalizer(ctx, flow, controllerutil.AddFinalizer); err != nil {
		return ctrl.Result{}, err
	}
	original := flow.DeepCopy()
	result, err := r.reconcileNormal(ctx, flow)
	if !equality.Semantic.DeepEqual(original.Status, flow.Status) {
		if patchErr := r.Status().Patch(ctx, flow, client.MergeFrom(original)); patchErr != nil {
			return ctrl.Result{}, patchErr
		}
	}
	r.emitEvents(original, flow)
	return result, err
}

// reconcileNormal computes the effective state, pushes it to every matched agent and sets
// flow.Status from what they answered.
func (r *SubscriptionFlowReconciler) reconcileNormal(ctx context.Context, flow *subflowv1.SubscriptionFlow) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	now := r.Clock.Now()
	eff, err := EffectiveState(flow, now)
	if err != nil {
		flow.Status = stalledStatus(flow, subflowv1.ReasonInvalidSpec, err.Error())
		log.Info("Flow spec cannot be applied", "reason", err.Error())
		return ctrl.Result{}, nil // terminal until the spec changes
	}
	token, err := r.agentToken(ctx, flow)
	if err != nil {
		return ctrl.Result{}, err
	}
	pods, err := r.matchedPods(ctx, flow)
	if err != nil {
		return ctrl.Result{}, err
	}
	obs := observation{Effective: eff, Revision: nextRevision(flow, eff), Now: now, TokenRef: tokenRefText(flow),
		PreviousRevision: flow.Status.Revision, PreviousAgents: flow.Status.Agents}
	obs.Executor = keptExecutor(flow, pods)
	target := r.targetFunc(flow, token)
	obs.Outcomes = r.pushAll(ctx, pods, target, func(pod string) protocol.FlowRequest {
		return desiredRequest(flow, eff, obs.Revision, pod == obs.Executor)
	})
	if anyStale(obs.Outcomes) {
		// An agent holds a newer revision (a previous leader, or a status write that was lost):
		// move past it so that this push is not ignored.
		obs.Revision++
		obs.Outcomes = r.pushAll(ctx, pods, target, func(pod string) protocol.FlowRequest {
			return desiredRequest(flow, eff, obs.Revision, pod == obs.Executor)
		})
	}
	r.startSeekIfPending(ctx, flow, eff, pods, target, &obs)
	flow.Status = computeStatus(flow, obs)
	recordFlowMetrics(flow.Namespace, flow.Name, string(eff.State), string(eff.Source), agentsByState(flow.Status))
	log.V(1).Info("Flow reconciled", "flow", klog.KObj(flow), "revision", obs.Revision, "effectiveState", eff.State,
		"matched", flow.Status.Pods.Matched, "synced", flow.Status.Pods.Synced)
	return r.requeue(flow, eff, now), nil
}

// nextRevision bumps the revision whenever what is pushed may change: a new generation or a new
// effective state (window, override).
func nextRevision(flow *subflowv1.SubscriptionFlow, eff Effective) int64 {
	rev := flow.Status.Revision
	if rev == 0 || flow.Status.ObservedGeneration != flow.Generation || flow.Status.EffectiveState != eff.State {
		rev++
	}
	return rev
}

func desiredRequest(flow *subflowv1.SubscriptionFlow, eff Effective, revision int64, execute bool) protocol.FlowRequest {
	req := protocol.FlowRequest{UID: string(flow.UID), Revision: revision, Subscription: flow.Spec.Subscription,
		Topic: flow.Spec.Topic, State: protocol.State(eff.State)}
	if seek := flow.Spec.Seek; seek != nil {
		req.Seek = &protocol.SeekRequest{ID: seek.ID, Index: seek.Index, Execute: execute && !seekFinished(flow)}
		for _, p := range seek.Partitions {
			req.Seek.Partitions = append(req.Seek.Partitions, protocol.PartitionIndex{Partition: p.Partition, Index: p.Index})
		}
	}
	return req
}

func seekFinished(flow *subflowv1.SubscriptionFlow) bool {
	old := flow.Status.Seek
	return flow.Spec.Seek != nil && old != nil && old.ID == flow.Spec.Seek.ID && old.CompletionTime != nil
}

// keptExecutor returns the executor already chosen for the current seek if its pod is still
// matched and addressable; empty means one must be chosen.
func keptExecutor(flow *subflowv1.SubscriptionFlow, pods []corev1.Pod) string {
	old := flow.Status.Seek
	if flow.Spec.Seek == nil || old == nil || old.ID != flow.Spec.Seek.ID || old.Executor == "" {
		return ""
	}
	if old.CompletionTime != nil {
		return old.Executor
	}
	for _, pod := range pods {
		if pod.Name == old.Executor && pod.Status.PodIP != "" {
			return old.Executor
		}
	}
	return ""
}

// startSeekIfPending chooses an executor for a pending seek - the first pod, by name, whose
// agent reported a consumer of the flow - and pushes the request with execute set to it.
func (r *SubscriptionFlowReconciler) startSeekIfPending(ctx context.Context, flow *subflowv1.SubscriptionFlow, eff Effective,
	pods []corev1.Pod, target func(*corev1.Pod) AgentTarget, obs *observation) {
	if flow.Spec.Seek == nil || seekFinished(flow) || obs.Executor != "" {
		return
	}
	for i, o := range obs.Outcomes {
		if o.Status == nil || len(o.Status.Consumers) == 0 {
			continue
		}
		obs.Executor = o.Pod
		status, err := r.Agents.PutFlow(ctx, target(&pods[i]), desiredRequest(flow, eff, obs.Revision, true))
		obs.Outcomes[i] = podOutcome{Pod: o.Pod, Status: &status, Err: err}
		if err != nil {
			obs.Outcomes[i].Status = nil
		}
		return
	}
}

func anyStale(outcomes []podOutcome) bool {
	for _, o := range outcomes {
		if IsStale(o.Err) {
			return true
		}
	}
	return false
}

func (r *SubscriptionFlowReconciler) targetFunc(flow *subflowv1.SubscriptionFlow, token string) func(*corev1.Pod) AgentTarget {
	return func(pod *corev1.Pod) AgentTarget {
		return AgentTarget{Pod: pod.Name, BaseURL: agentBaseURL(pod, flow.Spec.Agent), Token: token,
			Namespace: flow.Namespace, Name: flow.Name}
	}
}

func tokenRefText(flow *subflowv1.SubscriptionFlow) string {
	name, key := tokenRef(flow)
	return fmt.Sprintf("%s/%s key %s", flow.Namespace, name, key)
}

func agentsByState(st subflowv1.SubscriptionFlowStatus) map[string]int {
	counts := map[string]int{}
	for _, a := range st.Agents {
		counts[a.State]++
	}
	return counts
}

// requeue retries soon while agents are not ready, else at the next window boundary or
// override expiry, and at the latest after the resync period.
func (r *SubscriptionFlowReconciler) requeue(flow *subflowv1.SubscriptionFlow, eff Effective, now time.Time) ctrl.Result {
	after := r.resync()
	if !meta.IsStatusConditionTrue(flow.Status.Conditions, subflowv1.ConditionReady) &&
		!meta.IsStatusConditionTrue(flow.Status.Conditions, subflowv1.ConditionStalled) {
		after = notReadyRetry
	}
	if eff.Next != nil {
		if until := eff.Next.Sub(now); until < after {
			after = max(until, time.Millisecond)
		}
	}
	return ctrl.Result{RequeueAfter: after}
}

// reconcileDelete releases the flow's rule in every agent (deletionPolicy Resume) before the
// finalizer goes. Agents that stay unreachable are given up on after a while, with a warning.
func (r *SubscriptionFlowReconciler) reconcileDelete(ctx context.Context, flow *subflowv1.SubscriptionFlow) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(flow, subflowv1.Finalizer) {
		return ctrl.Result{}, nil
	}
	if flow.Spec.DeletionPolicy != subflowv1.DeletionRetain {
		if failed, err := r.releaseAgents(ctx, flow); err != nil {
			return ctrl.Result{}, err
		} else if len(failed) > 0 {
			if r.Clock.Now().Sub(flow.DeletionTimestamp.Time) < releaseGiveUpAfter {
				return ctrl.Result{RequeueAfter: notReadyRetry}, nil
			}
			r.event(flow, corev1.EventTypeWarning, "ReleaseFailed", "Gave up releasing agents: %s", listNames(failed))
		}
	}
	forgetFlowMetrics(flow.Namespace, flow.Name)
	return ctrl.Result{}, r.patchFinalizer(ctx, flow, controllerutil.RemoveFinalizer)
}

// patchFinalizer adds or removes our finalizer with a merge patch, which (unlike an update from
// a possibly stale cache) does not conflict with concurrent writers.
func (r *SubscriptionFlowReconciler) patchFinalizer(ctx context.Context, flow *subflowv1.SubscriptionFlow,
	change func(client.Object, string) bool) error {
	before := flow.DeepCopy()
	if !change(flow, subflowv1.Finalizer) {
		return nil
	}
	return client.IgnoreNotFound(r.Patch(ctx, flow, client.MergeFrom(before)))
}

func (r *SubscriptionFlowReconciler) releaseAgents(ctx context.Context, flow *subflowv1.SubscriptionFlow) ([]string, error) {
	pods, err := r.matchedPods(ctx, flow)
	if err != nil || len(pods) == 0 {
		return nil, err
	}
	token, err := r.agentToken(ctx, flow)
	if err != nil {
		return nil, err
	}
	return r.releaseAll(ctx, pods, r.targetFunc(flow, token), string(flow.UID)), nil
}

// emitEvents records paired events for transitions between the old and new status.
func (r *SubscriptionFlowReconciler) emitEvents(old, flow *subflowv1.SubscriptionFlow) {
	wasPaused := meta.IsStatusConditionTrue(old.Status.Conditions, subflowv1.ConditionPaused)
	paused := meta.FindStatusCondition(flow.Status.Conditions, subflowv1.ConditionPaused)
	switch {
	case paused != nil && paused.Status == metav1.ConditionTrue && !wasPaused:
		r.event(flow, corev1.EventTypeNormal, "Paused", "%s", paused.Message)
	case paused != nil && paused.Reason == subflowv1.ReasonRunning && wasPaused:
		r.event(flow, corev1.EventTypeNormal, "Resumed", "Consumers running again at revision %d", flow.Status.Revision)
	}
	ready := meta.FindStatusCondition(flow.Status.Conditions, subflowv1.ConditionReady)
	oldReady := meta.FindStatusCondition(old.Status.Conditions, subflowv1.ConditionReady)
	if ready != nil && ready.Status == metav1.ConditionFalse && (oldReady == nil || oldReady.Reason != ready.Reason) {
		switch ready.Reason {
		case subflowv1.ReasonAgentsUnreachable:
			r.event(flow, corev1.EventTypeWarning, "AgentUnreachable", "%s", ready.Message)
		case subflowv1.ReasonAgentAuthFailed:
			r.event(flow, corev1.EventTypeWarning, ready.Reason, "%s", ready.Message)
		}
	}
	if seek := flow.Status.Seek; seek != nil && seek.CompletionTime != nil &&
		(old.Status.Seek == nil || old.Status.Seek.ID != seek.ID || old.Status.Seek.CompletionTime == nil) {
		if seek.Message == "" {
			r.event(flow, corev1.EventTypeNormal, "SeekCompleted", "Seek %s executed by %s: %s", seek.ID, seek.Executor, describePositions(seek.Positions))
		} else {
			r.event(flow, corev1.EventTypeWarning, "SeekFailed", "Seek %s failed on %s: %s", seek.ID, seek.Executor, seek.Message)
		}
	}
}

// maxEventNote is the API server's limit on an event's note.
const maxEventNote = 1024

func (r *SubscriptionFlowReconciler) event(flow *subflowv1.SubscriptionFlow, eventType, reason, note string, args ...any) {
	if r.Recorder == nil {
		return
	}
	text := fmt.Sprintf(note, args...)
	if len(text) > maxEventNote {
		text = text[:maxEventNote-3] + "..."
	}
	r.Recorder.Eventf(flow, nil, eventType, reason, eventActionReconcile, "%s", text)
}

// SetupWithManager registers the reconciler: flows, and pods mapped to the flows selecting them.
func (r *SubscriptionFlowReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = RealClock{}
	}
	if r.Agents == nil {
		r.Agents = NewHTTPAgentClient(DefaultPushTimeout)
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&subflowv1.SubscriptionFlow{}, builder.WithPredicates(flowSpecOrIntentChanged)).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.flowsForPod), builder.WithPredicates(podChangesAgentReach)).
		WithOptions(controller.Options{MaxConcurrentReconciles: maxConcurrentFlows}).
		Named("subscriptionflow").
		Complete(r)
}

// flowSpecOrIntentChanged ignores the controller's own status writes: only spec (generation),
// the override annotations and deletion start a reconcile.
var flowSpecOrIntentChanged = predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{},
	predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.GetDeletionTimestamp().IsZero() != e.ObjectNew.GetDeletionTimestamp().IsZero()
	}})

// ClientOptions are the manager client options the reconciler needs: Secrets are read
// directly, so the controller never caches (and never needs list/watch on) every Secret.
func ClientOptions() client.Options {
	return client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}}
}
