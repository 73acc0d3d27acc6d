package controllers

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// retryBook gives each flow a retry delay that doubles from firstRetry up to maxRetry while it
// is not ready, so that an unreachable pod or a wrong token is retried soon at first and then
// without hammering anyone. Pod and flow events still reconcile at once.
type retryBook struct {
	mu       sync.Mutex
	attempts map[types.NamespacedName]int
}

func (b *retryBook) next(key types.NamespacedName) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.attempts == nil {
		b.attempts = map[types.NamespacedName]int{}
	}
	n := b.attempts[key]
	b.attempts[key] = n + 1
	return backoff(n)
}

func (b *retryBook) reset(key types.NamespacedName) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.attempts, key)
}

// backoff is firstRetry * 2^attempt, at most maxRetry.
func backoff(attempt int) time.Duration {
	if attempt >= 16 {
		return maxRetry
	}
	return min(firstRetry<<attempt, maxRetry)
}
