package agent

import (
	"maps"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// plug is the client's MessageChannel (src) and the plug that keeps the client from pushing
// into it while the gate is closed: every free slot filled with a placeholder (a zero
// ConsumerMessage, which the client never sends). pulsar-client-go returns a flow permit per
// push, so a full src returns none. Its fields change only through its methods, which run
// with the gate's lock held; nobody but drain takes from a plugged src.
type plug struct {
	src     chan pulsar.ConsumerMessage
	plugged bool
	// real counts the messages (not placeholders) in the plugged src, all pushed before at.
	real int
	at   time.Time
	// discard means draining drops the real messages of discardOf (nil: every partition):
	// a seek made them stale. Which partition a message belongs to is known only when drained.
	discard   bool
	discardOf partitionSet
}

// newSource makes the MessageChannel for a new subscribe: unbuffered for a zero-queue consumer
// (the client's own Receive reads it, so it is never plugged), otherwise channelCapacity slots,
// full of placeholders when plugged, so that a consumer subscribing while gated cannot return
// a single permit.
func newSource(zeroQueue, plugged bool) chan pulsar.ConsumerMessage {
	if zeroQueue {
		return make(chan pulsar.ConsumerMessage)
	}
	src := make(chan pulsar.ConsumerMessage, channelCapacity)
	if plugged {
		for range channelCapacity {
			src <- pulsar.ConsumerMessage{}
		}
	}
	return src
}

// use makes src the channel of the current subscribe (nil: none). plugged says newSource
// made it full, so it holds placeholders only (a zero-queue src is never plugged).
func (p *plug) use(src chan pulsar.ConsumerMessage, plugged bool) {
	*p = plug{src: src, plugged: plugged && cap(src) > 0}
}

// source is the current MessageChannel, nil when unsubscribed.
func (p *plug) source() chan pulsar.ConsumerMessage { return p.src }

func (p *plug) isPlugged() bool { return p.plugged }

// held counts the messages the plugged src holds for the application, an upper bound while
// a partial discard waits for the drain.
func (p *plug) held() int { return p.real }

// fill plugs src: it fills every free slot with a placeholder. A zero-queue src is never
// plugged. Nobody else takes from src meanwhile, so a failed send means src is full.
func (p *plug) fill() {
	if p.plugged || p.src == nil || cap(p.src) == 0 {
		return
	}
	placeholders := 0
	for full := false; !full; {
		select {
		case p.src <- pulsar.ConsumerMessage{}:
			placeholders++
		default:
			full = true
		}
	}
	*p = plug{src: p.src, plugged: true, real: cap(p.src) - placeholders, at: time.Now()}
}

// drain unplugs src: it takes exactly cap(src) items, passes the messages the client pushed
// before the plug to keep in order (skipping those a seek discarded) and drops the
// placeholders. New pushes land behind what it took.
func (p *plug) drain(keep func(pulsar.ConsumerMessage)) {
	if !p.plugged {
		return
	}
	for range cap(p.src) {
		cm := <-p.src
		if cm.Message != nil && !(p.discard && p.discardOf.has(cm.Message.ID().PartitionIdx())) {
			keep(cm)
		}
	}
	p.use(p.src, false)
}

// discardBefore marks the plugged messages of these partitions (nil: all) to be dropped by the
// drain, when they were pushed at or before `before` (zero: whenever). It returns how many it
// knows it dropped: all of them for every partition, none for some (known only at the drain).
func (p *plug) discardBefore(before time.Time, partitions partitionSet) int {
	if !p.plugged || p.real == 0 || (!before.IsZero() && p.at.After(before)) {
		return 0
	}
	switch {
	case partitions == nil || (p.discard && p.discardOf == nil):
		p.discardOf = nil
	case p.discard:
		maps.Copy(p.discardOf, partitions)
	default:
		p.discardOf = maps.Clone(partitions)
	}
	p.discard = true
	if partitions != nil {
		return 0
	}
	dropped := p.real
	p.real = 0
	return dropped
}
