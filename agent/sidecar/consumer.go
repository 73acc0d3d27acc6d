package sidecar

import (
	"context"
	"math"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/subflow-dev/subflow/agent"
	"github.com/subflow-dev/subflow/agent/protocol"
	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// The frame gate of one consumer, in one place.
//
// The consumer is what the client subscribed on one connection under one consumer id. Its
// desired state (Running, Paused, Stopped) is set by SetState; the broker side of it moves
// through these states, changed only in this file and only under Consumer.mu:
//
//	absent      no consumer on the broker: before the first SUBSCRIBE, after a close
//	subscribing a SUBSCRIBE is on its way: the client's, or the sidecar's own on Running
//	subscribed  the broker has the consumer; it dispatches against the permits it was given
//	closing     the sidecar's own CLOSE_CONSUMER is on its way (Stopped)
//
// Credits: clientCredit is what the client believes the broker may still send (its FLOW
// permits minus the messages it was handed); brokerCredit is what the sidecar granted the
// broker-side consumer minus what it delivered. While Running and nothing is held they are
// equal, and FLOW frames pass unchanged. Invariants:
//
//   - a FLOW reaches the broker only while the desired state is Running; SetState takes
//     Consumer.mu, under which every FLOW is forwarded, so once SetState(Paused or Stopped)
//     has returned no FLOW follows, and its PING barrier proves the broker received the
//     last one before. The one exception: while paused, single permits that bring the rest
//     of the chunked messages the client has begun (completeChunksLocked);
//   - a MESSAGE reaches the client only while Running; others are held in order and handed
//     over first on Running, under the same lock as new ones, so order is kept;
//   - back to Running, the broker is granted what the client is owed:
//     clientCredit - held - brokerCredit (the FLOWs withheld, and after a re-subscribe all of
//     the client's credit, as a new broker-side consumer starts with none).
//
// Strict pause (Options.StrictPause) adds a client side: detached means the sidecar closed
// the client's consumer and waits for the client to subscribe again, which it does after
// dropping its receiver queue. That SUBSCRIBE is answered by the sidecar, not forwarded: the
// broker-side consumer stays (Key_Shared ranges, Failover ownership). While detached nothing
// is forwarded to the client, and its credit starts over at the new SUBSCRIBE; redeliver
// then records that the client dropped messages the broker still counts as delivered to
// this consumer, so on Running the broker is asked to deliver them again (and what was held
// is dropped, as it comes again with them).
type Consumer struct {
	conn                            *conn
	id                              uint64
	topic, subscription, name, kind string

	transitions chan struct{} // capacity one: SetState calls run one at a time

	mu  sync.Mutex
	sub *pb.CommandSubscribe // the client's last SUBSCRIBE, replayed after Stopped
	// ruled is the state the rules set (SetState); desired combines it with the start-up
	// gate's and is what the broker side is driven to.
	ruled, desired, observed   protocol.State
	generation                 int64
	since                      time.Time
	side                       side
	sideChanged                chan struct{} // closed and replaced whenever side changes
	clientResubscribes         bool          // the broker closed the consumer: the client subscribes again itself
	everSubscribed             bool          // the broker accepted a SUBSCRIBE of this consumer once
	detached                   bool          // strict pause: the client's consumer was closed by the sidecar
	redeliver                  bool          // strict pause: the client dropped what it had been sent
	clientCredit, brokerCredit int64
	held                       []heldMessage
	heldCount                  int64
	receivedWhilePaused        int64
	delivered                  int64           // messages handed to the client
	openChunks                 map[string]bool // chunked messages the client has begun, by uuid
	chunkGrants                int64           // permits granted while paused to complete open chunks
	detachPending              *time.Timer     // strict pause: detach once the open chunks complete, or at this timer
	cut                        *seekCut        // the last seek's target entry on this partition, cut on delivery
	cutSize                    int32           // that entry's messages as the broker has them, once seen
	ended                      bool
}

// A paused consumer whose client has begun chunked messages asks the broker for their
// remaining chunks one permit at a time: the client's incomplete-chunk expiry would otherwise
// discard them (and pulsar-client-go acknowledge the chunks it had) if the pause outlasts it.
// The entries those permits bring that are not such chunks are held. MaxChunkGrants bounds
// the permits (a FLOW of one each) of one pause, and so what they add to the held messages;
// chunkPatience bounds how long a strict pause waits for the chunks before detaching the
// client regardless (a producer that died mid-message never sends them).
const (
	MaxChunkGrants = 1000
	chunkPatience  = 5 * time.Second
)

type side int

const (
	absent side = iota
	subscribing
	subscribed
	closing
)

type heldMessage struct {
	raw   []byte
	n     int64 // messages in the entry
	at    time.Time
	entry entry
}

func newConsumer(c *conn, sub *pb.CommandSubscribe) *Consumer {
	return &Consumer{conn: c, id: sub.GetConsumerId(), topic: sub.GetTopic(), subscription: sub.GetSubscription(),
		name: sub.GetConsumerName(), kind: sub.GetSubType().String(), transitions: make(chan struct{}, 1),
		ruled: protocol.Running, desired: protocol.Running, observed: protocol.Running, since: time.Now(), sideChanged: make(chan struct{})}
}

// Topic is the topic (or partition) the consumer subscribed to.
func (c *Consumer) Topic() string { return c.topic }

// Subscription is the subscription name.
func (c *Consumer) Subscription() string { return c.subscription }

// Name is the consumer name the client gave (or generated).
func (c *Consumer) Name() string { return c.name }

// SubType is Exclusive, Shared, Failover or Key_Shared.
func (c *Consumer) SubType() string { return c.kind }

// SetState brings the consumer to state, with the generation rules of control.Consumer.SetState
// that the agent library's consumer follows too: a lower generation, or the same one with
// another state, is refused with *agent.StaleGenerationError. It returns once the state holds:
//
//   - Paused: no FLOW for this consumer reaches the broker from now on, and the broker has
//     received every FLOW sent before (a PING answered); messages it still sends are held;
//   - Stopped: the broker has closed its consumer (membership and unacknowledged messages
//     released to siblings); held messages are dropped, the broker delivers them again;
//   - Running: held messages are handed to the client, in order, then the broker is granted
//     the permits the client is owed; after Stopped, the client's SUBSCRIBE is sent again.
//
// A consumer whose connection ended returns agent.ErrConsumerClosed.
func (c *Consumer) SetState(ctx context.Context, state protocol.State, generation int64) error {
	if !state.Valid() {
		return &invalidStateError{state: state}
	}
	return c.transition(ctx, func() (protocol.State, error) {
		if generation < c.generation || (generation == c.generation && state != c.ruled) {
			return "", &agent.StaleGenerationError{Requested: generation, Applied: c.generation, State: state}
		}
		c.ruled, c.generation = state, generation
		return c.wantedLocked(), nil
	})
}

// regate brings the consumer to its state after the start-up gate moved.
func (c *Consumer) regate(ctx context.Context) error {
	return c.transition(ctx, func() (protocol.State, error) { return c.wantedLocked(), nil })
}

// wantedLocked combines the rules' state with the start-up gate's: the most restrictive wins.
func (c *Consumer) wantedLocked() protocol.State {
	return protocol.MostRestrictive(c.ruled, c.conn.s.startGate.State())
}

// startIn sets the state of a consumer before its first SUBSCRIBE goes on, so the broker
// meets it from the first permit on.
func (c *Consumer) startIn() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.desired = c.wantedLocked()
	c.observed = c.desired
}

// transition brings the consumer to the state decide returns, called with the consumer's lock
// held, and returns once that state holds (SetState); an error from decide changes nothing.
func (c *Consumer) transition(ctx context.Context, decide func() (protocol.State, error)) error {
	select {
	case c.transitions <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-c.transitions }()
	c.mu.Lock()
	if c.ended {
		c.mu.Unlock()
		return agent.ErrConsumerClosed
	}
	state, err := decide()
	if err != nil {
		c.mu.Unlock()
		return err
	}
	c.desired = state
	c.stopDetachPendingLocked()
	err = c.driveLocked()
	if err == nil && state == protocol.Paused {
		err = c.pausedLocked()
	}
	c.mu.Unlock()
	if err != nil {
		return nil // the connection is failing; the consumer ends with it
	}
	if err := c.settle(ctx, state); err != nil {
		return err
	}
	c.mu.Lock()
	if c.observed != state {
		c.observed, c.since = state, time.Now()
	}
	c.mu.Unlock()
	return nil
}

type invalidStateError struct{ state protocol.State }

func (e *invalidStateError) Error() string {
	return "sidecar: invalid state " + string(e.state) + ": want Running, Paused or Stopped"
}

// settle waits until the broker side matches state; for Paused it also waits for the
// barrier that proves every earlier FLOW reached the broker.
func (c *Consumer) settle(ctx context.Context, state protocol.State) error {
	if err := c.waitSide(ctx, state); err != nil {
		return err
	}
	if state != protocol.Paused {
		return nil
	}
	c.mu.Lock()
	connected := c.side != absent
	c.mu.Unlock()
	if !connected {
		return nil
	}
	return c.conn.barrier(ctx)
}

func (c *Consumer) waitSide(ctx context.Context, state protocol.State) error {
	for {
		c.mu.Lock()
		done := c.ended || c.sideSettledLocked(state)
		changed := c.sideChanged
		c.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (c *Consumer) sideSettledLocked(state protocol.State) bool {
	if state == protocol.Stopped {
		return c.side == absent
	}
	if c.detached || c.detachPending != nil {
		return false // strict pause: the client has not dropped its queue yet
	}
	// Not subscribed yet, or the client subscribes again itself: its SUBSCRIBE will meet
	// the state set now.
	return c.side == subscribed || c.sub == nil || c.clientResubscribes
}

func (c *Consumer) setSideLocked(s side) {
	if c.side == s {
		return
	}
	c.side = s
	c.changedLocked()
	if s != subscribed {
		c.brokerCredit = 0
	}
}

// changedLocked wakes the SetState calls waiting for the consumer to settle.
func (c *Consumer) changedLocked() {
	close(c.sideChanged)
	c.sideChanged = make(chan struct{})
}

// pausedLocked takes the paused consumer's next step: complete the chunked messages its client
// has begun, and in a strict pause detach the client once they are complete (it keeps their
// first chunks across its re-subscribe, with their expiry running).
func (c *Consumer) pausedLocked() error {
	if c.conn.s.opts.StrictPause && !c.detached {
		if !c.chunksToCompleteLocked() {
			return c.detachLocked()
		}
		c.detachPending = time.AfterFunc(chunkPatience, c.detachNow)
		c.changedLocked()
	}
	return c.completeChunksLocked()
}

// chunkProgressLocked goes on with pausedLocked's work after each MESSAGE while paused.
func (c *Consumer) chunkProgressLocked() error {
	if c.detachPending != nil && !c.chunksToCompleteLocked() {
		c.stopDetachPendingLocked()
		if err := c.detachLocked(); err != nil {
			return err
		}
	}
	return c.completeChunksLocked()
}

func (c *Consumer) chunksToCompleteLocked() bool {
	return len(c.openChunks) > 0 && c.chunkGrants < MaxChunkGrants
}

// completeChunksLocked grants the broker one permit when the client has begun chunked
// messages and the broker has none left to send their remaining chunks.
func (c *Consumer) completeChunksLocked() error {
	if len(c.openChunks) == 0 || c.side != subscribed || c.detached || c.brokerCredit > 0 {
		return nil
	}
	if c.chunkGrants >= MaxChunkGrants {
		if c.chunkGrants == MaxChunkGrants {
			c.chunkGrants++ // say it once per pause
			c.conn.log.Info("Paused with chunked messages still incomplete after the most permits a pause grants for them; the client's incomplete-chunk expiry may discard them",
				"topic", c.topic, "subscription", c.subscription, "consumer", c.name, "permits", MaxChunkGrants)
		}
		return nil
	}
	c.chunkGrants++
	c.brokerCredit++
	return c.conn.toBroker.write(true, flowCommand(c.id, 1))
}

// detachNow detaches the client of a strict pause that waited chunkPatience for its chunked
// messages to complete.
func (c *Consumer) detachNow() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.detachPending == nil || c.desired != protocol.Paused {
		return
	}
	c.stopDetachPendingLocked()
	_ = c.detachLocked()
}

func (c *Consumer) stopDetachPendingLocked() {
	if c.detachPending != nil {
		c.detachPending.Stop()
		c.detachPending = nil
		c.changedLocked()
	}
}

// detachLocked closes the client's consumer, not the broker's, so that the client drops its
// receiver queue and subscribes again (strict pause). A consumer the client has not
// subscribed yet has nothing buffered.
func (c *Consumer) detachLocked() error {
	if c.detached || c.sub == nil || c.clientResubscribes {
		return nil
	}
	c.detached = true
	c.changedLocked()
	return c.conn.closeClientConsumer(closeConsumerCommand(c.id, c.conn.ownRequestID()))
}

// reattachLocked answers the SUBSCRIBE of a detached client: its consumer starts a new
// session on the client's side while the broker's goes on.
func (c *Consumer) reattachLocked(requestID uint64) error {
	c.detached = false
	c.clientResubscribes = false // the broker may have closed its side meanwhile: drive subscribes again
	c.clientCredit = 0
	c.openChunks = nil // the client dropped what it had (detached with none begun, or past the bounds)
	c.redeliver = c.side != absent
	c.changedLocked()
	if err := c.conn.toClient.write(true, successCommand(requestID)); err != nil {
		return err
	}
	return c.driveLocked()
}

// driveLocked takes the step toward the desired state that the broker side allows now.
func (c *Consumer) driveLocked() error {
	switch {
	case c.desired == protocol.Stopped && c.side == subscribed:
		return c.closeOnBrokerLocked()
	case c.desired != protocol.Stopped && c.side == absent && c.sub != nil && !c.clientResubscribes:
		return c.subscribeAgainLocked()
	case c.desired == protocol.Running && c.side == subscribed && !c.detached:
		return c.openLocked()
	}
	return nil
}

// openLocked hands the held messages to the client, then grants the broker what the client
// is owed.
func (c *Consumer) openLocked() error {
	c.chunkGrants = 0
	if c.redeliver {
		// The client dropped messages the broker still counts as this consumer's: ask for
		// all of them again; what was held comes again with them.
		c.redeliver = false
		c.dropHeldLocked(time.Time{})
		if err := c.conn.toBroker.write(true, redeliverAllCommand(c.id)); err != nil {
			return err
		}
	}
	if len(c.held) > 0 {
		frames := make([][]byte, len(c.held))
		for i, h := range c.held {
			frames[i] = h.raw
			c.trackChunkLocked(h.entry)
		}
		c.clientCredit -= c.heldCount
		c.delivered += c.heldCount
		c.held, c.heldCount = nil, 0
		if err := c.conn.toClient.write(true, frames...); err != nil {
			return err
		}
	}
	owed := c.clientCredit - c.brokerCredit
	if owed <= 0 {
		return nil
	}
	owed = min(owed, math.MaxUint32)
	c.brokerCredit += owed
	return c.conn.toBroker.write(true, flowCommand(c.id, uint32(owed)))
}

// closeOnBrokerLocked closes the broker-side consumer and drops what was held: the broker
// puts every unacknowledged message of the consumer back for its siblings.
func (c *Consumer) closeOnBrokerLocked() error {
	c.dropHeldLocked(time.Time{})
	c.setSideLocked(closing)
	req := c.conn.ownRequestID()
	c.conn.expect(req, func(bool) bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.side == closing {
			c.setSideLocked(absent)
			_ = c.driveLocked() // Running may have been asked meanwhile
		}
		return false
	})
	return c.conn.toBroker.write(true, closeConsumerCommand(c.id, req))
}

// subscribeAgainLocked sends the client's SUBSCRIBE again under the sidecar's request id.
// When the broker refuses it, the client's consumer is closed, so that the client subscribes
// again itself and hears the broker's answer.
func (c *Consumer) subscribeAgainLocked() error {
	sub := proto.Clone(c.sub).(*pb.CommandSubscribe)
	req := c.conn.ownRequestID()
	sub.RequestId = proto.Uint64(req)
	c.setSideLocked(subscribing)
	c.conn.expect(req, func(ok bool) bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.side != subscribing {
			return false
		}
		if ok {
			c.setSideLocked(subscribed)
			_ = c.driveLocked()
			return false
		}
		c.conn.log.Info("Subscribing again was refused; the client's consumer is closed so that it subscribes itself",
			"topic", c.topic, "subscription", c.subscription, "consumer", c.name)
		c.clientResubscribes = true
		c.setSideLocked(absent)
		_ = c.conn.closeClientConsumer(closeConsumerCommand(c.id, c.conn.ownRequestID()))
		return false
	})
	return c.conn.toBroker.write(true, encodeCommand(&pb.BaseCommand{Type: pb.BaseCommand_SUBSCRIBE.Enum(), Subscribe: sub}))
}

// clientSubscribe forwards the client's SUBSCRIBE: a first one, or a new session after the
// broker closed the consumer. A new session starts with no credit on either side.
func (c *Consumer) clientSubscribe(raw []byte, sub *pb.CommandSubscribe) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sub = proto.Clone(sub).(*pb.CommandSubscribe)
	if c.detached {
		return c.reattachLocked(sub.GetRequestId())
	}
	c.clientResubscribes = false
	if c.side == absent {
		// A new session. openChunks stays: the client keeps the chunks it has of begun
		// messages (their expiry running on), and the broker sends those again from their
		// first chunk, which the client takes as a redelivery.
		c.clientCredit = 0
		c.dropHeldLocked(time.Time{})
		c.setSideLocked(subscribing)
	}
	c.conn.expect(sub.GetRequestId(), func(ok bool) bool {
		if c.subscribeAnswered(ok) {
			// Refused (an Exclusive subscription taken, no permission) before it ever
			// subscribed: not a consumer yet. The client retries with a new SUBSCRIBE only
			// once it has this answer, which is forwarded after this returns.
			c.conn.forget(c)
		}
		return true
	})
	return c.conn.toBroker.write(true, raw)
}

// subscribeAnswered moves the broker side on the answer to the client's SUBSCRIBE and tells
// whether the consumer is to be forgotten.
func (c *Consumer) subscribeAnswered(ok bool) (forget bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.side != subscribing {
		return false
	}
	if ok {
		c.everSubscribed = true
		c.setSideLocked(subscribed)
		_ = c.driveLocked() // Stopped meanwhile: close it on the broker again
		return false
	}
	c.setSideLocked(absent)
	return !c.everSubscribed
}

// clientFlow counts the client's permits and forwards its FLOW while Running.
func (c *Consumer) clientFlow(raw []byte, permits uint32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.detached {
		return nil // from the client's closed session; its new SUBSCRIBE starts over
	}
	c.clientCredit += int64(permits)
	if c.desired != protocol.Running || c.side != subscribed {
		return nil
	}
	c.brokerCredit += int64(permits)
	return c.conn.toBroker.write(false, raw)
}

// brokerMessage hands a MESSAGE to the client while Running and holds it otherwise. A
// MESSAGE for a broker-side consumer being closed is dropped: the broker gives it back. While
// paused, the chunks of a chunked message whose first chunks the client already has still go
// to it, so that the client's incomplete-chunk expiry cannot discard (and pulsar-client-go
// acknowledge) a message split by the pause; the application then gets that one message.
// Each MESSAGE while paused may take the completion of those messages a step further.
func (c *Consumer) brokerMessage(f frame, msg *pb.CommandMessage, e entry) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.side != subscribed {
		return nil
	}
	c.brokerCredit -= e.messages
	raw, removed := c.cutLocked(f, msg, e)
	e.messages -= removed
	completing := e.chunked() && c.openChunks[e.uuid] && c.desired == protocol.Paused
	if (c.desired == protocol.Running || completing) && !c.detached {
		c.clientCredit -= e.messages
		c.delivered += e.messages
		c.trackChunkLocked(e)
		if err := c.conn.toClient.write(false, raw); err != nil {
			return err
		}
		if removed > 0 && c.desired == protocol.Running {
			// The broker debited what the client never got: grant it back, as the client would,
			// at once: the broker pump flushes only toward the client, and a client waiting for
			// these messages sends nothing that would flush it.
			c.brokerCredit += removed
			if err := c.conn.toBroker.write(true, flowCommand(c.id, uint32(removed))); err != nil {
				return err
			}
		}
	} else {
		c.held = append(c.held, heldMessage{raw: raw, n: e.messages, at: time.Now(), entry: e})
		c.heldCount += e.messages
		c.receivedWhilePaused += e.messages
	}
	if c.desired != protocol.Paused {
		return nil
	}
	return c.chunkProgressLocked()
}

// cutLocked cuts the seek target's batch entry (seekCut) and returns the frame to deliver and
// how many messages it removed. An entry that cannot be cut is delivered whole, as before
// the sidecar cut entries: the client then gets the messages before the target too.
func (c *Consumer) cutLocked(f frame, msg *pb.CommandMessage, e entry) ([]byte, int64) {
	if c.cut == nil || !c.cut.matches(msg.GetMessageId()) {
		return f.raw, 0
	}
	out, removed, err := cutBatch(f, msg, c.cut.keepFrom, c.conn.clientMaxFrame())
	if err != nil {
		c.conn.log.Info("Delivering a seek target's batch entry whole", "topic", c.topic, "error", err.Error())
		return f.raw, 0
	}
	c.cutSize = int32(e.messages)
	return out, removed
}

// trackChunkLocked remembers the chunked messages the client has started and not completed.
func (c *Consumer) trackChunkLocked(e entry) {
	if !e.chunked() {
		return
	}
	if e.lastChunk() {
		delete(c.openChunks, e.uuid)
		return
	}
	if c.openChunks == nil {
		c.openChunks = map[string]bool{}
	}
	c.openChunks[e.uuid] = true
}

// brokerClosed notes a broker-initiated CLOSE_CONSUMER (unload, seek, a sibling's reset),
// which goes on to the client: it subscribes again itself, on this connection and with this
// id. What was held returns to the broker with the close. A detached client (strict pause)
// is subscribing again already and is not told.
func (c *Consumer) brokerClosed() (forward bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropHeldLocked(time.Time{})
	c.setSideLocked(absent)
	if c.detached {
		c.redeliver = false
		return false
	}
	c.clientResubscribes = true
	return true
}

// clientClose ends the consumer: its CLOSE_CONSUMER goes to the broker when the broker has
// the consumer; while Stopped the sidecar answers it.
func (c *Consumer) clientClose(raw []byte, requestID uint64) error {
	c.mu.Lock()
	onBroker := c.side == subscribed || c.side == subscribing
	c.mu.Unlock()
	if !onBroker {
		c.conn.forget(c)
		return c.conn.toClient.write(true, successCommand(requestID))
	}
	c.conn.expect(requestID, func(bool) bool { c.conn.forget(c); return true })
	return c.conn.toBroker.write(true, raw)
}

// clientUnsubscribe forwards an UNSUBSCRIBE; the consumer ends when it succeeds.
func (c *Consumer) clientUnsubscribe(raw []byte, requestID uint64) error {
	c.conn.expect(requestID, func(ok bool) bool {
		if ok {
			c.conn.forget(c)
		}
		return true
	})
	return c.conn.toBroker.write(true, raw)
}

// end forgets the consumer: its client closed it or the connection ended.
func (c *Consumer) end() {
	c.mu.Lock()
	if !c.ended {
		c.ended = true
		c.stopDetachPendingLocked()
		c.dropHeldLocked(time.Time{})
		c.setSideLocked(absent)
		c.changedLocked() // wake waiters for good
	}
	c.mu.Unlock()
	c.conn.s.removed(c)
}

// DropHeld drops the held messages that arrived at or before before (all with the zero
// time) and returns how many messages they carried. They stay unacknowledged on the broker,
// which delivers them again: after a seek, from the new cursor. The client is granted their
// permits again on Running.
func (c *Consumer) DropHeld(before time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int(c.dropHeldLocked(before))
}

func (c *Consumer) dropHeldLocked(before time.Time) int64 {
	var dropped int64
	kept := c.held[:0]
	for _, h := range c.held {
		if before.IsZero() || !h.at.After(before) {
			dropped += h.n
			continue
		}
		kept = append(kept, h)
	}
	clear(c.held[len(kept):])
	c.held = kept
	c.heldCount -= dropped
	return dropped
}

// Status reports the consumer as the control API does for agent consumers. Connected means
// the broker has the consumer.
func (c *Consumer) Status() protocol.ConsumerStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	state := c.observed
	if c.ended {
		state = protocol.Stopped
	}
	return protocol.ConsumerStatus{Topic: c.topic, Subscription: c.subscription, Name: c.name, State: state,
		Since: c.since, HeldMessages: c.heldCount, ReceivedWhilePaused: c.receivedWhilePaused,
		Connected: c.side == subscribed}
}

// Counts are a consumer's message and permit figures, as messages (a batch counting its
// messages).
type Counts struct {
	// Delivered is what was handed to the client. What its application can still receive
	// while paused is what was delivered before the pause and not yet received.
	Delivered int64
	// Held is what the broker sent while the consumer was not Running, kept for the client.
	Held int64
	// Owed is the permits the client asked for that the broker has not been granted: the
	// FLOWs withheld while paused or stopped.
	Owed int64
}

// Counts returns the consumer's figures now.
func (c *Consumer) Counts() Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Counts{Delivered: c.delivered, Held: c.heldCount, Owed: max(0, c.clientCredit-c.heldCount-c.brokerCredit)}
}
