// Package pulsartest is a Pulsar broker for tests. It speaks the binary
// protocol to the unmodified pulsar-client-go, serves a subset of the admin
// REST API, keeps topics in memory as ledgers of entries, dispatches by flow
// permits for all four subscription types, and records every FLOW it gets,
// so that tests can assert on the wire what a consumer asked for.
//
// Usage from a test:
//
//	b := pulsartest.Start(t)
//	client, _ := pulsar.NewClient(pulsar.ClientOptions{URL: b.ServiceURL()})
//	// ... produce and consume ...
//	flows := b.Flows("my-topic", "my-sub")      // every FLOW, in arrival order
//	stats := b.Subscription("my-topic", "my-sub") // backlog, permits, unacked
//	if err := b.CheckPermitInvariant(); err != nil { t.Fatal(err) }
//
// Semantics worth knowing:
//   - Topic names may be short ("t") or full ("persistent://public/default/t").
//     A partitioned topic's base name aggregates its partitions in Flows and
//     Subscription.
//   - A start or seek message id positions the cursor at that entry, which
//     is delivered again; the client discards what it must, as with Pulsar.
//   - Counts: Backlog is in entries (like msgBacklog); Dispatched, Acked,
//     Unacked and permits are in messages (a batch counts its messages).
//
// By default it behaves like a 4.x broker with its default configuration
// (Options name the settings that change it). Modelled, with the Java source:
//   - Seek / reset-cursor: PersistentSubscription.resetCursor ->
//     disconnectActiveConsumers(true). Shared and Key_Shared close every
//     consumer; Exclusive and Failover close only the ACTIVE one
//     (AbstractDispatcherSingleActiveConsumer.disconnectActiveConsumers): a
//     Failover standby stays connected and is not told.
//   - Reads (ReadBatchSize, PreciseDispatcherFlowControl):
//     PersistentDispatcherSingleActiveConsumer.calculateToRead reads
//     min(permits, dispatcherMaxReadBatchSize=100) ENTRIES and sends them all,
//     so a grant of N permits delivers N batches; Shared
//     (PersistentDispatcherMultipleConsumers.trySendMessagesToConsumers) gives
//     each consumer max(min(messages, permits, 20) / average batch size, 1)
//     entries. Permits are debited per message and go negative.
//   - Key_Shared (PersistentStickyKeyDispatcherMultipleConsumers,
//     ConsistentHashingStickyKeyConsumerSelector): Murmur3 ring with 100
//     points per consumer NAME over 65536 hashes; a key whose consumer has no
//     permits waits in the replay queue while other keys flow, until the
//     queue holds getEffectiveLookAheadLimit() = min(2000 x consumers, 20000)
//     entries, when normal reads stop for every consumer; a key still unacked
//     on another consumer is draining (PIP-379 DrainingHashesTracker) and
//     waits; a key waiting in replay holds back its newer entries.
//   - Unacked limits (MaxUnackedPerConsumer 50000, MaxUnackedPerSubscription
//     200000), Shared and Key_Shared only: Consumer.addAndGetUnAckedMsgs
//     blocks a consumer at the limit and unblocks it at half; FLOW permits
//     received meanwhile are put aside (Consumer.flowPermits);
//     PersistentDispatcherMultipleConsumers.addUnAckedMessages stops normal
//     reads of the subscription the same way.
//   - Redelivery count: incremented by nack / ack-timeout redelivery only
//     (incrementAndGetRedeliveryCount), not when a closed consumer's
//     messages return; Exclusive and Failover always send 0
//     (RedeliveryTrackerDisabled) and a redelivery request rewinds the cursor.
//   - Deduplication is off (brokerDeduplicationEnabled=false): resends are
//     stored again and PRODUCER_SUCCESS carries last_sequence_id -1.
//     Options.Deduplication turns MessageDeduplication on.
//   - A cumulative ack on Shared or Key_Shared is ignored (Consumer.messageAcked).
//   - Failover (AbstractDispatcherSingleActiveConsumer.pickAndScheduleActiveConsumer):
//     consumers sorted by priority level then name; on a partition the
//     active one is partition index mod count, else a hash ring of the names
//     probed with the topic name - join order does not matter. A change of
//     active consumer rewinds the cursor and, after
//     activeConsumerFailoverDelayTimeMillis (1 s; ActiveConsumerFailoverDelay),
//     sends ACTIVE_CONSUMER_CHANGE and dispatches
//     (PersistentDispatcherSingleActiveConsumer.scheduleReadOnActiveConsumer).
//   - REST: getMessageIdByIndex answers {ledgerId, entryId, partitionIndex};
//     isExcluded and batchIndex are ResetCursorData body fields; resetcursor
//     on a partitioned base name answers 405; /stats on it answers 404
//     (partitioned-stats aggregates); entry timestamp headers are written by
//     DateFormatter (ISO offset date-time).
//   - Permit accounting of the fixed broker (FLOW on Shared and Key_Shared
//     updates the consumer at once and the dispatcher total later, on the
//     topic's dispatch lane); CheckPermitInvariant checks
//     total = sum(permits - pending FLOW permits).
//   - Lookups answer Options.AdvertisedURL (a broker's advertised address),
//     so a proxy can sit between client and broker.
//
// Not modelled: schemas, transactions, chunking, compression-aware key
// routing, batch-index acks (a partially acked batch stays unacked until the
// client acks the whole entry), delayed delivery, non-persistent topics,
// authentication, topic watchers and the HTTP lookup service.
//
// Regenerate the protocol subset with `go generate ./internal/pulsartest/...`.
package pulsartest
