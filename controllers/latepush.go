package controllers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/subflow-dev/subflow/agent/protocol"
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

// agentAddress is one pod's agent as every flow selecting the pod reaches it. A pod that does
// not answer one flow's push does not answer the others' either, so they share its suspicion.
// The pod's UID is part of it: pods share an address over time (a new pod reusing an IP) and,
// in tests, at once (one loopback IP).
type agentAddress struct {
	pod types.UID
	url string
}

// pushSubject is what an answer answers: the request pushed and the agent that got it. Another
// request, a token rotation or an agent that restarted (its pod's containers restarted) is
// another subject, about which an earlier answer says nothing.
type pushSubject struct {
	request  uint64 // digest of the request body
	address  agentAddress
	restarts int32
	token    string
}

// pendingPush is a push in flight, and its outcome once it ended.
type pendingPush struct {
	subject pushSubject
	done    bool
	outcome podOutcome
	// waited is true while the reconcile that started the push still waits for its answer;
	// a push that ends after that must wake the flow up itself.
	waited bool
}

// appliedPush is an answer showing a pod done with its flow's request (settledAnswer).
type appliedPush struct {
	subject pushSubject
	outcome podOutcome
	at      time.Time
}

// The pushes in flight are kept, at most one per flow and pod (flowMemory.pushes), so that a
// pod that does not answer gets no second push piled onto the first; so are the pods whose last
// push, from any flow, got no answer or outlived its reconcile (memory.suspect), which the next
// reconcile does not wait for at all; and each flow's settled answers (flowMemory.applied),
// which its retries report instead of pushing again.

// noAnswer is the outcome of a pod whose push has not answered within pushPatience, whether
// the push is still in flight or has since timed out. Both read the same, so that the reconcile
// a late timeout wakes (and every retry, and a restarted controller's first pass) finds the
// status it would write already written.
type noAnswer struct{}

func (*noAnswer) Error() string {
	return fmt.Sprintf("no answer within %s (push in flight or timed out; pushed again until the agent answers)", pushPatience)
}

// timedOut reports whether a push ended without an answer for lack of time: its timeout, or a
// dial that found nobody (no SYN-ACK) before it.
func timedOut(err error) bool {
	var netErr net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &netErr) && netErr.Timeout())
}

func (m *memory) initPodsLocked() {
	if m.suspect == nil {
		m.suspect, m.gates = map[agentAddress]error{}, map[agentAddress]podGate{}
	}
}

// take returns the outcome to report for key without a new push: the result of a push of the
// same subject that ended since the last reconcile (consumed), "still pushing" for one in
// flight, or the settled answer to the same subject if it is younger than fresh (the resync
// period, after which every pod is pushed to again). ok is false when a new push should start.
func (m *memory) take(key pushKey, subject pushSubject, now time.Time, fresh time.Duration) (podOutcome, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.flowLocked(key.flow, false)
	if f == nil {
		return podOutcome{}, false
	}
	if p := f.pushes[key.pod]; p != nil {
		if !p.done {
			// The suspicion, when there is one, reads the same on every retry: no status write
			// just because the wait grew.
			if err := m.suspect[p.subject.address]; err != nil {
				return podOutcome{Pod: key.pod, Err: err}, true
			}
			return podOutcome{Pod: key.pod, Err: &noAnswer{}}, true
		}
		delete(f.pushes, key.pod)
		if p.subject == subject {
			return p.outcome, true
		}
	}
	a, ok := f.applied[key.pod]
	if ok && a.subject == subject && now.Sub(a.at) < fresh {
		return a.outcome, true
	}
	return podOutcome{}, false
}

// start records a push. For a pod whose last push failed or was not answered in time it
// returns that error: the caller does not wait for this push and reports the error meanwhile.
func (m *memory) start(key pushKey, subject pushSubject) (lastErr error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	lastErr = m.suspect[subject.address]
	f := m.flowLocked(key.flow, true)
	if f.pushes == nil {
		f.pushes = map[string]*pendingPush{}
	}
	f.pushes[key.pod] = &pendingPush{subject: subject, waited: lastErr == nil}
	return lastErr
}

// finish records a push's outcome, settled or not; late reports that nobody waits for it any
// more.
func (m *memory) finish(key pushKey, subject pushSubject, outcome podOutcome, settled bool, now time.Time) (late bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.initPodsLocked()
	if timedOut(outcome.Err) {
		outcome.Err = &noAnswer{}
	}
	m.judgeLocked(subject, outcome.Err, now) // the pod's, whatever became of the flow
	f := m.flowLocked(key.flow, false)
	if f == nil || f.pushes[key.pod] == nil {
		return false // the flow was forgotten meanwhile
	}
	p := f.pushes[key.pod]
	p.done, p.outcome = true, outcome
	var answered *AgentError
	if outcome.Err != nil && !errors.As(outcome.Err, &answered) {
		// No answer (refused, timed out): not worth waiting for next time, by any flow. An
		// agent that answered, even with an error, is waited for as usual.
		m.suspect[p.subject.address] = outcome.Err
	} else {
		delete(m.suspect, p.subject.address)
	}
	if settled {
		if f.applied == nil {
			f.applied = map[string]appliedPush{}
		}
		f.applied[key.pod] = appliedPush{subject: p.subject, outcome: outcome, at: now}
	} else {
		delete(f.applied, key.pod)
	}
	return !p.waited
}

// collect returns the outcome of key if its push ended (and forgets it); with abandon, a push
// still in flight is left to wake the flow up when it ends.
func (m *memory) collect(key pushKey, abandon bool) (podOutcome, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.flowLocked(key.flow, false)
	if f == nil {
		return podOutcome{}, false
	}
	p := f.pushes[key.pod]
	if p == nil || !p.done {
		if p != nil && abandon {
			m.initPodsLocked()
			p.waited = false
			m.suspect[p.subject.address] = &noAnswer{}
		}
		return podOutcome{}, false
	}
	delete(f.pushes, key.pod)
	return p.outcome, true
}

// keepApplied forgets the settled answers of the flow's pods not in matched: pods that went
// or no longer match. So memory holds at most one answer per flow and matched pod.
func (m *memory) keepApplied(flow types.NamespacedName, matched map[string]bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.flowLocked(flow, false)
	if f == nil {
		return
	}
	for pod := range f.applied {
		if !matched[pod] {
			delete(f.applied, pod)
		}
	}
	if len(f.applied) == 0 {
		f.applied = nil
	}
}

// settledAnswer reports whether an answer shows the pod done with req, so that pushing req
// again would observe nothing new until something the controller sees changes (the request,
// the token, the pod's restarts) or the resync comes: the agent applied the revision and every
// consumer of the rule is in the state asked, with nothing else to watch - no seek running, no
// backlog to read (its own, or another subscription's for a backlog condition), no other rule
// holding the consumers, no token rotation under way. Any other answer (no consumer yet,
// consumers converging) is pushed again on every retry, as before.
func settledAnswer(req protocol.FlowRequest, o podOutcome) bool {
	if refusal(o.Err) != "" && !o.PreviousToken {
		// A working agent's refusal answers this request: pushing it again gets the same answer
		// until the agent changes (a restart, a new pod: another subject) or, for TooManyFlows,
		// a release elsewhere makes room, which the refresh or the resync finds.
		return true
	}
	st := o.Status
	if o.Err != nil || st == nil || o.PreviousToken || req.ReportBacklog || len(req.BacklogOf) > 0 || st.AppliedRevision != req.Revision ||
		len(st.Consumers) == 0 || len(st.HeldBy) > 0 || st.Conflict != "" {
		return false
	}
	if st.Seek != nil && st.Seek.State == protocol.SeekRunning {
		return false
	}
	return !slices.ContainsFunc(st.Consumers, func(c protocol.ConsumerStatus) bool { return c.State != req.State })
}

// requestDigest identifies a request's content: the same revision can carry another request
// (a seek's result announced to the other agents).
func requestDigest(req protocol.FlowRequest) uint64 {
	body, _ := json.Marshal(req) // plain data: cannot fail
	h := fnv.New64a()
	_, _ = h.Write(body)
	return h.Sum64()
}
