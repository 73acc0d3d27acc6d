package agent

import (
	"context"
	"reflect"
	"sync/atomic"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// Chunked messages and long pauses.
//
// pulsar-client-go (v0.19.0, v0.20.0 and v0.21.0 alike, consumer_partition.go) reassembles a
// chunked message in a context created when its first chunk arrives, and starts a goroutine
// per context that waits ExpireTimeOfIncompleteChunk (default one minute) and then discards
// the context if it is still there, acknowledging every chunk it received: chunkedMsgCtxMap
// addIfAbsent calls discardChunkIfExpire with autoAck true, whatever AutoAckIncompleteChunk
// says. The chunks that arrive later find no context and are dropped without returning their
// permit. While the gate is closed the broker stops once the complete messages hold the
// client's permits, usually in the middle of other messages (producers interleave), so a pause
// longer than the expiry acknowledges those messages' first chunks unseen (lost) and strands
// the consumer without permits. Nothing in the client disarms that goroutine but closing the
// consumer (chunkedMsgCtxMap.Close, after which the discard does nothing); a longer expiry
// only moves the deadline and keeps one goroutine per chunked message alive that much longer.
//
// So a paused consumer that receives chunked messages is subscribed afresh (closed, its
// unacknowledged messages returned to the broker, and subscribed again, still gated) every
// half expiry of the pause, before any context from the previous subscription can expire.
// On the broker this is what a reconnect while paused does (the reconnect limit: a new
// session and the initial grant of the receiver queue). A consumer receives chunked messages
// once one has reached the gate, or from the start when its options set
// ExpireTimeOfIncompleteChunk, MaxPendingChunkedMessage or AutoAckIncompleteChunk.

// defaultChunkExpiry is pulsar-client-go's ExpireTimeOfIncompleteChunk when the option is zero
// (consumer_impl.go).
const defaultChunkExpiry = time.Minute

// chunkExpiry is the client's incomplete-chunk expiry for opts.
func chunkExpiry(opts pulsar.ConsumerOptions) time.Duration {
	if opts.ExpireTimeOfIncompleteChunk > 0 {
		return opts.ExpireTimeOfIncompleteChunk
	}
	return defaultChunkExpiry
}

// declaresChunks reports whether the options configure chunked-message reassembly, which
// says that the application expects chunked messages.
func declaresChunks(opts pulsar.ConsumerOptions) bool {
	return opts.ExpireTimeOfIncompleteChunk != 0 || opts.MaxPendingChunkedMessage != 0 || opts.AutoAckIncompleteChunk
}

// isChunkedID reports whether id is the client's id of a reassembled chunked message (its
// unexported chunkMessageID, the only way the client marks such a message).
func isChunkedID(id pulsar.MessageID) bool {
	t := reflect.TypeOf(id)
	if t == nil {
		return false
	}
	if plain := plainIDType.Load(); plain != nil && plain.Type == t {
		return false
	}
	chunked := t.Kind() == reflect.Pointer && t.Elem().Name() == "chunkMessageID"
	if !chunked {
		plainIDType.Store(&idType{t})
	}
	return chunked
}

// plainIDType is the last id type isChunkedID found not chunked. The fast take asks about
// every message until a chunked one comes, and reading a type's name is a third of its cost
// (BenchmarkConsumeInterleaved), where the client hands out one or two id types in all.
var plainIDType atomic.Pointer[idType]

type idType struct{ reflect.Type }

// noteChunked records that the consumer receives chunked messages once one reaches the gate.
// Lock-free: the fast take calls it for every message.
func (g *gate) noteChunked(cm pulsar.ConsumerMessage) {
	if !g.chunked.Load() && cm.Message != nil && isChunkedID(cm.Message.ID()) {
		g.chunked.Store(true)
	}
}

// renew subscribes the paused consumer afresh so that the client's expiry of incomplete
// chunked messages never runs for a session (see above).
func (c *Consumer) renew(seq int64) {
	_ = c.transitions.lock(context.Background())
	defer c.transitions.unlock()
	if seq != c.session.renewSeq || c.session.state == sessionEnded {
		return // stale
	}
	c.session.renewal = nil
	if c.wishes.desired(c.agent.startGate.State()) != protocol.Paused {
		return
	}
	c.log.Info("Subscribing afresh while paused, before the client could expire incomplete chunked messages",
		"expireTimeOfIncompleteChunk", chunkExpiry(c.opts).String())
	c.metrics.m.chunkRenewals.Inc()
	c.session.end(sessionRenewing)
	logIfFailed(c.log, c.reconcile())
	if c.session.state == sessionRenewing {
		c.session.set(sessionUnsubscribed, nil, nil) // the subscribe failed: acks wait no more
	}
}
