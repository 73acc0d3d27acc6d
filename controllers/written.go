package controllers

import (
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// This process remembers, per flow (flowMemory.written), the versions the informer's cache may
// still hold after it wrote the flow's status: the ones read before the write. A reconcile that
// starts from one of them would push an old revision and have its status write refused, so it
// is put back on the queue for a moment instead. The flow's worker is not held while the cache
// catches up (polling held it for a share of every reconcile: BENCHMARKS.md, BenchmarkFleetPause;
// docs/fleet-scale-findings.md).

// staleVersions are the versions of one flow's cached copy older than this process's last
// status write of it.
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
func (m *memory) writing(key types.NamespacedName) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.flowLocked(key, true).written = &staleVersions{writing: true}
}

// wrote records, at the end of the write writing began, that the versions are older than what
// this process has just written, and tells whether a reconcile was deferred to that end. A flow
// forgotten meanwhile (deleted) has nothing to wait for.
func (m *memory) wrote(key types.NamespacedName, versions []string, now time.Time) (asked bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.flowLocked(key, false)
	if f == nil || f.written == nil {
		return false
	}
	asked = f.written.asked
	f.written = &staleVersions{versions: versions, until: now.Add(cacheWait)}
	return asked
}

// ended records that a status write of the flow ended without storing anything, and tells
// whether a reconcile was deferred to its end.
func (m *memory) ended(key types.NamespacedName) (asked bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.flowLocked(key, false)
	if f == nil || f.written == nil {
		return false
	}
	asked = f.written.asked
	f.written = nil
	return asked
}

// deferToWrite tells whether a status write of the flow is in flight, and if so notes that a
// reconcile waits for its end: the write's end reconciles the flow again. Polling instead
// would keep a worker busy for as long as the write waits behind the others in flight.
func (m *memory) deferToWrite(key types.NamespacedName) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.flowLocked(key, false)
	if f == nil || f.written == nil || !f.written.writing {
		return false
	}
	f.written.asked = true
	return true
}

// stale tells whether version is one the cache held before this process's last write of the
// flow and that write is recent enough to wait for. Any other answer ends the wait.
func (m *memory) stale(key types.NamespacedName, version string, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.flowLocked(key, false)
	if f == nil || f.written == nil {
		return false
	}
	if f.written.writing {
		return false // deferToWrite's case
	}
	if now.Before(f.written.until) && slices.Contains(f.written.versions, version) {
		return true
	}
	f.written = nil
	return false
}
