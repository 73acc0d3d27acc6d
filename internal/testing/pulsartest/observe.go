package pulsartest

import (
	"errors"
	"fmt"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// SubscriptionStats is a snapshot of one subscription; for a partitioned
// topic's base name it sums the partitions.
type SubscriptionStats struct {
	Backlog    int64 // entries not yet acknowledged, like msgBacklog
	Dispatched int64 // messages sent to consumers, redeliveries included
	Acked      int64 // messages acknowledged
	Consumers  []ConsumerStats
	Cursors    []CursorStats // one per (partition) topic
}

// CursorStats is where a subscription stands on one (partition) topic, in
// the "ledgerId:entryId" form of internal stats.
type CursorStats struct {
	Topic              string
	Type               string // Exclusive, Shared, Failover or Key_Shared
	MarkDeletePosition string // last position of the acknowledged prefix
	ReadPosition       string // next position never dispatched
}

// ConsumerStats is one connected consumer of a subscription.
type ConsumerStats struct {
	Topic      string // full name of the (partition) topic
	Name       string
	ConsumerID uint64
	Conn       uint64
	Permits    int64 // outstanding permits; negative after a batch larger than the grant
	Unacked    int64 // messages dispatched and not acknowledged
	Dispatched int64 // messages
	Active     bool  // receives dispatch: always for Shared and Key_Shared, the active one for Exclusive and Failover
}

// Subscription returns a snapshot of the subscription's counters and consumers.
func (b *Broker) Subscription(topic, subscription string) SubscriptionStats {
	var out SubscriptionStats
	for _, t := range b.topicsNamed(topic) {
		t.mu.Lock()
		if s := t.subs[subscription]; s != nil {
			out.Backlog += s.backlog()
			out.Dispatched += s.dispatched
			out.Acked += s.ackedMsgs
			for _, c := range s.consumers {
				out.Consumers = append(out.Consumers, c.stats())
			}
			out.Cursors = append(out.Cursors, CursorStats{
				Topic: t.name.full, Type: subTypeName(s.kind),
				MarkDeletePosition: t.positionBefore(s.markDelete), ReadPosition: t.positionAt(s.readPos),
			})
		}
		t.mu.Unlock()
	}
	return out
}

func (c *consumer) stats() ConsumerStats {
	return ConsumerStats{
		Topic: c.sub.t.name.full, Name: c.name, ConsumerID: c.id, Conn: c.conn.id,
		Permits: c.permits, Unacked: c.unackedMsgs, Dispatched: c.dispatched,
		Active: c.sub.active == c || c.sub.kind == pb.CommandSubscribe_Shared || c.sub.kind == pb.CommandSubscribe_Key_Shared,
	}
}

// CheckPermitInvariant verifies, for every subscription, the invariant of
// the Java broker's permit-accounting fix: the dispatcher's total, which is
// maintained incrementally, equals the sum over connected consumers of
// permits minus the FLOW permits still pending on the dispatch lane
// (permits received while blocked on unacked messages are in neither).
func (b *Broker) CheckPermitInvariant() error {
	var errs []error
	for _, t := range b.allTopics() {
		t.mu.Lock()
		for _, s := range t.subs {
			var sum int64
			for _, c := range s.consumers {
				if c.removed {
					errs = append(errs, fmt.Errorf("%s/%s: removed consumer %d still listed", t.name.full, s.name, c.id))
				}
				sum += c.permits - c.pendingFlow
			}
			if sum != s.totalPermits {
				errs = append(errs, fmt.Errorf("%s/%s: dispatcher total %d != sum of consumer permits minus pending %d",
					t.name.full, s.name, s.totalPermits, sum))
			}
		}
		t.mu.Unlock()
	}
	return errors.Join(errs...)
}
