package controllers

import (
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// writtenBook remembers, per flow, the versions the informer's cache may still hold after this
// process wrote the flow's status: the ones read before the write. A reconcile that starts from
// one of them would push an old revision and have its status write refused, so it is put back
// on the queue for a moment instead. The flow's worker is not held while the cache catches up
// (polling held it 24-27 ms of a ~170 ms reconcile at 100 flows x 10 pods:
// docs/fleet-scale-findings.md).
type writtenBook struct {
	mu     sync.Mutex
	byFlow map[types.NamespacedName]staleVersions
}

type staleVersions struct {
	// writing is true while a status write of the flow is in flight (statuswrite.go): until it
	// ends, every version the cache holds may be older than what it stores. asked is true when
	// a reconcile of the flow came meanwhile and was deferred to the write's end.
	writing, asked bool
	versions       []string
	// until bounds the wait: an informer that never shows the write (a watch that broke and
	// relisted past it) must not stall the flow.
	until time.Time
}

// writing records that a status write of the flow has begun; wrote or ended ends it.
func (b *writtenBook) writing(key types.NamespacedName) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.byFlow == nil {
		b.byFlow = map[types.NamespacedName]staleVersions{}
	}
	b.byFlow[key] = staleVersions{writing: true}
}

// wrote records, at the end of the write writing began, that the versions are older than what
// this process has just written, and tells whether a reconcile was deferred to that end. A flow
// forgotten meanwhile (deleted) has nothing to wait for.
func (b *writtenBook) wrote(key types.NamespacedName, versions []string, now time.Time) (asked bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.byFlow[key]
	if ok {
		b.byFlow[key] = staleVersions{versions: versions, until: now.Add(cacheWait)}
	}
	return s.asked
}

// ended records that a status write of the flow ended without storing anything, and tells
// whether a reconcile was deferred to its end.
func (b *writtenBook) ended(key types.NamespacedName) (asked bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	asked = b.byFlow[key].asked
	delete(b.byFlow, key)
	return asked
}

// deferToWrite tells whether a status write of the flow is in flight, and if so notes that a
// reconcile waits for its end: the write's end reconciles the flow again. Polling instead
// would keep a worker busy for as long as the write waits behind the others in flight.
func (b *writtenBook) deferToWrite(key types.NamespacedName) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.byFlow[key]
	if !ok || !s.writing {
		return false
	}
	s.asked = true
	b.byFlow[key] = s
	return true
}

// stale tells whether version is one the cache held before this process's last write of the
// flow and that write is recent enough to wait for. Any other answer ends the wait.
func (b *writtenBook) stale(key types.NamespacedName, version string, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.byFlow[key]
	if ok && s.writing {
		return false // deferToWrite's case
	}
	if ok && now.Before(s.until) && slices.Contains(s.versions, version) {
		return true
	}
	delete(b.byFlow, key)
	return false
}

func (b *writtenBook) forget(key types.NamespacedName) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.byFlow, key)
}
