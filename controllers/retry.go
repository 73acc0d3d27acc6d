package controllers

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Each flow has a retry delay that doubles from firstRetry up to maxRetry while it is not
// ready, so that an unreachable pod or a wrong token is retried soon at first and then without
// hammering anyone. Pod and flow events still reconcile at once. The flow's failures are counted
// in its memory (flowMemory.failures), the delays being client-go's per-item exponential rate
// limiter's.

// nextRetry is the delay before the flow's next retry, counting this one.
func (m *memory) nextRetry(key types.NamespacedName) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.flowLocked(key, true)
	delay := firstRetry
	for i := 0; i < f.failures && delay < maxRetry; i++ {
		delay *= 2
	}
	if delay < maxRetry {
		f.failures++ // beyond the cap the count no longer matters: it stays bounded
	}
	return min(delay, maxRetry)
}

// resetRetries forgets the flow's failures: the next retry waits firstRetry again.
func (m *memory) resetRetries(key types.NamespacedName) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if f := m.flowLocked(key, false); f != nil {
		f.failures = 0
	}
}
