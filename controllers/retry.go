package controllers

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
)

// retryBook gives each flow a retry delay that doubles from firstRetry up to maxRetry while it
// is not ready, so that an unreachable pod or a wrong token is retried soon at first and then
// without hammering anyone. Pod and flow events still reconcile at once. It is client-go's
// per-item exponential rate limiter, made when first used so that a reconciler built as a
// struct literal (tests, benchmarks) has one too.
type retryBook struct {
	once    sync.Once
	limiter workqueue.TypedRateLimiter[types.NamespacedName]
}

func (b *retryBook) get() workqueue.TypedRateLimiter[types.NamespacedName] {
	b.once.Do(func() {
		b.limiter = workqueue.NewTypedItemExponentialFailureRateLimiter[types.NamespacedName](firstRetry, maxRetry)
	})
	return b.limiter
}

// next is the delay before the flow's next retry, counting this one.
func (b *retryBook) next(key types.NamespacedName) time.Duration { return b.get().When(key) }

// reset forgets the flow's failures: the next retry waits firstRetry again.
func (b *retryBook) reset(key types.NamespacedName) { b.get().Forget(key) }
