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
//	cl := pulsartest.StartCluster(t, 2) // two brokers, one storage
//	_ = cl.MoveTopic("my-topic", 1)      // broker 1 owns it
//	// a client of cl.Broker(0).ServiceURL() is redirected to broker 1
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
//     Failover standby stays connected and is not told. The SEEK or the
//     admin call is answered once the CLOSE_CONSUMER frames are written.
//   - Reads (ReadBatchSize, PreciseDispatcherFlowControl):
//     PersistentDispatcherSingleActiveConsumer.calculateToRead reads
//     min(permits, dispatcherMaxReadBatchSize=100) ENTRIES and sends them all,
//     so a grant of N permits delivers N batches; Shared
//     (PersistentDispatcherMultipleConsumers.trySendMessagesToConsumers) gives
//     each consumer max(min(messages, permits, 20) / average batch size, 1)
//     entries. Permits are debited per message and go negative.
//   - Key_Shared (PersistentStickyKeyDispatcherMultipleConsumers,
//     ConsistentHashingStickyKeyConsumerSelector): a ring of 100 points per
//     consumer NAME; keys and points hash into [1, 65535] as (Murmur3 mod
//     65535) plus 1 (StickyKeyConsumerSelectorUtils.makeStickyKeyHash), a point taken
//     twice stays with the consumer that joined first; a key whose consumer has no
//     permits waits in the replay queue while other keys flow, until the
//     queue holds getEffectiveLookAheadLimit() = min(2000 x consumers, 20000)
//     entries, when normal reads stop for every consumer; a key still unacked
//     on another consumer is draining (PIP-379 DrainingHashesTracker) and
//     waits; a key waiting in replay holds back its newer entries. Stats
//     show the replay queue as msgInReplay (entries); avgMessagesPerEntry
//     is always 1 here, where the broker keeps a moving average of the
//     messages per entry it dispatched to the consumer.
//     Options.KeySharedHashRanges is subscriptionKeySharedUseConsistentHashing=false
//     (HashRangeAutoSplitStickyKeyConsumerSelector): keys hash into [0, 65535]
//     (murmur3 mod 65536, 0 taken as 1); the first consumer serves every hash
//     up to 65536, each next one splits the biggest range (the first of
//     equals) and takes its lower half; a leaving consumer's range goes to
//     the range above it, or from the top range to the one below. Ranges
//     follow join order, not names: a consumer that comes back splits again.
//   - Unacked limits (MaxUnackedPerConsumer 50000, MaxUnackedPerSubscription
//     200000), Shared and Key_Shared only: Consumer.addAndGetUnAckedMsgs
//     blocks a consumer at the limit and unblocks it at half; FLOW permits
//     received meanwhile are put aside (Consumer.flowPermits);
//     PersistentDispatcherMultipleConsumers.addUnAckedMessages stops normal
//     reads of the subscription the same way.
//   - Redelivery count: incremented by nack / ack-timeout redelivery only
//     (incrementAndGetRedeliveryCount), not when a closed consumer's
//     messages return to the others; when the last consumer of a Shared or
//     Key_Shared subscription leaves, the counts and the replay queue are
//     dropped (clearComponentsAfterRemovedAllConsumers), so the next one
//     sees 0. Exclusive and Failover always send 0
//     (RedeliveryTrackerDisabled) and a redelivery request rewinds the cursor.
//   - Deduplication is off (brokerDeduplicationEnabled=false): resends are
//     stored again and PRODUCER_SUCCESS carries last_sequence_id -1.
//     Options.Deduplication turns MessageDeduplication on. A PRODUCER for a
//     producer id the connection already has is answered PRODUCER_SUCCESS
//     with that producer's name (ServerCnx.handleProducer); another producer
//     of a connected name gets ProducerBusy.
//   - A second Exclusive consumer is refused with ConsumerBusy only after the
//     holder's connection passed a liveness check (a PING answered within
//     connectionLivenessCheckTimeoutMillis, 5 s); a dead holder's connection
//     is closed and the newcomer admitted
//     (AbstractDispatcherSingleActiveConsumer.addConsumer,
//     ServerCnx.checkConnectionLiveness). pulsar-client-go v0.20 and later
//     give up reconnecting on ConsumerBusy.
//   - A cumulative ack on Shared or Key_Shared is ignored (Consumer.messageAcked).
//   - Shared consumers' priority_level (AbstractDispatcherMultipleConsumers.getNextConsumer,
//     ConsumerPrioritySelector): the consumer list is sorted by level, join
//     order within one; dispatch goes to the lowest level number that has a
//     consumer with permits, round robin within the level.
//   - producer_access_mode (AbstractTopic.incrementTopicEpochIfNeeded,
//     handleProducerRemoved): beside an Exclusive producer, or one waiting, a
//     Shared producer gets ProducerBusy and an Exclusive one ProducerFenced
//     ("Topic has an existing exclusive producer: name"; "Topic has existing
//     shared producers" beside Shared ones); WaitForExclusive beside any
//     producer is answered PRODUCER_SUCCESS with producer_ready=false and
//     readied, first come first served, when an exclusive producer goes - as
//     in Pulsar, not when the last Shared one goes; ExclusiveWithFencing
//     removes every producer without telling its client (Producer.close) and
//     fails the waiting ones with ProducerFenced "Fenced out". The messages
//     start with the Java exception's class, as ServerCnx writes them.
//     Exclusive producers take the next topic epoch (PRODUCER_SUCCESS
//     topic_epoch, absent before the first); one reconnecting with an older
//     epoch is fenced. A SEND for a producer the connection does not have (a
//     waiting or fenced one) closes the connection (ServerCnx.handleSend),
//     unless the broker closed that producer itself (unload).
//   - A PRODUCER's initial_subscription_name (dead-letter producers set it)
//     creates that subscription if absent, durable at the topic's first entry,
//     before the producer is admitted (ServerCnx.handleProducer,
//     createSubscription with InitialPosition.Earliest).
//   - Failover (AbstractDispatcherSingleActiveConsumer.pickAndScheduleActiveConsumer):
//     consumers sorted by priority level then name; on a partition the
//     active one is partition index mod count, else a hash ring of the names
//     probed with the topic name - join order does not matter. A change of
//     active consumer rewinds the cursor and, after
//     activeConsumerFailoverDelayTimeMillis (1 s; ActiveConsumerFailoverDelay),
//     sends ACTIVE_CONSUMER_CHANGE and dispatches
//     (PersistentDispatcherSingleActiveConsumer.scheduleReadOnActiveConsumer).
//   - REST: getMessageIdByIndex answers {ledgerId, entryId, partitionIndex,
//     batchIndex: -1, batchSize: 0}, and -1:-1 for an index of the topic's
//     first entry other than its last (as Pulsar 4.2.4 does), 404 past the
//     end or on a topic without entries, 405 on a partitioned base name;
//     excluded (the Java field isExcluded) and batchIndex are ResetCursorData
//     body fields, unknown fields are ignored; resetcursor
//     on a partitioned base name answers 405; /stats on it answers 404
//     (partitioned-stats aggregates); .../partitions answers
//     {partitions, deleted: false}, and for a topic that does not exist 404
//     "Topic ... not found" unless checkAllowAutoCreation=true, which answers
//     {partitions: 0} (PersistentTopicsBase.internalGetPartitionedMetadataAsync,
//     auto-creation on; the same on 4.0.7 and 4.2.4); PUT on a topic creates it (409 when it
//     exists), PUT .../unload unloads it, POST .../subscription/{s}/
//     expireMessages/{seconds} (or all_subscription) runs message expiry at
//     once. Stats report unackedMessages 0 for Exclusive and Failover
//     consumers (only individual-ack subscriptions count them).
//   - Internal stats have PersistentTopicInternalStats' fields (properties
//     {index}, schemaLedgers, compactedLedger, and per cursor
//     lastLedgerSwitchTimestamp, subscriptionHavePendingRead, waitingReadOp
//     for a dispatcher waiting for entries, individuallyDeletedMessages as
//     "[(l:e..l:e]]"); a ledger has a timestamp only once a rollover closed
//     it. Get-message-by-id writes the headers the broker does
//     (X-Pulsar-PROPERTY as a JSON object, X-Pulsar-uncompressed-size,
//     X-Pulsar-Is-Encrypted, X-Pulsar-txn-uncommitted; X-Pulsar-batch-size
//     is the stored entry less its metadata) and answers 500 for an entry
//     past the current ledger's last, 404 for an unknown ledger. Times are
//     written by DateFormatter (ISO offset date-time, fraction trimmed).
//   - Permit accounting of the fixed broker (FLOW on Shared and Key_Shared
//     updates the consumer at once and the dispatcher total later, on the
//     topic's dispatch lane); CheckPermitInvariant checks
//     total = sum(permits - pending FLOW permits).
//   - maxMessageSize (Options.MaxMessageSize, 5 MiB): CONNECTED announces it,
//     and pulsar-client-go refuses a larger message itself (ErrMessageTooLarge,
//     before sending). The broker's frame decoder
//     (FrameDecoderUtil, Netty's LengthFieldBasedFrameDecoder) takes a frame
//     whose size field is at most maxMessageSize + 10 KiB - 4 (the limit counts
//     the field) and closes the connection, unanswered, on a longer one
//     (TooLongFrameException, ServerCnx.exceptionCaught); a SEND within that
//     padding but over maxMessageSize is stored here, where a standalone
//     broker's bookie (nettyMaxFrameSizeBytes, 5 MiB) refuses an entry that
//     large and the broker retries it on new ledgers, never confirming it. A
//     topic policy maxMessageSize is not modelled.
//   - REACHED_END_OF_TOPIC (endoftopic.go): to every consumer of a
//     subscription of a terminated topic whose backlog is empty - at
//     termination (PersistentSubscription.topicTerminated), after each ACK
//     that reaches the subscription (acknowledgeMessage), and on the
//     dispatcher's first read at the end (readEntriesFailed with
//     NoMoreEntriesToReadException), which stays waiting in the cursor so
//     later reads tell nothing until an Exclusive or Failover redelivery
//     request; a read waiting when the topic was terminated holds reads back
//     until the last consumer leaves. pulsar-client-go through v0.21 does
//     not handle the command: it closes the connection and its consumers
//     reconnect (a consumer connected at termination with nothing to read
//     is told twice, then stays connected); it has no HasReachedEndOfTopic
//     and its reader's HasNext does not look at termination. Pulsar's
//     10 ms re-check of a parked read is not modelled: on Pulsar a read
//     and an ACK close together can tell twice.
//   - Lookups answer Options.AdvertisedURL (a broker's advertised address),
//     so a proxy can sit between client and broker.
//   - A SEND for a producer the broker closed (unload) is ignored, not
//     answered (ServerCnx.handleSend, recentlyClosedProducers); the client
//     sends it again after reconnecting.
//
// Several brokers (StartCluster / NewCluster) share one storage, as brokers
// share BookKeeper and the metadata store; broker 0 is the leader. Each
// topic, and each partition on its own, is owned by one broker at a time
// (a topic stands for its namespace bundle here). Cluster.MoveTopic chooses
// the owner (else an FNV hash of the name picks it) and unloads the topic.
//   - Lookups (NamespaceService.findBrokerServiceUrl, searchForCandidateBroker,
//     TopicLookupBase.lookupTopicAsync; LookupResult): an owned topic gets
//     Connect to its owner, authoritative, from any broker; an unowned one is
//     sent by a follower to the leader (Redirect, authoritative=false), by
//     the leader to the broker it assigns (Redirect, authoritative=true),
//     and acquired by the broker that gets an authoritative lookup or that
//     the leader assigns to itself. pulsar-client-go follows Redirect and
//     echoes the flag (lookup_service.go).
//   - PRODUCER and SUBSCRIBE on a broker that does not own the topic fail
//     with ServiceNotReady "Namespace bundle for topic (...) not served by
//     this instance" (BrokerService.checkTopicNsOwnership).
//   - Admin calls for a topic to a non-owner answer 307 Temporary Redirect
//     to the owner's admin URL, same path and query with authoritative set
//     to whether the redirecting broker is the leader
//     (PulsarWebResource.validateTopicOwnershipAsync). Namespace policies,
//     partition metadata and partitioned-stats are answered by any broker.
//   - Unloading (UnloadTopic, MoveTopic) releases ownership and closes the
//     topic's producers and consumers; clients look the topic up again.
//
// Retention, read by the broker's periodic checks (MessageExpiryCheckInterval,
// BacklogQuotaCheckInterval; RunExpiryCheck and CheckBacklogQuotas run them
// at once, and Options.Clock moves time without sleeping):
//   - messageTTL (PersistentMessageExpiryMonitor.expireMessages): every
//     subscription's cursor is mark-deleted up to the newest entry older than
//     the TTL (MessageImpl.isEntryExpired, broker timestamp), so those
//     messages are never dispatched; copies a consumer already holds stay
//     there. Applied TTL: topic, else namespace, else DefaultMessageTTL.
//   - Backlog quotas with consumer_backlog_eviction (BacklogQuotaManager):
//     destination_storage, once the backlog size after the slowest durable
//     cursor reaches limitSize (PersistentTopic.isSizeBacklogExceeded),
//     skips on the slowest cursor the share of its entries that brings the
//     size to 90% of the limit, stopping when the same cursor is slowest
//     twice (dropBacklogForSizeLimit); message_age skips whole ledgers closed
//     more than limitTime ago (dropBacklogForTimeLimit), or with
//     PreciseTimeBasedBacklogQuotaCheck expires what is older than 90% of
//     limitTime. producer_request_hold and producer_exception are stored and
//     reported, not enforced. Applied quota per type: topic, else
//     namespace, else DefaultBacklogQuota (no limit).
//   - REST (Namespaces, PersistentTopics): /admin/v2/namespaces/{t}/{ns}/
//     messageTTL (GET, POST integer body, DELETE), backlogQuota (POST
//     BacklogQuotaImpl {limit, limitSize, limitTime, policy},
//     ?backlogQuotaType=destination_storage|message_age; DELETE),
//     backlogQuotaMap (GET); the same under /admin/v2/persistent/{t}/{ns}/
//     {topic}/ (POST messageTTL?messageTTL=N; GET ?applied=true). An unset
//     Integer answers 200 with an empty body. Topic stats add backlogSize, and per subscription
//     backlogSize, totalMsgExpired, lastExpireTimestamp, activeConsumerName
//     (Exclusive, Failover) and, with getEarliestTimeInBacklog=true,
//     earliestMsgPublishTimeInBacklog: the entry timestamp
//     (Commands.getEntryTimestamp, the broker's) of the first unacknowledged
//     entry, the time TTL compares, or -1 for an empty backlog.
//
// Partitioned topics are created with PUT .../partitions, whose body is the
// count or, with media type application/vnd.partitioned-topic-metadata+json
// (pulsaradmin), PartitionedTopicMetadata {"partitions", "properties"}
// (ExtPersistentTopics.createPartitionedTopic; 406 unless positive, 409 when
// taken; GET .../partitions then shows the properties); grown with POST
// .../partitions (406 unless positive, 409 unless it grows); deleted with
// DELETE .../partitions (404 unless partitioned, 412 while a partition has a
// producer or consumer unless force=true, which closes them). partitioned-stats
// has its "partitions" map unless perPartition=false; its aggregate publishers
// and consumers have no metadata nor clientVersion, which a topic's or
// partition's own stats show (CONNECT client_version; PRODUCER and SUBSCRIBE
// metadata, {} when none). POST .../terminate (PersistentTopics.terminate)
// answers the last message id as MessageIdImpl ({ledgerId, entryId,
// partitionIndex: -1, batchIndex: -1, batchSize: 0}; 405 on a partitioned base
// name, 404 for an unknown topic) and disconnects the producers, which are then
// refused with TopicTerminatedError. With
// Options.AdminToken the admin API authenticates bearer tokens (401 first,
// even before a redirect) and keeps policies and partition changes for
// tenant admins (403 to the application's role), as PulsarAuthorizationProvider
// does; without it the API is open.
//
// A topic opens its first ledger when it is created (ManagedLedgerImpl), so
// internal stats list that empty ledger and lastConfirmedEntry is
// (ledgerId, -1). An unload closes the current ledger and opens a new one
// (an empty one is replaced). GetLastMessageId on a topic without entries
// answers -1:-1 (PersistentTopic.getLastDispatchablePosition is EARLIEST);
// pulsar-client-go only checks entryId >= 0 (isEntryIDValid). Its answer
// always carries consumer_mark_delete_position, as ServerCnx sets it: the
// last entry of the acknowledged prefix, or entry -1 of the first ledger
// (a reader's HasNext after a seek by time reads it).
//
// differential_test.go runs the same scenarios here and, given PULSAR_URL
// and PULSAR_ADMIN_URL, on a real broker (hack/pulsar/pulsar.sh exec), and
// compares what the client saw. Known divergences, skipped there by name:
//   - broker timestamp: every entry carries a broker timestamp here
//     (AppendBrokerTimestampMetadataInterceptor); the reference broker runs
//     AppendIndexMetadataInterceptor only, so it sends none, has no
//     X-Pulsar-Broker-Entry-METADATA-timestamp header, and its
//     X-Pulsar-batch-size, which counts the broker-entry section, is 7 bytes
//     smaller. Message TTL and seek by time read that timestamp here, the
//     publish time there.
//   - internal stats on 4.0 have no "properties"; they are written as 4.2
//     writes them.
//
// A scenario that needs a broker setting other than the default (the
// Key_Shared hash ranges) runs on the real broker only when its runtime
// configuration has it: a second run with
// `--set subscriptionKeySharedUseConsistentHashing=false` covers it.
//
// Not compared: the periodic message-TTL check (the real broker runs it once
// a minute at best, messageExpiryCheckIntervalInMinutes=1, too slow for a
// test: the scenario runs the same expiry monitor through expireMessages);
// the cursor's own ledger (cursorLedger, cursorLedgerLastEntry are -1 here:
// BookKeeper persistence of mark-delete positions is not modelled); rates
// and other timing-driven stats.
//
// Not modelled: schemas, transactions, chunking, compression-aware key
// routing, batch-index acks (a partially acked batch stays unacked until the
// client acks the whole entry), delayed delivery, non-persistent topics,
// binary-protocol authentication, topic watchers, the HTTP lookup service, namespace bundles
// and load balancing, retention size/time limits and ledger trimming, and
// the Key_Shared STICKY mode (consumers naming their own hash ranges). A
// request for what is not modelled is answered at once, never left to the
// client's operation timeout: GET_SCHEMA as Pulsar answers for a topic without
// a schema (TopicNotFound, "Topic not found or no-schema"), any other with an
// ERROR (NotAllowedError) naming the command; each is logged once and counted
// (Broker.Unmodelled).
//
// Regenerate the protocol subset with `go generate ./internal/testing/pulsartest/...`.
package pulsartest
