package controllers

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// statusWriteTimeout bounds one status write; the flow's next reconcile waits for it to end.
const statusWriteTimeout = 30 * time.Second

// statusWriters bounds the status writes in flight (--max-concurrent-status-writes). Made when
// first used, so that a reconciler built as a struct literal has one too.
type statusWriters struct {
	once  sync.Once
	slots chan struct{}
}

func (w *statusWriters) get(n int) chan struct{} {
	w.once.Do(func() { w.slots = make(chan struct{}, n) })
	return w.slots
}

// writeStatus stores the status a reconcile computed, off the worker: the worker goes on to
// the next flow's pushes instead of waiting for this flow's write (with 100 flows of 10 pods
// changed at once the last flows' pushes queued behind the first flows' status writes:
// BENCHMARKS.md, BenchmarkFleetPause; docs/fleet-scale-findings.md).
// The write carries the resourceVersion read, as before: one computed from a copy that is no
// longer the stored one (another controller wrote) is refused, so revision and
// observedGeneration never go back, and a transition is announced only by the write that stored
// it. Until the write ends, the flow's reconciles are deferred to its end (written.go), so at
// most one write per flow is in flight and the next reconcile starts from what it stored. A
// refused write reconciles the flow again: soon after a conflict, after the flow's retry delay
// otherwise.
func (r *SubscriptionFlowReconciler) writeStatus(ctx context.Context, stored, flow *subflowv1.SubscriptionFlow, seen []string) {
	key := client.ObjectKeyFromObject(flow)
	log := ctrl.LoggerFrom(ctx)
	slots := r.statusWrites.get(cmp.Or(max(r.MaxConcurrentStatusWrites, 0), DefaultMaxConcurrentStatusWrites))
	r.memory.writing(key)
	go func() {
		slots <- struct{}{}
		// The reconcile's context ends with the manager; the write still gets its answer.
		writeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), statusWriteTimeout)
		err := r.Status().Patch(writeCtx, flow, client.MergeFromWithOptions(stored, client.MergeFromWithOptimisticLock{}))
		cancel()
		<-slots
		switch {
		case err == nil && flow.ResourceVersion == stored.ResourceVersion:
			// The API server stored nothing new (the same status): no version of the cache is
			// older than what it holds, so nothing is waited for.
			if r.memory.ended(key) {
				r.reconcileAgain(ctx, key, 0)
			}
		case err == nil:
			if r.memory.wrote(key, append(seen, stored.ResourceVersion), r.wallClock().Now()) {
				r.reconcileAgain(ctx, key, 0)
			}
			r.emitEvents(stored, flow)
		case apierrors.IsNotFound(err):
			if r.memory.ended(key) { // deleted meanwhile: the deletion's reconcile was deferred
				r.reconcileAgain(ctx, key, 0)
			}
		case apierrors.IsConflict(err):
			r.memory.ended(key)
			log.V(1).Info("Status changed since it was read; reconciling again", "flow", klog.KObj(flow))
			r.reconcileAgain(ctx, key, readAgainAfter)
		default:
			r.memory.ended(key)
			retry := r.memory.nextRetry(key)
			log.Error(err, "Writing status; reconciling again", "flow", klog.KObj(flow), "after", retry)
			r.reconcileAgain(ctx, key, retry)
		}
	}()
}

// statusChanged reports whether a computed status differs from the stored one as the API
// server stores it: their JSON, in which times are kept to the second. A time kept to the
// nanosecond in memory (a condition's since) made every reconcile a write that stored nothing,
// and for cacheWait after each the flow waited for a cache with nothing newer to show: some
// pauses by condition came cacheWait late (BENCHMARKS.md, BenchmarkConditionPause).
func statusChanged(stored, computed subflowv1.SubscriptionFlowStatus) bool {
	a, errStored := json.Marshal(stored)
	b, errComputed := json.Marshal(computed)
	return errStored != nil || errComputed != nil || !bytes.Equal(a, b)
}

// reconcileAgain queues the flow after d. Unlike wake it waits for room on the channel: a
// refused write may have no other retry than the flow's resync. ctx is the reconcile's, which
// ends with the manager.
func (r *SubscriptionFlowReconciler) reconcileAgain(ctx context.Context, key types.NamespacedName, d time.Duration) {
	if r.lateAnswers == nil {
		return
	}
	time.AfterFunc(d, func() {
		select {
		case r.lateAnswers <- wakeEvent(key):
		case <-ctx.Done():
		}
	})
}
