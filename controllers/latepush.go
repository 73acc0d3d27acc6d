package controllers

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// pushPatience is how long a reconcile waits for the next answer of the pushes it started.
// Once every agent answered, or none has for this long, it writes status with what it has:
// the pushes still in flight go on (up to the push timeout) and requeue the flow when they
// end. So a slow or hanging agent never holds back the next change to the other agents, whose
// reconcile would otherwise wait for it.
const pushPatience = 200 * time.Millisecond

// pushKey is one flow's push to one pod.
type pushKey struct {
	flow types.NamespacedName
	pod  string
}

// pendingPush is a push in flight, and its outcome once it ended.
type pendingPush struct {
	revision int64
	started  time.Time
	done     bool
	outcome  podOutcome
	// waited is true while the reconcile that started the push still waits for its answer;
	// a push that ends after that must wake the flow up itself.
	waited bool
}

// pushBook holds the pushes in flight, at most one per flow and pod, so that a pod that does
// not answer gets no second push piled onto the first; and the pods whose last push got no
// answer or outlived its reconcile, which the next reconcile does not wait for at all.
type pushBook struct {
	mu     sync.Mutex
	pushes map[pushKey]*pendingPush
	// suspect holds the error of such a pod's last push, reported while the next one runs.
	suspect map[pushKey]error
}

// stillPushing is the outcome of a pod whose push has not answered yet.
type stillPushing struct{ since time.Duration }

func (e *stillPushing) Error() string {
	return fmt.Sprintf("no answer yet after %s (push in flight)", e.since.Round(time.Millisecond))
}

// take returns the outcome to report for key at revision without a new push: the result of a
// push that ended since the last reconcile (consumed), or "still pushing" for one in flight.
// ok is false when a new push should start.
func (b *pushBook) take(key pushKey, revision int64, now time.Time) (podOutcome, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.pushes[key]
	switch {
	case p == nil:
		return podOutcome{}, false
	case !p.done:
		return podOutcome{Pod: key.pod, Err: &stillPushing{since: now.Sub(p.started)}}, true
	}
	delete(b.pushes, key)
	return p.outcome, p.revision == revision
}

// start records a push. For a pod whose last push failed or was not answered in time it
// returns that error: the caller does not wait for this push and reports the error meanwhile.
func (b *pushBook) start(key pushKey, revision int64, now time.Time) (lastErr error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pushes == nil {
		b.pushes, b.suspect = map[pushKey]*pendingPush{}, map[pushKey]error{}
	}
	lastErr = b.suspect[key]
	b.pushes[key] = &pendingPush{revision: revision, started: now, waited: lastErr == nil}
	return lastErr
}

// finish records a push's outcome; late reports that nobody waits for it any more.
func (b *pushBook) finish(key pushKey, outcome podOutcome) (late bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.pushes[key]
	if p == nil {
		return false // the flow was forgotten meanwhile
	}
	p.done, p.outcome = true, outcome
	var answered *AgentError
	if outcome.Err != nil && !errors.As(outcome.Err, &answered) {
		// No answer (refused, timed out): not worth waiting for next time. An agent that
		// answered, even with an error, is waited for as usual.
		b.suspect[key] = outcome.Err
	} else {
		delete(b.suspect, key)
	}
	return !p.waited
}

// collect returns the outcome of key if its push ended (and forgets it); with abandon, a push
// still in flight is left to wake the flow up when it ends.
func (b *pushBook) collect(key pushKey, abandon bool) (podOutcome, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.pushes[key]
	if p == nil || !p.done {
		if p != nil && abandon {
			p.waited = false
			b.suspect[key] = &stillPushing{since: time.Since(p.started)}
		}
		return podOutcome{}, false
	}
	delete(b.pushes, key)
	return p.outcome, true
}

// forget drops a flow's pushes; those still in flight end unrecorded.
func (b *pushBook) forget(flow types.NamespacedName) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for key := range b.pushes {
		if key.flow == flow {
			delete(b.pushes, key)
		}
	}
	for key := range b.suspect {
		if key.flow == flow {
			delete(b.suspect, key)
		}
	}
}
