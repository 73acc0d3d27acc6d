// Package controllers holds the SubscriptionFlow reconciler: it computes the effective state of
// each flow, pushes it to the agents of the selected pods and writes what they report into status.
package controllers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// Permissions, least privilege, exactly what the code uses (a test runs the manager with them):
// flows are watched and patched (finalizer, status); Pods are read from the cache only (list,
// watch); Secrets are read one by one, only the agent-token Secret by name, and created when
// missing - never listed or watched. No finalizers/update: the finalizer is set by a patch of the
// flow, and nothing the controller creates has an ownerReference blocking a flow's deletion.
// +kubebuilder:rbac:groups=subflow.dev,resources=subscriptionflows,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=subflow.dev,resources=subscriptionflows/status,verbs=patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get,resourceNames=subflow-agent-token
// +kubebuilder:rbac:groups="",resources=secrets,verbs=create
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Defaults for the reconciler's tunables.
const (
	DefaultResync      = 5 * time.Minute
	DefaultParallelism = 64
	DefaultPushTimeout = 5 * time.Second
	firstRetry         = time.Second
	maxRetry           = time.Minute
	seekPoll           = time.Second
	releaseGiveUpAfter = 2 * time.Minute
	cacheWait          = 2 * time.Second
	cacheRecheck       = 5 * time.Millisecond
	readAgainAfter     = 50 * time.Millisecond
	// DefaultMaxConcurrentReconciles bounds the flows reconciled at once. A reconcile spends
	// nearly all its time waiting for the API server (a Secret read, a status write, the
	// informer catching up), so the bound is the API server's latency, not CPU.
	DefaultMaxConcurrentReconciles = 8
	// DefaultMaxConcurrentStatusWrites bounds the status writes in flight, below the workers:
	// when many flows change at once, a saturated API server then answers the input and the
	// token reads first, so the pushes that halt consumers come before the reports of them
	// (BENCHMARKS.md, BenchmarkFleetPause at 100 flows x 10 pods; docs/fleet-scale-findings.md).
	DefaultMaxConcurrentStatusWrites = 4
)

// SubscriptionFlowReconciler reconciles SubscriptionFlow objects.
type SubscriptionFlowReconciler struct {
	client.Client
	Scheme *runtime.Scheme
	Agents AgentClient
	// Clock tells the time written into status and read against windows, override expiry and
	// pause conditions; tests move a fake one.
	Clock    clock.PassiveClock
	Recorder events.EventRecorder
	// Resync is the periodic fallback push; watches on flows and pods are the main path.
	Resync time.Duration
	// Parallelism bounds concurrent pushes per flow.
	Parallelism int
	// MaxConcurrentReconciles bounds the flows reconciled at once; zero means
	// DefaultMaxConcurrentReconciles.
	MaxConcurrentReconciles int
	// MaxConcurrentStatusWrites bounds the status writes in flight; zero means
	// DefaultMaxConcurrentStatusWrites.
	MaxConcurrentStatusWrites int
	// BacklogLeadTime is how long before the broker's retention would delete a halted flow's
	// waiting messages BacklogAtRisk turns True; zero means DefaultBacklogLeadTime.
	BacklogLeadTime time.Duration
	// TokenRotationGrace is how long after a token Secret changes the previous token is offered
	// to agents that refuse the new one; zero means DefaultTokenRotationGrace.
	TokenRotationGrace time.Duration
	// RefreshPushesPerSecond bounds the pushes of every halted flow's refresh together (the
	// flows' refresh periods grow to share it); zero means DefaultRefreshPushesPerSecond.
	RefreshPushesPerSecond int
	// Conditions evaluates the flows' spec.pauseWhen; SetupWithManager makes one reading
	// objects through the API server when it is nil (and without Prometheus).
	Conditions *Conditions

	tokens tokenBook
	// memory is what this process keeps between reconciles, per flow and per pod (memory.go).
	memory memory
	// wall times the process's own waits: a pod's backoff step, how long a settled answer is
	// reused, how long a reconcile waits for the cache to show a status write, a push's
	// duration. They pair with the work queue's delays and timers, which run on the wall clock,
	// so they are not Clock's: the tests' Clock stands still and jumps by hours, which would hold
	// a pod back for good or lift every hold at once. The real clock unless a test sets one.
	wall clock.PassiveClock
	// statusWrites bounds the status writes in flight (writeStatus).
	statusWrites statusWriters
	// podIndex is the manager's pod cache, read in place (namespacePods).
	podIndex toolscache.Indexer
	// lateAnswers requeues a flow when a push that outlived its reconcile ends.
	lateAnswers chan event.GenericEvent
}

func (r *SubscriptionFlowReconciler) wallClock() clock.PassiveClock {
	if r.wall != nil {
		return r.wall
	}
	return clock.RealClock{}
}

func (r *SubscriptionFlowReconciler) parallelism() int {
	if r.Parallelism > 0 {
		return r.Parallelism
	}
	return DefaultParallelism
}

func (r *SubscriptionFlowReconciler) backlogLeadTime() time.Duration {
	if r.BacklogLeadTime > 0 {
		return r.BacklogLeadTime
	}
	return DefaultBacklogLeadTime
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
		if apierrors.IsNotFound(err) {
			// Gone, also when someone removed the finalizer by hand: nothing of it may linger.
			r.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if r.memory.deferToWrite(req.NamespacedName) {
		return ctrl.Result{}, nil // the write's end reconciles the flow again
	}
	if r.memory.stale(req.NamespacedName, flow.ResourceVersion, r.wallClock().Now()) {
		return ctrl.Result{RequeueAfter: cacheRecheck}, nil
	}
	if !flow.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, flow)
	}
	seen := []string{flow.ResourceVersion}
	if err := r.patchFinalizer(ctx, flow, controllerutil.AddFinalizer); err != nil {
		return ctrl.Result{}, err
	}
	// stored is the flow as the API server holds it; writes during the reconcile (heldBy)
	// keep it so.
	stored := flow.DeepCopy()
	result, err := r.reconcileNormal(ctx, flow, stored)
	if apierrors.IsConflict(err) {
		return r.readAgain(ctx, flow)
	}
	if statusChanged(stored.Status, flow.Status) {
		r.writeStatus(ctx, stored, flow, seen)
	}
	return result, err
}

// readAgain reconciles a flow again soon after its status changed since it was read.
func (r *SubscriptionFlowReconciler) readAgain(ctx context.Context, flow *subflowv1.SubscriptionFlow) (ctrl.Result, error) {
	ctrl.LoggerFrom(ctx).V(1).Info("Status changed since it was read; reconciling again", "flow", klog.KObj(flow))
	return ctrl.Result{RequeueAfter: readAgainAfter}, nil
}

// reconcileNormal computes the effective state, records and pushes it to every matched agent,
// releases agents that no longer match, and sets flow.Status from what they answered. Input the
// API server accepted but that cannot be used stalls the flow and changes nothing in the agents.
func (r *SubscriptionFlowReconciler) reconcileNormal(ctx context.Context, flow, stored *subflowv1.SubscriptionFlow) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	now := r.Clock.Now()
	conditions := r.evaluateConditions(ctx, flow, now)
	eff := EffectiveState(flow, now)
	selector, err := flow.PodSelector()
	if err != nil {
		return r.stall(ctx, flow, fmt.Sprintf("spec.selector cannot be used: %v", err)), nil
	}
	tokens, err := r.agentToken(ctx, flow)
	var tokenErr *tokenProblem
	if errors.As(err, &tokenErr) {
		return r.stall(ctx, flow, tokenErr.Error()), nil
	} else if err != nil {
		return ctrl.Result{}, err
	}
	pods, err := r.matchedPods(ctx, flow, selector)
	if err != nil {
		return ctrl.Result{}, err
	}
	if len(pods) > subflowv1.MaxHolders {
		return r.stall(ctx, flow, fmt.Sprintf("spec.selector matches %d pods; one flow drives at most %d", len(pods), subflowv1.MaxHolders)), nil
	}
	holders, err := r.recordHolders(ctx, flow, stored, r.memory.holdersOf(flow), pods)
	if err != nil {
		return ctrl.Result{}, err
	}
	target := r.targetFunc(flow, tokens, len(pods))
	kept, released, unreleased, err := r.releaseStale(ctx, flow, holders, pods, target)
	if err != nil {
		return ctrl.Result{}, err
	}
	live := slices.DeleteFunc(pods, func(p *corev1.Pod) bool { return !p.DeletionTimestamp.IsZero() })
	obs := observation{Effective: eff, Conditions: conditions, Revision: nextRevision(flow, eff), Now: now, TokenRef: tokenRefText(flow), Tokens: tokens,
		PreviousRevision: flow.Status.Revision, PreviousAgents: flow.Status.Agents, HeldBy: kept, Unreleased: unreleased, BacklogLeadTime: r.backlogLeadTime()}
	obs.Executor = keptExecutor(flow, live)
	obs.Reporter, obs.Subscription = backlogReporter(flow, eff.State, live), flow.Spec.Subscription
	obs.Watcher, obs.WatcherMissing = backlogWatcher(flow, live)
	r.pushRevision(ctx, flow, live, target, &obs)
	r.memory.keepBacklogFigures(flow, backlogFiguresOf(obs.Watcher, obs.WatcherMissing, obs.Outcomes))
	r.startSeekIfPending(ctx, flow, live, target, &obs)
	obs.Orphaned = r.orphanedRules(ctx, obs.Outcomes)
	obs.Selector = metav1.FormatLabelSelector(&flow.Spec.Selector)
	succeededBefore := seekSucceeded(flow)
	flow.Status = computeStatus(flow, obs)
	if !succeededBefore && seekSucceeded(flow) {
		// Tell the other agents now: only after success do they drop what they held.
		r.pushRevision(ctx, flow, live, target, &obs)
		flow.Status = computeStatus(flow, obs)
	}
	r.memory.setHolders(flow, kept)
	if len(released) > 0 {
		r.event(flow, corev1.EventTypeNormal, "Released", "Released the rule in pods that no longer match: %s", listNames(released))
	}
	r.recordFlowMetrics(flow.Namespace, flow.Name, string(eff.State), string(eff.Source), obs.agentStates(),
		meta.IsStatusConditionTrue(flow.Status.Conditions, subflowv1.ConditionBacklogAtRisk))
	log.V(1).Info("Flow reconciled", "flow", klog.KObj(flow), "revision", obs.Revision, "effectiveState", eff.State,
		"matched", flow.Status.Pods.Matched, "synced", flow.Status.Pods.Synced)
	return r.requeue(flow, obs), nil
}

// pushRevision pushes the current revision to every pod. An agent that holds a newer revision
// (a previous leader's, or one whose status write was lost) answers with it; the controller
// moves past the highest such revision in one step and pushes again.
func (r *SubscriptionFlowReconciler) pushRevision(ctx context.Context, flow *subflowv1.SubscriptionFlow, pods []*corev1.Pod,
	target func(*corev1.Pod) AgentTarget, obs *observation) {
	request := func(pod string) protocol.FlowRequest {
		req := desiredRequest(flow, obs.Effective, obs.Revision, pod == obs.Executor)
		req.ReportBacklog = pod == obs.Reporter
		if pod == obs.Watcher {
			req.BacklogOf = backlogSubscriptions(flow)
		}
		return req
	}
	key, fresh := flowKey(flow), r.answersFresh(obs.Effective.State, len(pods))
	obs.Outcomes, obs.HeldUntil = r.pushAll(ctx, key, pods, target, request, fresh)
	if newest := newestStale(obs.Outcomes); newest >= obs.Revision {
		obs.Revision = newest + 1
		obs.Outcomes, obs.HeldUntil = r.pushAll(ctx, key, pods, target, request, fresh)
	}
	for i := range obs.Outcomes {
		if unanswered(obs.Outcomes[i]) {
			obs.Outcomes[i].Wiring = wiringProblems(pods[i], flow, obs.Outcomes[i].Err)
		}
	}
}

// stall reports input that a person must fix; nothing is pushed or released meanwhile.
func (r *SubscriptionFlowReconciler) stall(ctx context.Context, flow *subflowv1.SubscriptionFlow, message string) ctrl.Result {
	ctrl.LoggerFrom(ctx).V(1).Info("Flow spec cannot be applied", "flow", klog.KObj(flow), "reason", message)
	flow.Status = stalledStatus(flow, subflowv1.ReasonInvalidSpec, message, r.Clock.Now())
	r.memory.setRefreshed(flowKey(flow), 0) // nothing is pushed meanwhile
	// A referenced Secret is not watched: look again after a while, backing off.
	return ctrl.Result{RequeueAfter: r.memory.nextRetry(flowKey(flow))}
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
	return protocol.FlowRequest{UID: string(flow.UID), Revision: revision, Subscription: flow.Spec.Subscription,
		Topic: flow.Spec.Topic, State: protocol.State(eff.State), Seek: seekRequest(flow, execute)}
}

// orphanedRules returns the UIDs of the rules holding consumers whose flow no longer exists
// (a flow deleted with deletionPolicy Retain leaves its rule in the agents).
func (r *SubscriptionFlowReconciler) orphanedRules(ctx context.Context, outcomes []podOutcome) map[string]bool {
	orphaned := map[string]bool{}
	checked := map[string]bool{}
	for _, o := range outcomes {
		if o.Status == nil {
			continue
		}
		for _, ref := range o.Status.HeldBy {
			if checked[ref.UID] {
				continue
			}
			checked[ref.UID] = true
			var holder subflowv1.SubscriptionFlow
			err := r.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}, &holder)
			// Any other error (a name no flow can have) leaves the rule unnamed as an orphan.
			orphaned[ref.UID] = apierrors.IsNotFound(err) || (err == nil && string(holder.UID) != ref.UID)
		}
	}
	return orphaned
}

// newestStale returns the highest revision agents reported holding in a 409, or 0.
func newestStale(outcomes []podOutcome) int64 {
	var newest int64
	for _, o := range outcomes {
		var agentErr *AgentError
		if IsStale(o.Err) && errors.As(o.Err, &agentErr) {
			newest = max(newest, agentErr.AppliedRevision)
		}
	}
	return newest
}

func (r *SubscriptionFlowReconciler) targetFunc(flow *subflowv1.SubscriptionFlow, tokens agentTokens, pods int) func(*corev1.Pod) AgentTarget {
	unpooled := !wantPooled(pods)
	return func(pod *corev1.Pod) AgentTarget {
		return AgentTarget{Pod: pod.Name, BaseURL: agentBaseURL(pod, flow.Spec.Agent), Token: tokens.Current, PreviousToken: tokens.Previous,
			Namespace: flow.Namespace, Name: flow.Name, Unpooled: unpooled}
	}
}

func tokenRefText(flow *subflowv1.SubscriptionFlow) string {
	name, key := tokenRef(flow)
	return fmt.Sprintf("%s/%s key %s", flow.Namespace, name, key)
}

// requeue comes back at the next window boundary or override expiry, and at the latest after
// the resync period; sooner while a seek runs; with a growing delay (1 s doubling to 1 min) while
// agents are not ready or a holder could not be released, but no later than a pod held back
// (podbackoff.go) may be pushed again.
func (r *SubscriptionFlowReconciler) requeue(flow *subflowv1.SubscriptionFlow, obs observation) ctrl.Result {
	after := r.resync()
	ready := meta.IsStatusConditionTrue(flow.Status.Conditions, subflowv1.ConditionReady)
	if ready {
		r.memory.resetRetries(flowKey(flow))
	} else {
		after = r.memory.nextRetry(flowKey(flow))
	}
	if !obs.HeldUntil.IsZero() {
		after = min(after, max(obs.HeldUntil.Sub(r.wallClock().Now()), time.Millisecond)) // the pushes' clock
	}
	if refresh := r.refreshAfter(flow, len(obs.Outcomes)); refresh > 0 {
		after = min(after, refresh)
	}
	if seekRunning(obs) {
		after = min(after, seekPoll)
	}
	if obs.Reporter != "" && obs.Effective.State != subflowv1.StateRunning {
		after = min(after, backlogRecheck) // the backlog grows: keep the prediction fresh
	}
	if next := obs.Effective.Next; next != nil {
		if until := next.Sub(obs.Now); until < after {
			after = max(until, time.Millisecond)
		}
	}
	if next := obs.Conditions.next; !next.IsZero() {
		after = min(after, max(next.Sub(obs.Now), time.Millisecond))
	}
	return ctrl.Result{RequeueAfter: after}
}

// evaluateConditions reads the flow's due spec.pauseWhen conditions into flow.Status.PauseWhen,
// where EffectiveState reads them, and records an event for each decision that changed.
func (r *SubscriptionFlowReconciler) evaluateConditions(ctx context.Context, flow *subflowv1.SubscriptionFlow, now time.Time) conditionOutcome {
	out := r.Conditions.evaluate(ctx, flow, &r.memory, now)
	flow.Status.PauseWhen = out.statuses
	for _, change := range out.changed {
		reason := "AutoResumed"
		if strings.Contains(change, " holds: ") {
			reason = "AutoPaused"
		}
		r.event(flow, corev1.EventTypeNormal, reason, "%s", change)
	}
	return out
}

// reconcileDelete releases the flow's rule in every agent that holds it (deletionPolicy Resume)
// before the finalizer goes: the recorded holders and any pod matched now. Agents that stay
// unreachable are given up on after a while, with a warning.
func (r *SubscriptionFlowReconciler) reconcileDelete(ctx context.Context, flow *subflowv1.SubscriptionFlow) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(flow, subflowv1.Finalizer) {
		r.forget(flowKey(flow))
		return ctrl.Result{}, nil
	}
	if flow.Spec.DeletionPolicy != subflowv1.DeletionRetain {
		if failed, err := r.releaseAgents(ctx, flow); err != nil {
			return ctrl.Result{}, err
		} else if len(failed) > 0 {
			if r.Clock.Now().Sub(flow.DeletionTimestamp.Time) < releaseGiveUpAfter {
				return ctrl.Result{RequeueAfter: r.memory.nextRetry(flowKey(flow))}, nil
			}
			r.event(flow, corev1.EventTypeWarning, "ReleaseFailed", "Gave up releasing agents: %s", listNames(failed))
		}
	}
	if err := r.patchFinalizer(ctx, flow, controllerutil.RemoveFinalizer); err != nil {
		return ctrl.Result{}, err
	}
	r.forget(flowKey(flow))
	return ctrl.Result{}, nil
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

// releaseAgents sends DELETE to every holder and every pod matched now; it returns the ones
// that failed. A Secret that cannot be used leaves nothing to authenticate with: all fail.
func (r *SubscriptionFlowReconciler) releaseAgents(ctx context.Context, flow *subflowv1.SubscriptionFlow) ([]string, error) {
	names := map[string]bool{}
	for _, name := range r.memory.holdersOf(flow) {
		names[name] = true
	}
	if selector, err := flow.PodSelector(); err == nil {
		matched, err := r.matchedPods(ctx, flow, selector)
		if err != nil {
			return nil, err
		}
		for _, pod := range matched {
			names[pod.Name] = true
		}
	}
	var pods []*corev1.Pod
	for _, name := range sortedKeys(names) {
		pod := &corev1.Pod{}
		err := r.Get(ctx, types.NamespacedName{Namespace: flow.Namespace, Name: name}, pod)
		if apierrors.IsNotFound(err) {
			continue
		} else if err != nil {
			return nil, err
		}
		if pushable(pod) {
			pods = append(pods, pod)
		}
	}
	if len(pods) == 0 {
		return nil, nil
	}
	tokens, err := r.agentToken(ctx, flow)
	if err != nil {
		return []string{"all holders (" + err.Error() + ")"}, nil
	}
	var failed []string
	for _, f := range r.releaseAll(ctx, pods, r.targetFunc(flow, tokens, len(pods)), string(flow.UID)) {
		failed = append(failed, f.String())
	}
	return failed, nil
}

// SetupWithManager registers the reconciler: flows, and pods mapped to the flows selecting them.
func (r *SubscriptionFlowReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.Agents == nil {
		r.Agents = NewHTTPAgentClient(DefaultPushTimeout, nil)
	}
	if r.Conditions == nil {
		r.Conditions = &Conditions{}
	}
	if r.Conditions.Reader == nil {
		// Not the cache: the objects conditions name are few, and caching every Deployment of
		// the cluster for them would cost far more.
		r.Conditions.Reader = mgr.GetAPIReader()
	}
	r.Conditions.readings.Now = r.Clock.Now
	r.lateAnswers = make(chan event.GenericEvent, 1024)
	// The informer the pod watch below uses; before the manager starts, this only creates it.
	pods, err := mgr.GetCache().GetInformer(context.Background(), &corev1.Pod{})
	if err != nil {
		return err
	}
	if shared, ok := pods.(toolscache.SharedIndexInformer); ok {
		r.podIndex = shared.GetIndexer()
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&subflowv1.SubscriptionFlow{}, builder.WithPredicates(flowSpecOrIntentChanged)).
		Watches(&corev1.Pod{}, r.podEvents(), builder.WithPredicates(podChangesAgentReach)).
		WatchesRawSource(source.Channel(r.lateAnswers, &handler.EnqueueRequestForObject{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: cmp.Or(r.MaxConcurrentReconciles, DefaultMaxConcurrentReconciles)}).
		Named("subscriptionflow").
		Complete(r)
}

// flowSpecOrIntentChanged ignores the controller's own status writes: only spec (generation),
// the override annotations and deletion start a reconcile.
var flowSpecOrIntentChanged = predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{},
	predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.GetDeletionTimestamp().IsZero() != e.ObjectNew.GetDeletionTimestamp().IsZero()
	}})

// CacheOptions are the manager cache options the reconciler expects: managedFields are dropped
// from cached objects, as the controller never reads them - for a flow holding 10 000 pods they
// are most of its size (status.heldBy is a set, tracked item by item), and every cache read
// deep-copies them; pods keep only the fields the controller reads (cachedPod).
func CacheOptions() cache.Options {
	return cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject:         map[client.Object]cache.ByObject{&corev1.Pod{}: {Transform: cachedPod}},
	}
}

// ClientOptions are the manager client options the reconciler needs: Secrets are read
// directly, so the controller never caches (and never needs list/watch on) every Secret.
func ClientOptions() client.Options {
	return client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}}
}
