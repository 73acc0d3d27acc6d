package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
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
// the client's consumer, and adds Pause, Resume, Stop, Run, State, IsPaused, Status and the
// seeks by index.
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
	transitions ctxLock
	// seeks serialises seeks among themselves (and with Unsubscribe), for their whole length.
	seeks ctxLock
	// life ends when the consumer closes for good; a seek under way gives up then.
	life    context.Context
	endLife context.CancelFunc
	wishes  wishes // guarded by transitions
	started bool   // start ran: before it, reconcile only records wishes

	pump *pump // Chan()

	gate     *gate    // the message path (gate.go)
	nacks    nackBook // the nacks the agent keeps (nack.go)
	session  session  // the subscription, guarded by transitions (session.go)
	observed atomic.Pointer[observation]
}

func newConsumer(a *Agent, client pulsar.Client, opts pulsar.ConsumerOptions) *Consumer {
	if opts.Name == "" {
		// The client would draw a new random name on every subscribe; keep one for life so
		// that logs, metrics and the broker see the same consumer across Stop and Run.
		opts.Name = randomName()
	}
	c := &Consumer{
		agent:     a,
		client:    client,
		opts:      opts,
		topic:     topicLabel(opts),
		zeroQueue: opts.EnableZeroQueueConsumer,
		wishes:    wishes{remote: protocol.Running},
		seeks:     newCtxLock(nil),
	}
	c.transitions = newCtxLock(func() {
		if checkSession != nil {
			checkSession(&c.session)
		}
	})
	c.life, c.endLife = context.WithCancel(context.Background())
	c.log = a.log.WithValues("topic", c.topic, "subscription", opts.SubscriptionName, "consumer", opts.Name)
	c.metrics = a.metrics.forConsumer(c.topic, opts.SubscriptionName, opts.Name)
	c.gate = newGate(c, c.zeroQueue, declaresChunks(opts), c.metrics)
	c.pump = newPump(c.gate)
	c.nacks = nackBook{opts: opts, metrics: c.metrics}
	c.session = session{client: client, opts: opts, log: c.log, gate: c.gate, nacks: &c.nacks}
	c.observed.Store(&observation{state: protocol.Stopped, since: time.Now()})
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

// ctxLock is a mutex that a caller holding a context can stop waiting for.
type ctxLock struct {
	ch       chan struct{}
	onUnlock func() // runs before each unlock, with the lock held
}

func newCtxLock(onUnlock func()) ctxLock {
	return ctxLock{ch: make(chan struct{}, 1), onUnlock: onUnlock}
}

// lock takes the lock unless ctx ends first.
func (l ctxLock) lock(ctx context.Context) error {
	select {
	case l.ch <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l ctxLock) unlock() {
	if l.onUnlock != nil {
		l.onUnlock()
	}
	<-l.ch
}

// Status reports the observed state of the consumer.
func (c *Consumer) Status() protocol.ConsumerStatus {
	obs := c.observed.Load()
	held, receivedWhilePaused := c.gate.counts()
	st := protocol.ConsumerStatus{
		Topic:               c.topic,
		Subscription:        c.opts.SubscriptionName,
		Name:                c.opts.Name,
		State:               obs.state,
		Since:               obs.since,
		HeldMessages:        int64(held),
		ReceivedWhilePaused: receivedWhilePaused,
	}
	st.Connected, st.LastConnected, st.ReconnectingSince = c.session.connection()
	return st
}

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
	_ = c.seeks.lock(context.Background())
	defer c.seeks.unlock()
	if err := c.transitions.lock(context.Background()); err != nil {
		return err
	}
	defer c.transitions.unlock()
	inner, err := c.session.current()
	if err != nil {
		return err
	}
	c.gate.stopFetch()
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
	if err := c.transitions.lock(context.Background()); err != nil {
		return nil, err
	}
	defer c.transitions.unlock()
	inner, err := c.session.current()
	if err != nil {
		return nil, err
	}
	return inner.GetLastMessageIDs()
}

// Ack acknowledges a message; it works while paused.
func (c *Consumer) Ack(msg pulsar.Message) error { return c.AckID(msg.ID()) }

// AckID acknowledges a message by id; it works while paused.
func (c *Consumer) AckID(id pulsar.MessageID) error {
	inner, err := c.session.current()
	if err != nil {
		return err
	}
	return inner.AckID(id)
}

// AckIDList acknowledges several messages.
func (c *Consumer) AckIDList(ids []pulsar.MessageID) error {
	inner, err := c.session.current()
	if err != nil {
		return err
	}
	return inner.AckIDList(ids)
}

// AckWithTxn acknowledges a message within a transaction.
func (c *Consumer) AckWithTxn(msg pulsar.Message, txn pulsar.Transaction) error {
	inner, err := c.session.current()
	if err != nil {
		return err
	}
	return inner.AckWithTxn(msg, txn)
}

// AckCumulative acknowledges every message up to msg.
func (c *Consumer) AckCumulative(msg pulsar.Message) error { return c.AckIDCumulative(msg.ID()) }

// AckIDCumulative acknowledges every message up to id.
func (c *Consumer) AckIDCumulative(id pulsar.MessageID) error {
	inner, err := c.session.current()
	if err != nil {
		return err
	}
	return inner.AckIDCumulative(id)
}

// ReconsumeLater sends msg to the retry topic; a no-op while stopped (the message returns to
// the broker anyway).
func (c *Consumer) ReconsumeLater(msg pulsar.Message, delay time.Duration) {
	if inner, err := c.session.current(); err == nil {
		inner.ReconsumeLater(msg, delay)
	}
}

// ReconsumeLaterWithCustomProperties is ReconsumeLater with properties.
func (c *Consumer) ReconsumeLaterWithCustomProperties(msg pulsar.Message, props map[string]string, delay time.Duration) {
	if inner, err := c.session.current(); err == nil {
		inner.ReconsumeLaterWithCustomProperties(msg, props, delay)
	}
}

// Nack asks for redelivery of msg after the consumer's NackRedeliveryDelay (or backoff
// policy); a no-op while stopped. The delay runs only while the consumer runs (nack.go), so
// nothing is redelivered, retried or dead-lettered while paused, whenever the nack was made.
func (c *Consumer) Nack(msg pulsar.Message) {
	// The application asked for the message again: the broker's next copy must pass the
	// redelivery filter, unless the gate still holds a copy, which is the one asked for.
	c.gate.forgetCopy(msg.ID())
	c.nacks.add(deferredNack{msg: msg})
}

// NackID asks for redelivery of a message by id, its delay running only while the consumer
// runs, like Nack.
func (c *Consumer) NackID(id pulsar.MessageID) {
	c.gate.forgetCopy(id)
	c.nacks.add(deferredNack{id: id})
}

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
// the controller's state changes return it, and State reports Stopped, not connected. Held messages and deferred
// nacks are dropped: closing returns those messages to the broker. Idempotent.
func (c *Consumer) Close() {
	_ = c.transitions.lock(context.Background())
	defer c.transitions.unlock()
	c.finish("Consumer closed")
}

// finish closes the consumer for good; callers hold the transition lock.
func (c *Consumer) finish(why string) {
	if c.session.state == sessionEnded {
		return
	}
	c.closeGate()
	c.gate.end()
	c.endLife()
	c.session.end(sessionEnded)
	c.recordState()
	c.agent.forget(c)
	c.metrics.delete()
	c.log.Info(why)
}

// discard releases a consumer whose first subscribe failed.
func (c *Consumer) discard() {
	_ = c.transitions.lock(context.Background())
	defer c.transitions.unlock()
	c.gate.end()
	c.endLife()
	c.session.end(sessionEnded)
	c.metrics.delete()
}
