package controllers

import (
	"errors"
	"net/http"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
)

// A pod whose agent does not work (no answer, a 5xx, an answer that is not a FlowStatus) is
// pushed to at most once per backoff step, 1 s doubling to 1 min, by all the flows selecting it
// together. A flow's own retry delay cannot bound that: every flow has its own, and a flow is
// reconciled for many other reasons (another pod's late answer, the end of a status write, a
// pod event, a spec change), each of which pushed again to every pod not done. So the hold sits
// where the pushes are started, whatever woke the flow: a held pod is reported with its last
// error and the other pods are pushed as usual. A good answer (or any 4xx, which answers the
// request and so shows the agent working) lifts the hold; a new pod (another UID) or a
// restarted agent starts without one.

// podGate holds back the pushes to one pod's agent.
type podGate struct {
	next     time.Time // no push before
	err      error     // the last failure, reported meanwhile
	restarts int32     // the pod's container restarts at that failure
}

// agentBroken reports whether a push's error says the agent as a whole is not working, rather
// than refusing this request.
func agentBroken(err error) bool {
	var agentErr *AgentError
	if errors.As(err, &agentErr) {
		return agentErr.Status >= http.StatusInternalServerError
	}
	return err != nil
}

func (m *memory) backoff() workqueue.TypedRateLimiter[agentAddress] {
	if m.steps == nil {
		m.steps = workqueue.NewTypedItemExponentialFailureRateLimiter[agentAddress](firstRetry, maxRetry)
	}
	return m.steps
}

// held tells whether pushes to the subject's pod are held back at now; if so, it returns the
// error to report and when the next push may go. Once the hold has passed it reserves the next
// step for the push about to start, so that of all the flows selecting the pod only one pushes
// per step.
func (m *memory) held(subject pushSubject, now time.Time) (err error, next time.Time, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.initPodsLocked()
	g, found := m.gates[subject.address]
	switch {
	case !found:
		return nil, time.Time{}, false
	case g.restarts != subject.restarts:
		m.liftLocked(subject.address) // the agent restarted
		return nil, time.Time{}, false
	case now.Before(g.next):
		return g.err, g.next, true
	}
	g.next = now.Add(m.backoff().When(subject.address))
	m.gates[subject.address] = g
	return nil, time.Time{}, false
}

// judgeLocked records a push's outcome against its pod's hold: a failure holds the pod back for
// a step unless it already is (the step was reserved when this push began, or the push began
// before the first failure ended); anything else lifts the hold.
func (m *memory) judgeLocked(subject pushSubject, err error, now time.Time) {
	if !agentBroken(err) {
		m.liftLocked(subject.address)
		return
	}
	g, found := m.gates[subject.address]
	if found && g.restarts == subject.restarts {
		g.err = err
		m.gates[subject.address] = g
		return
	}
	m.liftLocked(subject.address)
	m.gates[subject.address] = podGate{next: now.Add(m.backoff().When(subject.address)), err: err, restarts: subject.restarts}
}

func (m *memory) liftLocked(address agentAddress) {
	if _, found := m.gates[address]; found {
		delete(m.gates, address)
		m.backoff().Forget(address)
	}
}

// forgetPodGatesLocked lifts the holds of a deleted pod.
func (m *memory) forgetPodGatesLocked(uid types.UID) {
	for address := range m.gates {
		if address.pod == uid {
			m.liftLocked(address)
		}
	}
}
