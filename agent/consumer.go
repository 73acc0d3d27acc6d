package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/go-logr/logr"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// nativePauser is the Pause/Resume a future pulsar-client-go consumer may offer (upstream PIP
// in pulsar-client-go issue 1504); when present it is used in addition to the gate.
type nativePauser interface {
	Pause()
	Resume()
}

// Consumer is a gated pulsar.Consumer. It implements pulsar.Consumer, so it is a drop-in for
// the client's consumer, and adds Pause, Resume, Stop, Run, SetState and SeekByIndex.
type Consumer struct {
	agent     *Agent
	client    pulsar.Client
	opts      pulsar.ConsumerOptions // as given, Name filled in; MessageChannel set per subscribe
	log       logr.Logger
	topic     string // the topic, topics or pattern, as reported in status
	zeroQueue bool
	metrics   consumerMetrics

	// transitions serialises state changes, seeks, subscribes and Close; a channel so that
	// callers holding a context can stop waiting. A seek by index does not hold it while the
	// admin API resets cursors (seek.go), so Close and state changes never wait for a broker.
	transitions chan struct{}
	// seeks serialises seeks among themselves (and with Unsubscribe), for their whole length.
	seeks chan struct{}
	// life ends when the consumer closes for good; a seek under way gives up then.
	life    context.Context
	endLife context.CancelFunc
	// Wishes, guarded by transitions.
	localPaused, localStopped bool
	remote                    protocol.State
	remoteGen                 int64
	started                   bool

	// chunked: the consumer receives chunked messages (see chunks.go); set once, read
	// lock-free by the fast take.
	chunked atomic.Bool
	// renewing is closed when the chunk renewal under way has subscribed again (chunks.go).
	renewing atomic.Pointer[chan struct{}]

	pumpOnce sync.Once
	out      chan pulsar.ConsumerMessage // Chan(), fed by the pump
	pumping  atomic.Bool                 // Chan() was called
	live     atomic.Pointer[liveInner]   // inner, for calls that need no gate state
	ended    atomic.Bool                 // closed, likewise

	mu       sync.Mutex
	takersGo *sync.Cond // signalled when takers drops to zero
	gate                // the message path, guarded by mu

	// The session, guarded by mu.
	inner  pulsar.Consumer // the client's consumer, nil while unsubscribed
	broker *brokerSession  // what is known of inner's connection to the broker
	closed bool            // Close or Unsubscribe ended the consumer for good
	// seeking: a seek by index has the consumer unsubscribed while it resets cursors (seek.go);
	// seekWant is the state wished for meanwhile, which the consumer reports and returns to.
	seeking  bool
	seekWant protocol.State
	state    protocol.State
	since    time.Time
	// renewal is the scheduled fresh subscription of a paused consumer of chunked messages;
	// renewSeq tells a stale callback from the current one.
	renewal   *time.Timer
	renewSeq  int64
	nacks     []deferredNack // nacks the agent keeps until due while open (nack.go)
	nackTimer *time.Timer    // the next hand-over of nacks to the client
}

func newConsumer(a *Agent, client pulsar.Client, opts pulsar.ConsumerOptions) *Consumer {
	if opts.Name == "" {
		// The client would draw a new random name on every subscribe; keep one for life so
		// that logs, metrics and the broker see the same consumer across Stop and Run.
		opts.Name = randomName()
	}
	c := &Consumer{
		agent:       a,
		client:      client,
		opts:        opts,
		topic:       topicLabel(opts),
		zeroQueue:   opts.EnableZeroQueueConsumer,
		remote:      protocol.Running,
		transitions: make(chan struct{}, 1),
		seeks:       make(chan struct{}, 1),
		out:         make(chan pulsar.ConsumerMessage),
	}
	c.life, c.endLife = context.WithCancel(context.Background())
	c.chunked.Store(declaresChunks(opts))
	c.takersGo = sync.NewCond(&c.mu)
	c.changed = make(chan struct{})
	c.state = protocol.Stopped
	c.since = time.Now()
	c.log = a.log.WithValues("topic", c.topic, "subscription", opts.SubscriptionName, "consumer", opts.Name)
	c.metrics = a.metrics.forConsumer(c.topic, opts.SubscriptionName, opts.Name)
	return c
}

func randomName() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return "subflow-" + hex.EncodeToString(b)
}

func topicLabel(opts pulsar.ConsumerOptions) string {
	switch {
	case opts.Topic != "":
		return opts.Topic
	case len(opts.Topics) > 0:
		return strings.Join(opts.Topics, ",")
	default:
		return opts.TopicsPattern
	}
}

// lock takes the transition lock unless ctx ends first.
func (c *Consumer) lock(ctx context.Context) error {
	select {
	case c.transitions <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Consumer) unlock() { <-c.transitions }

// lockSeeks takes the seek lock unless ctx ends first.
func (c *Consumer) lockSeeks(ctx context.Context) error {
	select {
	case c.seeks <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Consumer) unlockSeeks() { <-c.seeks }

// current returns the underlying consumer, or an error when there is none. It reads without
// c.mu: acks go through it once per message.
func (c *Consumer) current() (pulsar.Consumer, error) {
	if c.ended.Load() {
		return nil, ErrConsumerClosed
	}
	if l := c.live.Load(); l != nil {
		return l.Consumer, nil
	}
	if r := c.renewing.Load(); r != nil {
		// A chunk renewal is between its close and its subscribe: acks and the like go to
		// the new consumer, a few round trips later.
		<-*r
		if l := c.live.Load(); l != nil {
			return l.Consumer, nil
		}
	}
	return nil, ErrConsumerStopped
}

// liveInner wraps the underlying consumer for atomic publication.
type liveInner struct{ pulsar.Consumer }

// setInnerLocked replaces the underlying consumer and its channel; plugged says src was made
// full (newSource).
func (c *Consumer) setInnerLocked(inner pulsar.Consumer, src chan pulsar.ConsumerMessage, plugged bool) {
	c.inner = inner
	if inner == nil {
		c.broker = nil
	}
	c.plug.use(src, plugged)
	if inner == nil {
		c.live.Store(nil)
		return
	}
	c.live.Store(&liveInner{inner})
}

// endLocked marks the consumer closed for good.
func (c *Consumer) endLocked() {
	c.closed = true
	c.ended.Store(true)
	c.endLife()
}

// Status reports the observed state of the consumer.
func (c *Consumer) Status() protocol.ConsumerStatus {
	c.mu.Lock()
	defer c.unlockGate()
	st := protocol.ConsumerStatus{
		Topic:               c.topic,
		Subscription:        c.opts.SubscriptionName,
		Name:                c.opts.Name,
		State:               c.state,
		Since:               c.since,
		HeldMessages:        int64(c.heldCountLocked()),
		ReceivedWhilePaused: c.receivedWhilePaused,
	}
	st.Connected, st.LastConnected, st.ReconnectingSince = c.brokerStateLocked()
	return st
}

// brokerStateLocked reports whether the client's consumer is connected, as far as the agent
// can tell (brokerSession), when it last connected, and since when it has been reconnecting.
func (c *Consumer) brokerStateLocked() (connected bool, last, reconnectingSince *time.Time) {
	if c.inner == nil || c.broker == nil {
		return c.inner != nil, nil, nil
	}
	at, since := c.broker.state()
	if since.IsZero() {
		return true, &at, nil
	}
	return false, &at, &since
}

// Topic is the topic, the comma-separated topics or the pattern the consumer was created for.
func (c *Consumer) Topic() string { return c.topic }

// Options returns the options as the application gave them (with Name filled in). The client
// gets them with the agent's MessageChannel and nack settings (nack.go).
func (c *Consumer) Options() pulsar.ConsumerOptions { return c.opts }

// Subscription returns the subscription name.
func (c *Consumer) Subscription() string { return c.opts.SubscriptionName }

// Name returns the consumer name, kept across Stop and Run.
func (c *Consumer) Name() string { return c.opts.Name }

// Unsubscribe deletes the subscription. Like the client's consumer, which closes itself after
// unsubscribing, the Consumer is then closed for good (as by Close): Receive returns
// ErrConsumerClosed, State reports Stopped and not connected, and no later Run, Resume or
// controller push can re-create the deleted subscription. Held messages are dropped; the
// subscription is gone with them. On error nothing changes.
func (c *Consumer) Unsubscribe() error {
	return c.unsubscribe(pulsar.Consumer.Unsubscribe)
}

// UnsubscribeForce deletes the subscription, disconnecting other consumers; then the
// Consumer is closed as after Unsubscribe.
func (c *Consumer) UnsubscribeForce() error {
	return c.unsubscribe(pulsar.Consumer.UnsubscribeForce)
}

func (c *Consumer) unsubscribe(call func(pulsar.Consumer) error) error {
	// A seek under way has the consumer unsubscribed for a while; deleting the subscription
	// waits for it rather than fail.
	_ = c.lockSeeks(context.Background())
	defer c.unlockSeeks()
	if err := c.lock(context.Background()); err != nil {
		return err
	}
	defer c.unlock()
	inner, err := c.current()
	if err != nil {
		return err
	}
	c.waitFetchStopped()
	if err := call(inner); err != nil {
		return err
	}
	c.finish("Consumer unsubscribed")
	return nil
}

// GetLastMessageIDs returns the last message id of every subscribed topic. It holds the
// transition lock for the round trip: pulsar-client-go (v0.19 to v0.21) never answers the call
// on a consumer closed while it waits, and a chunk renewal, a seek or Stop closes it.
func (c *Consumer) GetLastMessageIDs() ([]pulsar.TopicMessageID, error) {
	if err := c.lock(context.Background()); err != nil {
		return nil, err
	}
	defer c.unlock()
	inner, err := c.current()
	if err != nil {
		return nil, err
	}
	return inner.GetLastMessageIDs()
}

// Ack acknowledges a message; it works while paused.
func (c *Consumer) Ack(msg pulsar.Message) error { return c.AckID(msg.ID()) }

// AckID acknowledges a message by id; it works while paused.
func (c *Consumer) AckID(id pulsar.MessageID) error {
	inner, err := c.current()
	if err != nil {
		return err
	}
	return inner.AckID(id)
}

// AckIDList acknowledges several messages.
func (c *Consumer) AckIDList(ids []pulsar.MessageID) error {
	inner, err := c.current()
	if err != nil {
		return err
	}
	return inner.AckIDList(ids)
}

// AckWithTxn acknowledges a message within a transaction.
func (c *Consumer) AckWithTxn(msg pulsar.Message, txn pulsar.Transaction) error {
	inner, err := c.current()
	if err != nil {
		return err
	}
	return inner.AckWithTxn(msg, txn)
}

// AckCumulative acknowledges every message up to msg.
func (c *Consumer) AckCumulative(msg pulsar.Message) error { return c.AckIDCumulative(msg.ID()) }

// AckIDCumulative acknowledges every message up to id.
func (c *Consumer) AckIDCumulative(id pulsar.MessageID) error {
	inner, err := c.current()
	if err != nil {
		return err
	}
	return inner.AckIDCumulative(id)
}

// ReconsumeLater sends msg to the retry topic; a no-op while stopped (the message returns to
// the broker anyway).
func (c *Consumer) ReconsumeLater(msg pulsar.Message, delay time.Duration) {
	if inner, err := c.current(); err == nil {
		inner.ReconsumeLater(msg, delay)
	}
}

// ReconsumeLaterWithCustomProperties is ReconsumeLater with properties.
func (c *Consumer) ReconsumeLaterWithCustomProperties(msg pulsar.Message, props map[string]string, delay time.Duration) {
	if inner, err := c.current(); err == nil {
		inner.ReconsumeLaterWithCustomProperties(msg, props, delay)
	}
}

// Nack asks for redelivery of msg after the consumer's NackRedeliveryDelay (or backoff
// policy); a no-op while stopped. The delay runs only while the consumer runs (nack.go), so
// nothing is redelivered, retried or dead-lettered while paused, whenever the nack was made.
func (c *Consumer) Nack(msg pulsar.Message) { c.nack(deferredNack{msg: msg}) }

// NackID asks for redelivery of a message by id, its delay running only while the consumer
// runs, like Nack.
func (c *Consumer) NackID(id pulsar.MessageID) { c.nack(deferredNack{id: id}) }

// Seek resets the subscription to id (non-partitioned topics, as in the client). Messages the
// gate holds are dropped; the gate stays closed during the seek.
func (c *Consumer) Seek(id pulsar.MessageID) error {
	return c.seekWith(context.Background(), func(inner pulsar.Consumer) error { return inner.Seek(id) })
}

// SeekByTime resets the subscription to a publish time, dropping held messages.
func (c *Consumer) SeekByTime(t time.Time) error {
	return c.seekWith(context.Background(), func(inner pulsar.Consumer) error { return inner.SeekByTime(t) })
}

// Close closes the consumer for good: blocked Receive calls return ErrConsumerClosed, Run and
// SetState return it, and State reports Stopped, not connected. Held messages and deferred
// nacks are dropped: closing returns those messages to the broker. Idempotent.
func (c *Consumer) Close() {
	_ = c.lock(context.Background())
	defer c.unlock()
	c.finish("Consumer closed")
}

// finish closes the consumer for good; callers hold the transition lock.
func (c *Consumer) finish(why string) {
	c.mu.Lock()
	if c.closed {
		c.unlockGate()
		return
	}
	c.closeGateLocked()
	c.endLocked()
	c.signalLocked()
	c.unlockGate()
	c.closeInner()
	c.recordState()
	c.agent.forget(c)
	c.metrics.delete()
	c.log.Info(why)
}

// discard releases a consumer whose first subscribe failed.
func (c *Consumer) discard() {
	c.mu.Lock()
	c.endLocked()
	c.signalLocked()
	c.unlockGate()
	c.metrics.delete()
}
