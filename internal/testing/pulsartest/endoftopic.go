package pulsartest

import (
	"google.golang.org/protobuf/proto"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// REACHED_END_OF_TOPIC tells the consumers of a subscription of a terminated topic that they
// acknowledged its every entry (AbstractBaseDispatcher.checkAndApplyReachedEndOfTopicOrTopicMigration,
// Consumer.reachedEndOfTopic). The broker sends it, to every consumer of the subscription and
// only while its backlog is empty (getNumberOfEntriesInBacklog):
//   - when the topic is terminated (PersistentSubscription.topicTerminated);
//   - after each ACK that reaches the subscription (PersistentSubscription.acknowledgeMessage;
//     a cumulative ack on Shared never does);
//   - when the dispatcher reads at the end of the terminated topic and the read fails with
//     NoMoreEntriesToReadException (readEntriesFailed). That failed read stays waiting in the
//     cursor, so later reads wait on it: once per subscription, until an Exclusive or Failover
//     redelivery request cancels it. A read already waiting when the topic was terminated never
//     completes and blocks these reads until the subscription's last consumer leaves.
//
// pulsar-client-go (through v0.21) does not handle the command: it closes the connection and
// its consumers reconnect, so a consumer connected at termination with nothing left to read is
// told twice - at termination, and by the read after it reconnects - and then stays connected.
//
// The test broker reads and tells at once. Pulsar re-checks a read it parks at the end 10 ms
// later (ManagedCursorImpl.checkForNewEntries, managedLedgerNewEntriesCheckDelayInMillis), and
// that re-check fails and tells even for a read cancelled meanwhile. So on Pulsar the number of
// tells moves with timing, which the test broker does not model: an ACK inside those 10 ms is
// told twice (by the ACK and by the re-check), a consumer can be told twice at termination (both
// seen under load), and the same re-check could tell pulsar-client-go's third subscription too.

// topicTerminated is PersistentSubscription.topicTerminated; the topic's mutex is held.
func (s *subscription) topicTerminated() {
	if s.waitingForEntries() {
		s.heldRead = true
	}
	if s.backlog() == 0 {
		s.reachedEnd()
	}
}

// checkEndAfterAck follows an ACK that reached the subscription; the topic's mutex is held.
func (s *subscription) checkEndAfterAck() {
	if s.t.terminated && s.backlog() == 0 {
		s.reachedEnd()
	}
}

// checkEndOnRead follows a dispatch: a dispatcher that would read now, at the end of a
// terminated topic, fails its read once; the topic's mutex is held.
func (s *subscription) checkEndOnRead() {
	if !s.t.terminated || s.heldRead || s.staleRead || !s.waitingForEntries() {
		return
	}
	s.staleRead = true
	if s.backlog() == 0 {
		s.reachedEnd()
	}
}

func (s *subscription) reachedEnd() {
	for _, c := range s.consumers {
		c.conn.send(reachedEndOfTopic(c.id))
	}
}

// reachedEndOfTopic is REACHED_END_OF_TOPIC for a consumer.
func reachedEndOfTopic(consumerID uint64) *pb.BaseCommand {
	return &pb.BaseCommand{
		Type:              pb.BaseCommand_REACHED_END_OF_TOPIC.Enum(),
		ReachedEndOfTopic: &pb.CommandReachedEndOfTopic{ConsumerId: proto.Uint64(consumerID)},
	}
}
