package agent

import (
	"sync"
	"time"

	"github.com/apache/pulsar-client-go/pulsar/backoff"
)

// attemptGrace is how long after a failed attempt's delay the next attempt may take to fail:
// the client's default operation timeout. A policy that was asked for no delay for longer is
// no longer retrying (the client also uses the policy for calls that never reset it on
// success, such as GetLastMessageIDs).
const attemptGrace = 30 * time.Second

// brokerSession is what the agent knows of one client consumer's connection to the broker.
// pulsar-client-go does not say whether a consumer is connected, but after each failed attempt
// to (re)connect it asks its backoff policy for the delay before the next, and resets the
// policy once an attempt succeeds. So the client is given a policy that notes those calls,
// around the application's own or the client's default.
type brokerSession struct {
	now func() time.Time

	mu        sync.Mutex
	connected time.Time                  // the subscribe, or the last reconnect that succeeded
	failing   map[*notedPolicy]time.Time // policies whose last attempt failed: until when it counts
}

func newBrokerSession(now func() time.Time) *brokerSession {
	return &brokerSession{now: now, failing: map[*notedPolicy]time.Time{}}
}

// policyFunc is ConsumerOptions.BackOffPolicyFunc for the client: the application's, or the
// client's default, with every policy it makes noted here.
func (s *brokerSession) policyFunc(app func() backoff.Policy) func() backoff.Policy {
	if app == nil {
		app = backoff.NewDefaultBackoff
	}
	return func() backoff.Policy { return &notedPolicy{Policy: app(), session: s, began: s.now()} }
}

// subscribed records that the client's consumer exists: the subscribe succeeded.
func (s *brokerSession) subscribed() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.connected = s.now()
}

// state reports when the consumer last connected and, while attempts to reach the broker are
// failing, since when (the zero time otherwise).
func (s *brokerSession) state() (connected, reconnectingSince time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for p, until := range s.failing {
		if now.After(until) {
			delete(s.failing, p)
			continue
		}
		if reconnectingSince.IsZero() || p.began.Before(reconnectingSince) {
			reconnectingSince = p.began
		}
	}
	return s.connected, reconnectingSince
}

func (s *brokerSession) attemptFailed(p *notedPolicy, delay time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failing[p] = s.now().Add(delay + attemptGrace)
}

func (s *brokerSession) reconnected(p *notedPolicy) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.failing, p)
	s.connected = s.now()
}

// notedPolicy is a backoff policy whose calls the session notes: Next follows a failed attempt,
// Reset a successful reconnect.
type notedPolicy struct {
	backoff.Policy
	session *brokerSession
	began   time.Time // the policy was made: the reconnect (or the call) began
}

func (p *notedPolicy) Next() time.Duration {
	d := p.Policy.Next()
	p.session.attemptFailed(p, d)
	return d
}

func (p *notedPolicy) Reset() {
	p.Policy.Reset()
	p.session.reconnected(p)
}
