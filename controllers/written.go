package controllers

import (
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// writtenBook remembers what each flow's status was last written with, as far as events read
// it (conditions and seek). Events announce a change from the status before a reconcile to the
// one after it; the informer's copy can lag the controller's own writes, and comparing with
// that copy would announce one transition twice. The controller is the status's only writer,
// so its last write is the newest status; after a restart or a leader change it starts from
// the informer's copy.
type writtenBook struct {
	mu     sync.Mutex
	byFlow map[types.NamespacedName]*subflowv1.SubscriptionFlow
}

// before returns the status to compare a reconcile's result with: the last one written for
// this flow (the same UID: a recreated flow starts over), else the one read.
func (b *writtenBook) before(read *subflowv1.SubscriptionFlow) *subflowv1.SubscriptionFlow {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w, ok := b.byFlow[flowKey(read)]; ok && w.UID == read.UID {
		return w
	}
	return read
}

// set records the status just written.
func (b *writtenBook) set(flow *subflowv1.SubscriptionFlow) {
	w := &subflowv1.SubscriptionFlow{}
	w.UID = flow.UID
	w.Status.Conditions = slices.Clone(flow.Status.Conditions)
	w.Status.Seek = flow.Status.Seek.DeepCopy()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.byFlow == nil {
		b.byFlow = map[types.NamespacedName]*subflowv1.SubscriptionFlow{}
	}
	b.byFlow[flowKey(flow)] = w
}

func (b *writtenBook) forget(key types.NamespacedName) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.byFlow, key)
}
