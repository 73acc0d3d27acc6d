package agent

import (
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/go-logr/logr"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// sessionState is where a consumer's subscription stands. session.set is its only writer.
type sessionState int

const (
	sessionUnsubscribed sessionState = iota // not subscribed yet, or Stopped
	sessionSubscribed                       // inner is the client's consumer
	sessionRenewing                         // a chunk renewal closed inner and subscribes again (chunks.go)
	sessionSeeking                          // a seek by index keeps it unsubscribed while cursors reset (seek.go)
	sessionEnded                            // closed for good (Close, Unsubscribe)
)

func (s sessionState) String() string {
	switch s {
	case sessionUnsubscribed:
		return "unsubscribed"
	case sessionSubscribed:
		return "subscribed"
	case sessionRenewing:
		return "renewing"
	case sessionSeeking:
		return "seeking"
	case sessionEnded:
		return "ended"
	}
	return fmt.Sprintf("sessionState(%d)", int(s))
}

// session is a consumer's subscription to the broker: the client consumer the gate and the nack
// book use, if any. Its fields are written only with the consumer's transition lock held, and
// the state only by set, which also writes the lock-free mirrors that acks, Status and the like
// read.
type session struct {
	client pulsar.Client
	opts   pulsar.ConsumerOptions // the application's, Name filled in
	log    logr.Logger
	gate   *gate
	nacks  *nackBook

	state    sessionState
	inner    pulsar.Consumer // the client's consumer while subscribed
	broker   *brokerSession  // what is known of inner's connection to the broker
	seekWant protocol.State  // while seeking: the state wished for, reported and returned to
	// renewal is the scheduled fresh subscription of a paused consumer of chunked messages;
	// renewSeq tells a stale callback from the current one.
	renewal  *time.Timer
	renewSeq int64

	// Mirrors for lock-free readers, written by set.
	live     atomic.Pointer[liveSession]
	renewing atomic.Pointer[chan struct{}] // closed when the renewal under way has subscribed again
	ended    atomic.Bool
}

// liveSession publishes the client consumer and its broker session together.
type liveSession struct {
	inner  pulsar.Consumer
	broker *brokerSession
}

// set moves the session to state with inner (nil unless subscribed), and updates the mirrors.
func (s *session) set(state sessionState, inner pulsar.Consumer, broker *brokerSession) {
	from := s.state
	s.state, s.inner, s.broker = state, inner, broker
	if inner == nil {
		s.live.Store(nil)
	} else {
		s.live.Store(&liveSession{inner: inner, broker: broker})
	}
	s.ended.Store(state == sessionEnded)
	switch {
	case state == sessionRenewing && from != sessionRenewing:
		done := make(chan struct{})
		s.renewing.Store(&done)
	case state != sessionRenewing && from == sessionRenewing:
		close(*s.renewing.Swap(nil))
	}
}

// current returns the client consumer, or an error when there is none. Lock-free: acks go
// through it once per message.
func (s *session) current() (pulsar.Consumer, error) {
	if s.ended.Load() {
		return nil, ErrConsumerClosed
	}
	if l := s.live.Load(); l != nil {
		return l.inner, nil
	}
	if r := s.renewing.Load(); r != nil {
		// A chunk renewal is between its close and its subscribe: acks and the like go to
		// the new consumer, a few round trips later.
		<-*r
		if l := s.live.Load(); l != nil {
			return l.inner, nil
		}
	}
	return nil, ErrConsumerStopped
}

// connection reports whether the client's consumer is connected, as far as the agent can tell
// (brokerSession), when it last connected, and since when it has been reconnecting. Lock-free.
func (s *session) connection() (connected bool, last, reconnectingSince *time.Time) {
	l := s.live.Load()
	if l == nil || l.broker == nil {
		return l != nil, nil, nil
	}
	at, since := l.broker.state()
	if since.IsZero() {
		return true, &at, nil
	}
	return false, &at, &since
}

// subscribe subscribes with the application's options and a fresh channel from the gate,
// plugged unless the gate is open. The client grants its initial permits on subscribe; with
// the gate closed those messages stay buffered in the client.
func (s *session) subscribe() error {
	if s.inner != nil {
		return nil
	}
	src, plugged := s.gate.newSource()
	opts := s.opts
	opts.MessageChannel = src
	opts.Topics = slices.Clone(s.opts.Topics) // the client rewrites topic names in place
	clientNackOptions(&opts)                  // the agent owns the nack delay (nack.go)
	broker := newBrokerSession(time.Now)
	opts.BackOffPolicyFunc = broker.policyFunc(s.opts.BackOffPolicyFunc)
	inner, err := s.client.Subscribe(opts)
	if err != nil {
		return err
	}
	broker.subscribed()
	if p, ok := inner.(nativePauser); ok {
		p.Pause() // the gate is closed until the caller opens it
	}
	s.gate.use(inner, src, plugged)
	s.nacks.use(inner)
	s.set(sessionSubscribed, inner, broker)
	s.log.Info("Consumer subscribed")
	return nil
}

// end closes the client consumer, the gate closed already, and moves the session to next.
// Held messages and kept nacks are dropped unacknowledged: closing returns those messages to
// the broker.
func (s *session) end(next sessionState) {
	s.gate.stopFetch()
	s.disarmRenewal()
	inner := s.inner
	dropped := s.gate.use(nil, nil, false)
	s.nacks.use(nil)
	s.set(next, nil, nil)
	if inner == nil {
		return
	}
	inner.Close()
	s.log.Info("Consumer unsubscribed", "droppedHeld", dropped)
}

// armRenewal schedules renew, the next fresh subscription of a paused consumer that receives
// chunked messages (chunks.go), unless one is scheduled for this session already: repeated
// pushes of the same pause must not postpone it.
func (s *session) armRenewal(renew func(seq int64)) {
	if s.renewal != nil || s.state != sessionSubscribed || s.gate.isOpen() || !s.gate.receivesChunks() {
		return
	}
	s.renewSeq++
	seq := s.renewSeq
	s.renewal = time.AfterFunc(chunkExpiry(s.opts)/2, func() { renew(seq) })
}

// disarmRenewal cancels the scheduled renewal: the gate opens, or the session ends.
func (s *session) disarmRenewal() {
	if s.renewal != nil {
		s.renewal.Stop()
		s.renewal = nil
	}
	s.renewSeq++ // a callback already running finds itself stale
}

// checkSession, set only by the package's tests (invariants_test.go), verifies the session's
// invariants each time the consumer's transition lock is released.
var checkSession func(s *session)

// invariants returns the invariants the session breaks, read with the transition lock held.
func (s *session) invariants() []string {
	var broken []string
	check := func(holds bool, invariant string) {
		if !holds {
			broken = append(broken, invariant)
		}
	}
	live := s.live.Load()
	check((s.state == sessionSubscribed) == (s.inner != nil), "subscribed <=> a client consumer")
	// The mirrors are what set wrote.
	check(s.ended.Load() == (s.state == sessionEnded), "ended mirror == session ended")
	check((live == nil) == (s.inner == nil) && (live == nil || live.inner == s.inner), "live == inner")
	check((s.renewing.Load() != nil) == (s.state == sessionRenewing), "renewing mirror == session renewing")
	s.gate.mu.Lock()
	gateInner, open, gateEnded := s.gate.inner, s.gate.phase == gateOpen, s.gate.ended
	s.gate.mu.Unlock()
	// The gate and the nack book use the session's client consumer.
	check(gateInner == s.inner, "the gate uses the session's client consumer")
	check(gateEnded == (s.state == sessionEnded), "gate ended <=> session ended")
	s.nacks.mu.Lock()
	nackInner, running, timer, kept := s.nacks.inner, s.nacks.running, s.nacks.timer != nil, len(s.nacks.nacks)
	s.nacks.mu.Unlock()
	check(nackInner == s.inner, "the nack book uses the session's client consumer")
	// The nacks' clock runs exactly while the gate is open.
	check(running == open, "nacks' clock runs <=> gate open")
	check(!timer || running, "nack timer => nacks' clock runs")
	// Kept nacks belong to the session: closing the client consumer returns them to the broker.
	check(s.inner != nil || kept == 0, "unsubscribed => no kept nacks")
	// A renewal refreshes a paused session; opening or ending the session disarms it.
	check(s.renewal == nil || (!open && s.inner != nil), "renewal armed => gate not open, subscribed")
	return broken
}
