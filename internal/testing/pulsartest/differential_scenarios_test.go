package pulsartest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"google.golang.org/protobuf/proto"

	"github.com/subflow-dev/subflow/internal/testing/wirerec"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

func init() {
	diffScenarios = []diffScenario{
		{name: "FlowPermits", run: diffFlowPermits, want: map[string]string{"": `
			exclusive flows = 40
			exclusive entries = L0:0(1) L0:1(4)
			exclusive permits = 35
			exclusive consumer msgOut = 5
			exclusive consumer unacked = 0
			exclusive flows after receiving 5 of 40 = 40
			shared flows = 40
			shared entries = L1:0(1) L1:1(4)
			shared permits = 35
			shared consumer msgOut = 5
			shared consumer unacked = 5
			shared flows after receiving 5 of 40 = 40
		`}},
		{name: "Reconnect", run: diffReconnect, want: map[string]string{"": `
			subscriptions before = 1
			same consumer id on a new connection = true
			flows after reconnect = 40
			redelivery counts after reconnect = 0 0 0
		`}},
		{name: "SeekClosesConsumer", run: diffSeek, want: map[string]string{"": `
			closed by the broker when the seek returned = 1
			flows after seek = 40
			entries after seek = L0:1(1) L0:2(1) L0:3(1) L0:4(1)
		`}},
		{name: "ResetCursorShared", run: diffResetShared, want: map[string]string{"": `
			reset status = 204
			closed before the answer to a request sent after the reset returned = a b
			closed = a b
			redelivered = 3
		`}},
		{name: "ResetCursorFailover", run: diffResetFailover, want: map[string]string{"": `
			reset status = 204
			closed before the answer to a request sent after the reset returned = active
			closed = active
			flows after reset from = active
			active consumer changes after reset = active=true standby=false
			redelivered to = active
		`}},
		{name: "BatchDispatch", run: diffBatchDispatch, want: map[string]string{"": `
			exclusive 2 permits, batches of 10 = entries=2 messages=20 sizes=10 permits=-18
			failover 2 permits, batches of 10 = entries=2 messages=20 sizes=10 permits=-18
			shared 2 permits, batches of 10 = entries=1 messages=10 sizes=10 permits=-8
			exclusive 150 permits, batches of 2 = entries=100 messages=200 sizes=2 permits=-50
			shared 150 permits, batches of 2 = entries=75 messages=150 sizes=2 permits=0
		`}},
		{name: "FailoverActive", run: diffFailoverActive, want: map[string]string{"": `
			non-partitioned: first joins = first=true after the delay
			non-partitioned: second joins = first=false after the delay second=true after the delay
			partitioned-partition-0: a joins = a=true after the delay
			partitioned-partition-1: a joins = a=true after the delay
			partitioned-partition-0: b joins = b=false at once
			partitioned-partition-1: b joins = a=false after the delay b=true after the delay
		`}},
		{name: "KeySharedStable", run: diffKeyShared, want: map[string]string{"": `
			keys to consumers = k3 k2 k2 k1 k2 k3 k1 k1 k3 k2 k2 k2 k3 k3 k1 k2 k2 k2 k3 k1 k3 k2 k3 k1
			keys after k2 came back = k3 k2 k2 k1 k2 k3 k1 k1 k3 k2 k2 k2 k3 k3 k1 k2 k2 k2 k3 k1 k3 k2 k3 k1
		`}},
		{name: "RedeliveryCount", run: diffRedeliveryCount, want: map[string]string{"": `
			shared redelivery counts: nack, nack, a closes while b is there = a=0 a=1 a=2 b=2
			shared redelivery counts: nack, nack, close, reopen = 0 1 2 0
			exclusive redelivery counts: nack, nack, close, reopen = 0 0 0 0
		`}},
		{name: "CumulativeAckShared", run: diffCumulativeAck, want: map[string]string{"": `
			shared backlog after cumulative ack of the 2nd and ack of the 3rd = 2
			shared ack responses = cumulative=true individual=true
			exclusive backlog after cumulative ack of the 2nd and ack of the 3rd = 0
			exclusive ack responses = cumulative=true individual=true
		`}},
		{name: "ResetCursorBody", run: diffResetCursorBody, want: map[string]string{"": `
			reset to the 3rd, "excluded":true = status=204 backlog=2 markDelete=L0:2 read=L0:3
			reset to the 3rd, "isExcluded":true = status=204 backlog=3 markDelete=L0:1 read=L0:2
			reset to the 3rd, no flag = status=204 backlog=3 markDelete=L0:1 read=L0:2
			reset to the 3rd, "excluded":false = status=204 backlog=3 markDelete=L0:1 read=L0:2
			reset of an unknown subscription = status=404
			reset of a partitioned base name = status=405
			reset of its partition = status=204
		`}},
		{name: "MessageIDByIndex", run: diffMessageIDByIndex, want: map[string]string{
			"4.0": `
				index 0 = status=404
				index 1 = status=404
				index 2 = status=404
				index 3 = status=404
				index 5 = status=404
				index 6 = status=404
				index 7 = status=404
				index 0 of an empty topic = status=404
				index 0 of a partitioned base name = status=404
				`,
			"4.2": `
				index 0 = status=200 batchIndex=-1 batchSize=0 entryId=-1 ledgerId=-1 partitionIndex=-1
				index 1 = status=200 batchIndex=-1 batchSize=0 entryId=-1 ledgerId=-1 partitionIndex=-1
				index 2 = status=200 batchIndex=-1 batchSize=0 entryId=0 ledgerId=L0 partitionIndex=-1
				index 3 = status=200 batchIndex=-1 batchSize=0 entryId=1 ledgerId=L0 partitionIndex=-1
				index 5 = status=200 batchIndex=-1 batchSize=0 entryId=1 ledgerId=L0 partitionIndex=-1
				index 6 = status=200 batchIndex=-1 batchSize=0 entryId=2 ledgerId=L0 partitionIndex=-1
				index 7 = status=404
				index 0 of an empty topic = status=404
				index 0 of a partitioned base name = status=405
				`,
		}},
		{name: "PartitionedStats", run: diffPartitionedStats, want: map[string]string{"": `
			GET /stats = status=404
			GET /partitioned-stats = status=200
			partitioned-stats msgInCounter = 4
			partitioned-stats subscriptions = sub
			GET -partition-0/stats = status=200
			GET /internalStats = status=404
			GET /partitions = status=200
			partitions body = {"partitions":2,"deleted":false}
			GET /stats of a missing topic = status=404
		`}},
		{name: "InternalStatsFields", run: diffInternalStatsFields, want: map[string]string{"": `
			status = 200
			topic fields = compactedLedger,currentLedgerEntries,currentLedgerSize,cursors,entriesAddedCounter,lastConfirmedEntry,lastLedgerCreatedTimestamp,ledgers,numberOfEntries,pendingAddEntriesCount,properties,schemaLedgers,state,totalSize,waitingCursorsCount
			ledger 0 fields = entries,ledgerId,offloaded,size,underReplicated
			cursor fields = active,cursorLedger,cursorLedgerLastEntry,individuallyDeletedMessages,lastLedgerSwitchTimestamp,markDeletePosition,messagesConsumedCounter,numberOfEntriesSinceFirstNotAckedMessage,pendingReadOps,properties,readPosition,state,subscriptionHavePendingRead,subscriptionHavePendingReplayRead,totalNonContiguousDeletedMessagesRange,waitingReadOp
			entries = numberOfEntries=4 currentLedgerEntries=4 lastConfirmedEntry=L0:3 ledgers=L0(0)
			cursor = markDelete=L0:0 read=L0:4
			topic properties = {"index":"-1"}
			topic schemaLedgers = []
			topic compactedLedger = {"ledgerId":-1,"entries":-1,"size":-1,"offloaded":false,"underReplicated":false}
			topic state = "LedgerOpened"
			topic waitingCursorsCount = 1
			topic pendingAddEntriesCount = 0
			topic entriesAddedCounter = 4
			cursor subscriptionHavePendingRead = true
			cursor subscriptionHavePendingReplayRead = false
			cursor state = "Open"
			cursor active = true
			cursor waitingReadOp = true
			cursor pendingReadOps = 0
			cursor messagesConsumedCounter = 2
			cursor individuallyDeletedMessages = "[(L0:1..L0:2]]"
			cursor numberOfEntriesSinceFirstNotAckedMessage = 4
			cursor totalNonContiguousDeletedMessagesRange = 1
			cursor properties = {}
			cursor lastLedgerSwitchTimestamp = (RFC 3339 time)
			topic lastLedgerCreatedTimestamp = (RFC 3339 time)
		`}},
		{name: "EntryByIDHeaders", run: diffEntryHeaders, want: map[string]string{"": `
			batch entry status = 200
			batch entry body bytes = 66
			batch entry header X-Pulsar-Batch-Size = 91
			batch entry header X-Pulsar-Broker-Entry-Metadata-Index = 2
			batch entry header X-Pulsar-Broker-Entry-Metadata-Timestamp = (RFC 3339 time)
			batch entry header X-Pulsar-Is-Encrypted = false
			batch entry header X-Pulsar-Message-Id = L0:0
			batch entry header X-Pulsar-Num-Batch-Message = 3
			batch entry header X-Pulsar-Partition-Key = k
			batch entry header X-Pulsar-Producer-Name = (name)
			batch entry header X-Pulsar-Property = {"p":"v"}
			batch entry header X-Pulsar-Publish-Time = (RFC 3339 time)
			batch entry header X-Pulsar-Sequence-Id = 0
			batch entry header X-Pulsar-Txn-Uncommitted = false
			batch entry header X-Pulsar-Uncompressed-Size = 66
			single entry status = 200
			single entry body bytes = 3
			single entry header X-Pulsar-Broker-Entry-Metadata-Index = 3
			single entry header X-Pulsar-Broker-Entry-Metadata-Timestamp = (RFC 3339 time)
			single entry header X-Pulsar-Is-Encrypted = false
			single entry header X-Pulsar-Message-Id = L0:1
			single entry header X-Pulsar-Producer-Name = (name)
			single entry header X-Pulsar-Property = {}
			single entry header X-Pulsar-Publish-Time = (RFC 3339 time)
			single entry header X-Pulsar-Sequence-Id = 0
			single entry header X-Pulsar-Txn-Uncommitted = false
			single entry header X-Pulsar-Uncompressed-Size = 3
			missing entry status = 500
		`}},
		{name: "LastMessageIDEmpty", run: diffLastMessageID, want: map[string]string{"": `
			empty: ledgers = L0(0)
			empty: lastConfirmedEntry = L0:-1
			empty: last message id = -1:-1 batch=0 partition=0
			one message: last message id = L0:0 batch=0 partition=0
			then a batch of 3: last message id = L0:1 batch=2 partition=0
		`}},
		{name: "ProducerIdempotence", run: diffProducerIdempotence, want: map[string]string{"": `
			create topic = status=204
			create it again = status=409
			producer 1 named px = success name=px lastSequenceId=-1
			producer 1 named px again = success name=px lastSequenceId=-1
			producer 2 unnamed = success name=name1 lastSequenceId=-1
			producer 2 unnamed again = success name=name1 lastSequenceId=-1
			producer 3 named px = error ProducerBusy
			publishers = 2
		`}},
		{name: "Unload", run: diffUnload, want: map[string]string{"": `
			unload status = 204
			closed by the broker = producers=1 consumers=1
			flows after unload = 40
			producers confirmed after unload = 1
			message after unload = L1:0
			current ledger after unload = L1(0)
			current ledger fields = entries,ledgerId,offloaded,size,underReplicated
		`}},
		{name: "MessageExpiry", run: diffMessageExpiry, want: map[string]string{"": `
			expire older than 1 s = status=204
			after expiry = backlog=1 totalMsgExpired=2
			cursor after expiry = markDelete=L0:1
			delivered after expiry = new-0
			expire on an unknown subscription = status=404
		`}},
		{name: "PriorityShared", run: diffPriorityShared, want: map[string]string{"": `
			received by level = level0=10 level1=0
			level-0 consumers served = high-a=true high-b=true
		`}},
		{name: "InitialSubscription", run: diffInitialSubscription, want: map[string]string{"": `
			subscriptions of the dead-letter topic before any consumer = dead
			backlog of the initial subscription = 1
			received by a consumer starting at Latest = m-0
		`}},
		{name: "ProducerAccessModes", run: diffProducerAccessModes, want: map[string]string{"": `
			exclusive = success ready=true epoch=e
			second exclusive = error ProducerFenced org.apache.pulsar.broker.service.BrokerServiceException$ProducerFencedException: Topic has an existing exclusive producer: excl
			shared = error ProducerBusy org.apache.pulsar.broker.service.BrokerServiceException$ProducerBusyException: Topic has an existing exclusive producer: excl
			wait for exclusive = success ready=false epoch=none
			wait for exclusive after the exclusive one closed = success ready=true epoch=e+1
			exclusive with fencing = success ready=true epoch=e+2
			the fenced producer = told=false, its next SEND closes the connection
			publishers = 1
		`}},
		{name: "AdminAsClientsSendIt", run: diffAdminAsClientsSendIt, want: map[string]string{"": `
			PUT partitions 0 as metadata = status=406
			PUT partitions as metadata = status=204
			PUT partitions as metadata again = status=409
			GET partitions = status=200 body={"partitions":2,"deleted":false,"properties":{"k":"v"}}
			partitioned-stats perPartition = status=200 partitions=persistent://public/default/admin-parts--partition-0 persistent://public/default/admin-parts--partition-1
			publisher metadata = absent
			publisher clientVersion = absent
			consumer metadata = absent
			consumer clientVersion = absent
			partitioned-stats?perPartition=true partition-0 publisher = metadata={"p":"1"} clientVersion="Pulsar-Go-version-unknown"
			partitioned-stats?perPartition=true partition-0 consumer = metadata={"c":"2"} clientVersion="Pulsar-Go-version-unknown"
			-partition-0/stats publisher = metadata={"p":"1"} clientVersion="Pulsar-Go-version-unknown"
			-partition-0/stats consumer = metadata={"c":"2"} clientVersion="Pulsar-Go-version-unknown"
			DELETE partitions with clients connected = status=412
			DELETE partitions = status=204
			GET partitions after DELETE = status=404 body={"reason":"Topic persistent://public/default/admin-parts- not found"}
			DELETE partitions again = status=404
			terminate = status=200 last=L0:1 body=batchIndex=-1 batchSize=0 entryId=1 ledgerId=L partitionIndex=-1
			new producer after terminate = true
			terminate again = status=200
			terminate a partitioned topic = status=405
		`}},
		{name: "MaxMessageSize", run: diffMaxMessageSize, want: map[string]string{"": `
			CONNECTED max_message_size = 5242880
			pulsar-client-go send of max_message_size + 1 bytes = message size exceeds MaxMessageSize: MessageTooBig
			SEND frame of max_message_size - 1 KiB = receipt
			SEND frame of max_message_size + 10 KiB - 3 (one byte over the decoder's limit) = connection closed, answer=none
			msgInCounter = 1
		`}},
		{name: "KeySharedHashRanges", run: diffKeySharedHashRanges,
			settings: map[string]string{"subscriptionKeySharedUseConsistentHashing": "false"},
			options:  func(o *Options) { o.KeySharedHashRanges = true },
			want: map[string]string{"": `
			keys to a b c = a c b b a a b a b b b a c a a b a c c a c c a c b a a c a b c a a b b c b b a b
			keys after b left = a c a a a a a a a a a a c a a a a c c a c c a c a a a c a a c a a a a c a a a a
			keys after b came back = a c b b a a b a b b b a c a a b a c c a c c a c b a a c a b c b a b b c b b a b
		`}},
		{name: "ReachedEndOfTopic", run: diffReachedEndOfTopic, want: map[string]string{"": `
			before terminate = done=0 pending=0
			after terminate = status=200 done=1 pending=0
			after the pending subscription's last ack = done=1 pending=1
			a new consumer of done, before FLOW = 0
			a new consumer of done, after two FLOWs = 1
			a new subscription from the earliest, delivered everything = 0
			a new subscription from the earliest, acked everything = 1-2
			pulsar-client-go consumer connected at terminate = told on each but the last of 3-4 subscriptions
		`}},
		{name: "PartitionsOfMissingTopic", run: diffPartitionsOfMissingTopic, want: map[string]string{"": `
			GET partitions = status=404 body={"reason":"Topic persistent://public/default/never-created- not found"}
			GET partitions?checkAllowAutoCreation=true = status=200 body={"partitions":0,"deleted":false}
			GET partitions?checkAllowAutoCreation=false = status=404 body={"reason":"Topic persistent://public/default/never-created- not found"}
			the topic after those calls = status=404
			GET partitions of a non-partitioned topic = status=200 body={"partitions":0,"deleted":false}
		`}},
		{name: "MessageTTLPolicy", run: diffMessageTTLPolicy, want: map[string]string{"": `
			GET unset = status=200 body=
			POST messageTTL=7 = status=204
			GET after POST = status=200 body=7
			GET applied = status=200 body=7
			POST messageTTL=-1 = status=412
			DELETE = status=204
			GET after DELETE = status=200 body=
			GET applied after DELETE = status=200 body=0
		`}},
	}
}

func subKind(k pulsar.SubscriptionType) string {
	switch k {
	case pulsar.Exclusive:
		return "exclusive"
	case pulsar.Shared:
		return "shared"
	case pulsar.Failover:
		return "failover"
	case pulsar.KeyShared:
		return "key_shared"
	}
	return "?"
}

// FLOW(receiver queue) after SUBSCRIBE, and permits debited per message: a
// batch of 4 costs 4.
func diffFlowPermits(tg *diffTarget, o *observation) {
	for _, kind := range []pulsar.SubscriptionType{pulsar.Exclusive, pulsar.Shared} {
		k := subKind(kind)
		topic := tg.topic("flow-" + k)
		f := wirerec.Filter{Topic: topic}
		cons := tg.subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Name: "c", Type: kind, ReceiverQueueSize: 40})
		tg.eventually("initial FLOW", func() bool { return tg.rec.Permits(f) > 0 })
		tg.sendN(tg.producer(topic, 0), "s", 1)
		tg.sendBatched(tg.producer(topic, 4), payloadsN("b", 4)...)
		tg.eventually("5 messages on the wire", func() bool { return tg.rec.Delivered(f) == 5 })
		cs := tg.consumerStats(topic, "sub", "c")
		o.set(k+" flows", "%s", tg.flows(f))
		o.set(k+" entries", "%s", tg.entries(f))
		o.set(k+" permits", "%d", cs.AvailablePermits)
		o.set(k+" consumer msgOut", "%d", cs.MsgOutCounter)
		o.set(k+" consumer unacked", "%d", cs.UnackedMessages)
		tg.receive(cons, 5, true)
		tg.eventually("acks applied", func() bool { return tg.subStats(topic, "sub").MsgBacklog == 0 })
		o.set(k+" flows after receiving 5 of 40", "%s", tg.flows(f))
	}
}

// A lost connection: the consumer subscribes again (same id, new
// connection), grants its whole queue again, and gets its unacked messages
// back without a redelivery count.
func diffReconnect(tg *diffTarget, o *observation) {
	topic := tg.topic("reconnect")
	f := wirerec.Filter{Topic: topic}
	cons := tg.subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Name: "c", Type: pulsar.Shared, ReceiverQueueSize: 40})
	tg.sendN(tg.producer(topic, 0), "m", 3)
	tg.receive(cons, 3, false)
	before := tg.rec.Consumers(f)
	mark := tg.rec.Mark()
	tg.rec.DropConnections()
	since := wirerec.Filter{Topic: topic, Since: mark}
	tg.eventually("re-subscribed and redelivered", func() bool { return tg.rec.Delivered(since) == 3 })
	after := tg.rec.Consumers(since)
	o.set("subscriptions before", "%d", len(before))
	same := len(after) > 0 && after[len(after)-1].ID == before[0].ID && after[len(after)-1].Conn != before[0].Conn
	o.set("same consumer id on a new connection", "%v", same)
	o.set("flows after reconnect", "%s", tg.flows(since))
	var counts []string
	for _, e := range tg.rec.Messages(since) {
		counts = append(counts, strconv.Itoa(int(e.RedeliveryCount)))
	}
	o.set("redelivery counts after reconnect", "%s", listOrNone(counts))
}

// Consumer.Seek: the broker closes the consumer (CLOSE_CONSUMER before it
// answers the SEEK), the client subscribes again with a fresh grant and the
// seek's entry is delivered again.
func diffSeek(tg *diffTarget, o *observation) {
	topic := tg.topic("seek")
	cons := tg.subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Name: "c", ReceiverQueueSize: 40})
	ids := tg.sendN(tg.producer(topic, 0), "m", 5)
	for _, id := range ids {
		tg.pos(id.LedgerID(), id.EntryID())
	}
	tg.receive(cons, 5, true)
	mark := tg.rec.Mark()
	if err := cons.Seek(ids[1]); err != nil {
		tg.t.Fatalf("%s: seek: %v", tg.name, err)
	}
	since := wirerec.Filter{Topic: topic, Since: mark}
	o.set("closed by the broker when the seek returned", "%d", len(tg.events(since, wirerec.FromBroker, pb.BaseCommand_CLOSE_CONSUMER)))
	tg.eventually("redelivered after the seek", func() bool { return tg.rec.Delivered(since) >= 4 })
	o.set("flows after seek", "%s", tg.flows(since))
	o.set("entries after seek", "%s", tg.entries(since))
}

// witness is a consumer of another topic on the client's connection to the
// broker: a request on it answered proves that whatever the broker queued
// on that connection before reached the recorder.
func (tg *diffTarget) witness() pulsar.Consumer {
	tg.t.Helper()
	return tg.subscribe(pulsar.ConsumerOptions{Topic: tg.topic("witness"), SubscriptionName: "witness", Name: "witness"})
}

func (tg *diffTarget) barrier(c pulsar.Consumer) {
	tg.t.Helper()
	if err := tg.rec.Barrier(c); err != nil {
		tg.t.Fatalf("%s: %v", tg.name, err)
	}
}

// resetCursor posts a reset to the start of the subscription.
func (tg *diffTarget) resetTo(topic, sub string, id pulsar.MessageID, extra string) int {
	tg.t.Helper()
	body := fmt.Sprintf(`{"ledgerId":%d,"entryId":%d%s}`, id.LedgerID(), id.EntryID(), extra)
	status, _, _ := tg.call(http.MethodPost, topic+"/subscription/"+sub+"/resetcursor", body)
	return status
}

// subscribeAB subscribes consumers "a" and "b" of the given kind to subscription "sub".
func (tg *diffTarget) subscribeAB(topic string, kind pulsar.SubscriptionType) map[string]pulsar.Consumer {
	consumers := map[string]pulsar.Consumer{}
	for _, name := range []string{"a", "b"} {
		consumers[name] = tg.subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Name: name, Type: kind, ReceiverQueueSize: 40})
	}
	return consumers
}

// resetObserved resets subscription "sub" of topic to id and observes the answer's status and
// the consumers the broker closed before the answer to a request sent after the reset
// returned. It returns the wire's mark from just before the reset, and closed: the consumers
// (as label names them) the broker has closed since.
func (tg *diffTarget) resetObserved(o *observation, topic string, id pulsar.MessageID, label func(consumer string) string) (mark wirerec.Mark, closed func() string) {
	tg.t.Helper()
	witness := tg.witness()
	mark = tg.rec.Mark()
	since := wirerec.Filter{Topic: topic, Since: mark}
	o.set("reset status", "%d", tg.resetTo(topic, "sub", id, ""))
	closed = func() string {
		var names []string
		for _, e := range tg.events(since, wirerec.FromBroker, pb.BaseCommand_CLOSE_CONSUMER) {
			names = append(names, label(e.Consumer.Name))
		}
		slices.Sort(names)
		return listOrNone(names)
	}
	tg.barrier(witness)
	o.set("closed before the answer to a request sent after the reset returned", "%s", closed())
	return mark, closed
}

// Reset-cursor on Shared closes every consumer, before the call returns.
func diffResetShared(tg *diffTarget, o *observation) {
	topic := tg.topic("reset-shared")
	f := wirerec.Filter{Topic: topic}
	consumers := tg.subscribeAB(topic, pulsar.Shared)
	tg.eventually("both granted", func() bool { return len(tg.rec.Flows(f)) >= 2 })
	ids := tg.sendN(tg.producer(topic, 0), "m", 3)
	tg.drain(consumers, 3)
	tg.eventually("acks applied", func() bool { return tg.subStats(topic, "sub").MsgBacklog == 0 })
	mark, closed := tg.resetObserved(o, topic, ids[0], func(name string) string { return name })
	since := wirerec.Filter{Topic: topic, Since: mark}
	tg.eventually("both re-subscribed and the 3 messages redelivered", func() bool {
		names := map[string]bool{}
		for _, e := range tg.rec.Flows(since) {
			names[e.Consumer.Name] = true
		}
		return len(names) == 2 && tg.rec.Delivered(since) == 3
	})
	o.set("closed", "%s", closed())
	o.set("redelivered", "%d", tg.rec.Delivered(since))
}

// activeNow is the name the last ACTIVE_CONSUMER_CHANGE(true) of the topic
// (partition) named.
func (tg *diffTarget) activeNow(f wirerec.Filter) string {
	active := ""
	for _, e := range tg.events(f, wirerec.FromBroker, pb.BaseCommand_ACTIVE_CONSUMER_CHANGE) {
		if e.Active {
			active = e.Consumer.Name
		}
	}
	return active
}

// Reset-cursor on Failover closes only the active consumer; the standby is
// neither closed nor told.
func diffResetFailover(tg *diffTarget, o *observation) {
	topic := tg.topic("reset-fo")
	f := wirerec.Filter{Topic: topic}
	consumers := tg.subscribeAB(topic, pulsar.Failover)
	tg.eventually("an active consumer", func() bool { return tg.activeNow(f) != "" })
	active := tg.activeNow(f)
	standby := map[string]string{"a": "b", "b": "a"}[active]
	role := map[string]string{active: "active", standby: "standby"}
	ids := tg.sendN(tg.producer(topic, 0), "m", 3)
	tg.receive(consumers[active], 3, true)
	tg.eventually("acks applied", func() bool { return tg.subStats(topic, "sub").MsgBacklog == 0 })
	mark, closed := tg.resetObserved(o, topic, ids[0], func(name string) string { return role[name] })
	since := wirerec.Filter{Topic: topic, Since: mark}
	tg.eventually("the active consumer got the 3 messages again", func() bool {
		return tg.rec.Delivered(wirerec.Filter{Topic: topic, Since: mark, ConsumerName: active}) == 3
	})
	o.set("closed", "%s", closed())
	var flows []string
	for _, e := range tg.rec.Flows(since) {
		flows = append(flows, role[e.Consumer.Name])
	}
	o.set("flows after reset from", "%s", listOrNone(flows))
	var changes []string
	for _, e := range tg.events(since, wirerec.FromBroker, pb.BaseCommand_ACTIVE_CONSUMER_CHANGE) {
		changes = append(changes, fmt.Sprintf("%s=%v", role[e.Consumer.Name], e.Active))
	}
	slices.Sort(changes) // the broker tells the consumers in no fixed order
	o.set("active consumer changes after reset", "%s", listOrNone(changes))
	o.set("redelivered to", "%s", role[tg.activeNow(f)])
}

// A grant of N permits delivers whole entries: N entries on Exclusive and
// Failover (at most 100 per read), N / average batch size on Shared.
func diffBatchDispatch(tg *diffTarget, o *observation) {
	for _, tc := range []struct {
		name             string
		kind             pb.CommandSubscribe_SubType
		batch, entries   int
		permits          uint32
		expectDispatches bool
	}{
		{"exclusive 2 permits, batches of 10", pb.CommandSubscribe_Exclusive, 10, 5, 2, true},
		{"failover 2 permits, batches of 10", pb.CommandSubscribe_Failover, 10, 5, 2, true},
		{"shared 2 permits, batches of 10", pb.CommandSubscribe_Shared, 10, 5, 2, true},
		{"exclusive 150 permits, batches of 2", pb.CommandSubscribe_Exclusive, 2, 150, 150, true},
		{"shared 150 permits, batches of 2", pb.CommandSubscribe_Shared, 2, 150, 150, true},
	} {
		topic := tg.topic(fmt.Sprintf("batches-%s-%d", strings.ToLower(tc.kind.String()), tc.permits))
		tg.sendBatched(tg.producer(topic, tc.batch), payloadsN("m", tc.batch*tc.entries)...)
		rc := tg.raw()
		rc.subscribe(fullName(topic), "sub", tc.kind, 1)
		if tc.kind == pb.CommandSubscribe_Failover {
			// The failover delay passes before the first dispatch.
			rc.await("active consumer change", func(c *pb.BaseCommand) bool { return c.GetType() == pb.BaseCommand_ACTIVE_CONSUMER_CHANGE })
		}
		rc.flow(1, tc.permits)
		f := wirerec.Filter{Topic: topic}
		var cs diffConsumerStats
		tg.eventually("the grant spent", func() bool {
			cs = tg.consumerStats(topic, "sub", "raw-1")
			return cs.MsgOutCounter > 0 && cs.AvailablePermits <= 0 && tg.rec.Delivered(f) == int(cs.MsgOutCounter)
		})
		o.set(tc.name, "%s permits=%d", tg.batchSizes(f), cs.AvailablePermits)
	}
}

// Failover: the active consumer is chosen by name (partition index mod
// consumers on a partition, a hash ring probed with the topic name
// otherwise), ACTIVE_CONSUMER_CHANGE tells each consumer, and a change of
// active consumer takes effect after the 1 s failover delay.
func diffFailoverActive(tg *diffTarget, o *observation) {
	// Non-partitioned: pick names such that the model chooses the second
	// one to join for this (run-unique) topic name.
	topic := tg.topic("fo")
	var first, second string
	for i := 0; ; i++ {
		first, second = fmt.Sprintf("f%d", i), fmt.Sprintf("s%d", i)
		if failoverIndex([]*consumer{{name: first}, {name: second}}, 2, -1, fullName(topic)) == 1 {
			break
		}
	}
	role := map[string]string{first: "first", second: "second"}
	tg.failoverJoins(o, "non-partitioned", topic, []string{first, second}, role)

	parts := tg.topic("fo-parts")
	tg.createPartitioned(parts, 2)
	tg.failoverJoins(o, "partitioned", parts, []string{"a", "b"}, map[string]string{"a": "a", "b": "b"})
}

// failoverJoins subscribes the consumers one after the other, each once the
// previous one's ACTIVE_CONSUMER_CHANGE arrived, and records per (partition)
// topic what the broker told whom after each SUBSCRIBE, and how late.
func (tg *diffTarget) failoverJoins(o *observation, label, topic string, names []string, role map[string]string) {
	for i, name := range names {
		mark := tg.rec.Mark()
		tg.subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Name: name, Type: pulsar.Failover, ReceiverQueueSize: 10})
		since := wirerec.Filter{Topic: topic, Since: mark}
		// Settled: every consumer so far has heard after this SUBSCRIBE, or
		// the failover delay has long passed.
		tg.poll(3*time.Second, func() bool {
			heard := map[string]bool{}
			for _, e := range tg.events(since, wirerec.FromBroker, pb.BaseCommand_ACTIVE_CONSUMER_CHANGE) {
				heard[e.Consumer.Topic+"/"+e.Consumer.Name] = true
			}
			return len(heard) == (i+1)*max(1, partitionsOfName(topic))
		})
		subs := map[string]time.Time{}
		for _, e := range tg.events(since, wirerec.FromClient, pb.BaseCommand_SUBSCRIBE) {
			if _, ok := subs[e.Consumer.Topic]; !ok {
				subs[e.Consumer.Topic] = e.Time
			}
		}
		byTopic := map[string][]string{}
		for _, e := range tg.events(since, wirerec.FromBroker, pb.BaseCommand_ACTIVE_CONSUMER_CHANGE) {
			when := "at once"
			if e.Time.Sub(subs[e.Consumer.Topic]) >= 800*time.Millisecond {
				when = "after the delay"
			}
			byTopic[e.Consumer.Topic] = append(byTopic[e.Consumer.Topic], fmt.Sprintf("%s=%v %s", role[e.Consumer.Name], e.Active, when))
		}
		for _, tp := range slices.Sorted(mapKeys(subs)) {
			short := strings.TrimPrefix(tp, fullName(topic))
			o.set(fmt.Sprintf("%s%s: %s joins", label, short, role[name]), "%s", listOrNone(byTopic[tp]))
		}
	}
}

// partitionsOfName tells the partition count the scenario gave a topic.
func partitionsOfName(topic string) int {
	if strings.HasPrefix(topic, "fo-parts-") {
		return 2
	}
	return 0
}

// Key_Shared: keys map to consumers by consumer name, and a consumer that
// comes back under the same name gets the same keys.
func diffKeyShared(tg *diffTarget, o *observation) {
	topic := tg.topic("ks")
	f := wirerec.Filter{Topic: topic}
	consumers := map[string]pulsar.Consumer{}
	for _, name := range []string{"k1", "k2", "k3"} {
		consumers[name] = tg.subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Name: name, Type: pulsar.KeyShared, ReceiverQueueSize: 100})
	}
	tg.eventually("all granted", func() bool { return len(tg.rec.Flows(f)) >= 3 })
	p := tg.producer(topic, 0)
	round := func(label string) {
		var msgs []*pulsar.ProducerMessage
		for i := range 24 {
			msgs = append(msgs, &pulsar.ProducerMessage{Key: fmt.Sprintf("key-%d", i), Payload: fmt.Appendf(nil, "key-%d", i)})
		}
		tg.send(p, msgs...)
		got := tg.drain(consumers, len(msgs))
		var parts []string
		for i := range msgs {
			parts = append(parts, got[fmt.Sprintf("key-%d", i)])
		}
		o.set(label, "%s", strings.Join(parts, " "))
	}
	round("keys to consumers")
	tg.eventually("acks applied", func() bool { return tg.subStats(topic, "sub").MsgBacklog == 0 })
	consumers["k2"].Close()
	mark := tg.rec.Mark()
	consumers["k2"] = tg.subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Name: "k2", Type: pulsar.KeyShared, ReceiverQueueSize: 100})
	tg.eventually("k2 back", func() bool { return len(tg.rec.Flows(wirerec.Filter{Topic: topic, Since: mark})) > 0 })
	round("keys after k2 came back")
}

// The redelivery count grows with nacks only, on Shared; Exclusive always
// sends 0. A closed consumer's messages keep their count when another
// consumer is there to take them; with the last consumer gone the counts
// are dropped.
func diffRedeliveryCount(tg *diffTarget, o *observation) {
	topic := tg.topic("redeliver-handover")
	f := wirerec.Filter{Topic: topic}
	opts := pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Name: "a", Type: pulsar.Shared, ReceiverQueueSize: 40, NackRedeliveryDelay: 100 * time.Millisecond}
	first := tg.subscribe(opts)
	tg.sendN(tg.producer(topic, 0), "m", 1)
	for range 2 {
		first.Nack(tg.receive(first, 1, false)[0])
	}
	tg.receive(first, 1, false)
	opts.Name = "b"
	second := tg.subscribe(opts)
	tg.eventually("b granted", func() bool { return tg.rec.Permits(wirerec.Filter{Topic: topic, ConsumerName: "b"}) > 0 })
	first.Close()
	tg.receive(second, 1, true)
	var counts []string
	for _, e := range tg.rec.Messages(f) {
		counts = append(counts, e.Consumer.Name+"="+strconv.Itoa(int(e.RedeliveryCount)))
	}
	o.set("shared redelivery counts: nack, nack, a closes while b is there", "%s", listOrNone(counts))

	for _, kind := range []pulsar.SubscriptionType{pulsar.Shared, pulsar.Exclusive} {
		k := subKind(kind)
		topic := tg.topic("redeliver-" + k)
		f := wirerec.Filter{Topic: topic}
		opts := pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Name: "c", Type: kind, ReceiverQueueSize: 40, NackRedeliveryDelay: 100 * time.Millisecond}
		cons := tg.subscribe(opts)
		tg.sendN(tg.producer(topic, 0), "m", 1)
		for range 2 {
			cons.Nack(tg.receive(cons, 1, false)[0])
		}
		tg.receive(cons, 1, false)
		cons.Close() // its unacked message returns to the subscription
		cons = tg.subscribe(opts)
		tg.receive(cons, 1, true)
		var counts []string
		for _, e := range tg.rec.Messages(f) {
			counts = append(counts, strconv.Itoa(int(e.RedeliveryCount)))
		}
		o.set(k+" redelivery counts: nack, nack, close, reopen", "%s", listOrNone(counts))
	}
}

// A cumulative ack on Shared is ignored; on Exclusive it acknowledges the
// prefix. pulsar-client-go refuses to send one on Shared: a raw client does.
func diffCumulativeAck(tg *diffTarget, o *observation) {
	for _, kind := range []pb.CommandSubscribe_SubType{pb.CommandSubscribe_Shared, pb.CommandSubscribe_Exclusive} {
		k := strings.ToLower(kind.String())
		topic := tg.topic("cumulative-" + k)
		ids := tg.sendN(tg.producer(topic, 0), "m", 3)
		rc := tg.raw()
		rc.subscribe(fullName(topic), "sub", kind, 1)
		rc.flow(1, 10)
		tg.eventually("3 messages on the wire", func() bool { return tg.rec.Delivered(wirerec.Filter{Topic: topic}) == 3 })
		ack := func(reqID uint64, typ pb.CommandAck_AckType, id pulsar.MessageID) {
			rc.send(&pb.BaseCommand{Type: pb.BaseCommand_ACK.Enum(), Ack: &pb.CommandAck{
				ConsumerId: proto.Uint64(1), AckType: typ.Enum(), MessageId: []*pb.MessageIdData{messageIDData(id)}, RequestId: proto.Uint64(reqID),
			}})
		}
		ack(50, pb.CommandAck_Cumulative, ids[1])
		ack(51, pb.CommandAck_Individual, ids[2])
		answered := func() map[uint64]bool {
			rc.mu.Lock()
			defer rc.mu.Unlock()
			got := map[uint64]bool{}
			for _, c := range rc.frames {
				if c.GetType() == pb.BaseCommand_ACK_RESPONSE {
					got[c.GetAckResponse().GetRequestId()] = true
				}
			}
			return got
		}
		// The broker answers an ack once it is handled; the backlog then
		// follows (a cumulative ack that counts takes it to 0).
		tg.poll(3*time.Second, func() bool { return len(answered()) == 2 })
		got := answered()
		tg.poll(3*time.Second, func() bool {
			n := tg.subStats(topic, "sub").MsgBacklog
			return n == 0 || n <= 2 && kind == pb.CommandSubscribe_Shared
		})
		o.set(k+" backlog after cumulative ack of the 2nd and ack of the 3rd", "%d", tg.subStats(topic, "sub").MsgBacklog)
		o.set(k+" ack responses", "cumulative=%v individual=%v", got[50], got[51])
	}
}

// ResetCursorData: "excluded" is the body field the broker reads;
// "isExcluded" is ignored; a partitioned topic's base name answers 405.
func diffResetCursorBody(tg *diffTarget, o *observation) {
	topic := tg.topic("reset-body")
	cons := tg.subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Name: "c"})
	ids := tg.sendN(tg.producer(topic, 0), "m", 5)
	tg.receive(cons, 5, true)
	cons.Close()
	tg.eventually("acks applied", func() bool { return tg.subStats(topic, "sub").MsgBacklog == 0 })
	for _, tc := range []struct{ label, extra string }{
		{`"excluded":true`, `,"excluded":true`},
		{`"isExcluded":true`, `,"isExcluded":true`},
		{`no flag`, ``},
		{`"excluded":false`, `,"excluded":false`},
	} {
		status := tg.resetTo(topic, "sub", ids[2], tc.extra)
		st := tg.internalStats(topic).Cursors["sub"]
		o.set("reset to the 3rd, "+tc.label, "status=%d backlog=%d markDelete=%s read=%s", status, tg.subStats(topic, "sub").MsgBacklog,
			tg.position(st.MarkDeletePosition), tg.position(st.ReadPosition))
	}
	status, _, _ := tg.call(http.MethodPost, topic+"/subscription/nosuch/resetcursor", fmt.Sprintf(`{"ledgerId":%d,"entryId":0}`, ids[0].LedgerID()))
	o.set("reset of an unknown subscription", "status=%d", status)

	parts := tg.topic("reset-parts")
	tg.createPartitioned(parts, 2)
	pc := tg.subscribe(pulsar.ConsumerOptions{Topic: parts, SubscriptionName: "sub", Name: "c"})
	pids := tg.sendN(tg.producer(parts, 0), "m", 2)
	tg.receive(pc, 2, true)
	body := fmt.Sprintf(`{"ledgerId":%d,"entryId":%d}`, pids[0].LedgerID(), pids[0].EntryID())
	status, _, _ = tg.call(http.MethodPost, parts+"/subscription/sub/resetcursor", body)
	o.set("reset of a partitioned base name", "status=%d", status)
	status, _, _ = tg.call(http.MethodPost, fmt.Sprintf("%s-partition-%d/subscription/sub/resetcursor", parts, pids[0].PartitionIdx()), body)
	o.set("reset of its partition", "status=%d", status)
}

// getMessageIdByIndex (PIP-415, 4.2): the entry holding an index; -1:-1 for
// an index of the first entry other than its last; 404 past the end and on
// an empty topic; 405 on a partitioned base name. 4.0 has no such endpoint.
func diffMessageIDByIndex(tg *diffTarget, o *observation) {
	topic := tg.topic("by-index")
	ids := tg.sendBatched(tg.producer(topic, 3), payloadsN("a", 3)...)
	tg.sendBatched(tg.producer(topic, 3), payloadsN("b", 3)...)
	tg.sendN(tg.producer(topic, 0), "c", 1)
	tg.ledger(ids[0].LedgerID())
	query := func(tp string, index int) string {
		status, body, _ := tg.call(http.MethodGet, fmt.Sprintf("%s/getMessageIdByIndex?index=%d", tp, index), "")
		if status != http.StatusOK {
			return fmt.Sprintf("status=%d", status)
		}
		var m map[string]json.Number
		d := json.NewDecoder(strings.NewReader(string(body)))
		d.UseNumber()
		if err := d.Decode(&m); err != nil {
			return fmt.Sprintf("status=%d body=%s", status, body)
		}
		out := map[string]string{}
		for k, v := range m {
			out[k] = v.String()
		}
		if l, err := strconv.ParseInt(out["ledgerId"], 10, 64); err == nil {
			out["ledgerId"] = tg.ledger(l)
		}
		return fmt.Sprintf("status=%d %s", status, sortedJoin(out))
	}
	for _, index := range []int{0, 1, 2, 3, 5, 6, 7} {
		o.set(fmt.Sprintf("index %d", index), "%s", query(topic, index))
	}
	empty := tg.topic("by-index-empty")
	tg.producer(empty, 0)
	o.set("index 0 of an empty topic", "%s", query(empty, 0))
	parts := tg.topic("by-index-parts")
	tg.createPartitioned(parts, 2)
	tg.producer(parts, 0)
	o.set("index 0 of a partitioned base name", "%s", query(parts, 0))
}

// /stats on a partitioned topic's base name, partitioned-stats, and a
// partition's stats.
func diffPartitionedStats(tg *diffTarget, o *observation) {
	parts := tg.topic("stats-parts")
	tg.createPartitioned(parts, 2)
	tg.subscribe(pulsar.ConsumerOptions{Topic: parts, SubscriptionName: "sub", Name: "c"})
	tg.sendN(tg.producer(parts, 0), "m", 4)
	for _, path := range []string{"/stats", "/partitioned-stats", "-partition-0/stats", "/internalStats", "/partitions"} {
		status, body, _ := tg.call(http.MethodGet, parts+path, "")
		o.set("GET "+path, "status=%d", status)
		if status == http.StatusOK && path == "/partitioned-stats" {
			var st diffTopicStats
			_ = json.Unmarshal(body, &st)
			o.set("partitioned-stats msgInCounter", "%d", st.MsgInCounter)
			o.set("partitioned-stats subscriptions", "%s", strings.Join(slices.Sorted(mapKeys(st.Subscriptions)), ","))
		}
		if status == http.StatusOK && path == "/partitions" {
			o.set("partitions body", "%s", strings.TrimSpace(string(body)))
		}
	}
	status, _, _ := tg.call(http.MethodGet, tg.topic("no-such-topic")+"/stats", "")
	o.set("GET /stats of a missing topic", "status=%d", status)
}

// Field names of internalStats: the topic, its ledgers and cursors.
func diffInternalStatsFields(tg *diffTarget, o *observation) {
	topic := tg.topic("internal")
	cons := tg.subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Name: "c"})
	tg.sendN(tg.producer(topic, 0), "m", 4)
	msgs := tg.receive(cons, 4, false)
	for _, i := range []int{0, 2} {
		if err := cons.Ack(msgs[i]); err != nil {
			tg.t.Fatal(err)
		}
	}
	tg.eventually("the acks applied", func() bool { return tg.subStats(topic, "sub").MsgBacklog == 2 })
	status, body, _ := tg.call(http.MethodGet, topic+"/internalStats", "")
	o.set("status", "%d", status)
	var top map[string]json.RawMessage
	_ = json.Unmarshal(body, &top)
	o.set("topic fields", "%s", jsonKeys(body))
	var ledgers []json.RawMessage
	_ = json.Unmarshal(top["ledgers"], &ledgers)
	for i, l := range ledgers {
		o.set(fmt.Sprintf("ledger %d fields", i), "%s", jsonKeys(l))
	}
	var cursors map[string]json.RawMessage
	_ = json.Unmarshal(top["cursors"], &cursors)
	o.set("cursor fields", "%s", jsonKeys(cursors["sub"]))
	st := tg.internalStats(topic)
	o.set("entries", "numberOfEntries=%d currentLedgerEntries=%d lastConfirmedEntry=%s ledgers=%s",
		st.NumberOfEntries, st.CurrentLedgerEntries, tg.position(st.LastConfirmedEntry), tg.ledgerList(st))
	c := st.Cursors["sub"]
	o.set("cursor", "markDelete=%s read=%s", tg.position(c.MarkDeletePosition), tg.position(c.ReadPosition))
	for _, k := range []string{"properties", "schemaLedgers", "compactedLedger", "state", "waitingCursorsCount", "pendingAddEntriesCount", "entriesAddedCounter"} {
		o.set("topic "+k, "%s", top[k])
	}
	var cur map[string]json.RawMessage
	_ = json.Unmarshal(cursors["sub"], &cur)
	// cursorLedger and cursorLedgerLastEntry are BookKeeper's (the cursor's
	// own ledger, switched as mark-delete positions are persisted): not
	// compared.
	for _, k := range []string{"subscriptionHavePendingRead", "subscriptionHavePendingReplayRead", "state", "active", "waitingReadOp", "pendingReadOps",
		"messagesConsumedCounter", "individuallyDeletedMessages", "numberOfEntriesSinceFirstNotAckedMessage",
		"totalNonContiguousDeletedMessagesRange", "properties"} {
		v := string(cur[k])
		if k == "state" && v == `"SwitchingLedger"` {
			v = `"Open"` // a real cursor switching its ledger is open too
		}
		if k == "individuallyDeletedMessages" {
			v = tg.rangeSet(v)
		}
		o.set("cursor "+k, "%s", v)
	}
	o.set("cursor lastLedgerSwitchTimestamp", "%s", timeShape(cur["lastLedgerSwitchTimestamp"]))
	o.set("topic lastLedgerCreatedTimestamp", "%s", timeShape(top["lastLedgerCreatedTimestamp"]))
}

// timeShape tells whether a JSON value is a string holding an RFC 3339 time.
func timeShape(raw json.RawMessage) string {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "not a string: " + string(raw)
	}
	if _, err := time.Parse(time.RFC3339Nano, s); err != nil {
		return "not RFC 3339: " + s
	}
	return "(RFC 3339 time)"
}

// get-message-by-id: the headers of a batch entry and of a single message.
func diffEntryHeaders(tg *diffTarget, o *observation) {
	topic := tg.topic("entry")
	msgs := payloadsN("b", 3)
	for _, m := range msgs {
		m.Key = "k"
		m.Properties = map[string]string{"p": "v"}
	}
	ids := tg.sendBatched(tg.producer(topic, 3), msgs...)
	single := tg.sendN(tg.producer(topic, 0), "s", 1)
	for _, tc := range []struct {
		label string
		id    pulsar.MessageID
	}{{"batch entry", ids[0]}, {"single entry", single[0]}} {
		status, body, h := tg.call(http.MethodGet, fmt.Sprintf("%s/ledger/%d/entry/%d", topic, tc.id.LedgerID(), tc.id.EntryID()), "")
		o.set(tc.label+" status", "%d", status)
		o.set(tc.label+" body bytes", "%d", len(body))
		for _, name := range slices.Sorted(mapKeys(h)) {
			if !strings.HasPrefix(strings.ToLower(name), "x-pulsar-") {
				continue
			}
			o.set(tc.label+" header "+name, "%s", tg.headerValue(name, h.Get(name)))
		}
	}
	status, _, _ := tg.call(http.MethodGet, fmt.Sprintf("%s/ledger/%d/entry/%d", topic, ids[0].LedgerID(), 99), "")
	o.set("missing entry status", "%d", status)
}

func (tg *diffTarget) headerValue(name, v string) string {
	switch strings.ToLower(name) {
	case "x-pulsar-message-id":
		return tg.position(v)
	case "x-pulsar-producer-name":
		return "(name)"
	case "x-pulsar-publish-time", "x-pulsar-broker-entry-metadata-timestamp":
		if _, err := time.Parse(time.RFC3339Nano, v); err != nil {
			return "not RFC 3339: " + v
		}
		return "(RFC 3339 time)"
	}
	return v
}

// GetLastMessageId on a topic without entries: entry -1 of the open ledger.
func diffLastMessageID(tg *diffTarget, o *observation) {
	topic := tg.topic("last-id")
	cons := tg.subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Name: "c"})
	st := tg.internalStats(topic)
	o.set("empty: ledgers", "%s", tg.ledgerList(st))
	o.set("empty: lastConfirmedEntry", "%s", tg.position(st.LastConfirmedEntry))
	last := func() string {
		ids, err := cons.GetLastMessageIDs()
		if err != nil || len(ids) != 1 {
			tg.t.Fatalf("%s: last message ids %v: %v", tg.name, ids, err)
		}
		id := ids[0]
		return fmt.Sprintf("%s batch=%d partition=%d", tg.pos(id.LedgerID(), id.EntryID()), id.BatchIdx(), id.PartitionIdx())
	}
	o.set("empty: last message id", "%s", last())
	tg.sendN(tg.producer(topic, 0), "m", 1)
	o.set("one message: last message id", "%s", last())
	tg.sendBatched(tg.producer(topic, 3), payloadsN("b", 3)...)
	o.set("then a batch of 3: last message id", "%s", last())
}

// PRODUCER repeated on a connection for the same producer id is answered
// with the same producer; another producer of the same name is refused.
func diffProducerIdempotence(tg *diffTarget, o *observation) {
	topic := tg.topic("producers")
	status, _, _ := tg.call(http.MethodPut, topic, "")
	o.set("create topic", "status=%d", status)
	status, _, _ = tg.call(http.MethodPut, topic, "")
	o.set("create it again", "status=%d", status)
	rc := tg.raw()
	names := map[string]string{}
	producer := func(reqID, producerID uint64, name string) string {
		cmd := &pb.CommandProducer{Topic: proto.String(fullName(topic)), ProducerId: proto.Uint64(producerID), RequestId: proto.Uint64(reqID)}
		if name != "" {
			cmd.ProducerName = proto.String(name)
		}
		rc.send(&pb.BaseCommand{Type: pb.BaseCommand_PRODUCER.Enum(), Producer: cmd})
		resp := rc.await("producer answer", func(c *pb.BaseCommand) bool {
			return c.GetProducerSuccess().GetRequestId() == reqID || c.GetError().GetRequestId() == reqID && c.GetType() == pb.BaseCommand_ERROR
		})
		if resp.GetType() == pb.BaseCommand_ERROR {
			return "error " + resp.GetError().GetError().String()
		}
		ps := resp.GetProducerSuccess()
		got := ps.GetProducerName()
		label, ok := names[got]
		if !ok {
			label = "name" + strconv.Itoa(len(names))
			if got == name {
				label = name
			}
			names[got] = label
		}
		out := "success name=" + label
		if ps.LastSequenceId != nil {
			out += fmt.Sprintf(" lastSequenceId=%d", ps.GetLastSequenceId())
		}
		return out
	}
	o.set("producer 1 named px", "%s", producer(1, 1, "px"))
	o.set("producer 1 named px again", "%s", producer(2, 1, "px"))
	o.set("producer 2 unnamed", "%s", producer(3, 2, ""))
	o.set("producer 2 unnamed again", "%s", producer(4, 2, ""))
	o.set("producer 3 named px", "%s", producer(5, 3, "px"))
	var st struct {
		Publishers []json.RawMessage `json:"publishers"`
	}
	tg.getJSON(topic+"/stats", &st)
	o.set("publishers", "%d", len(st.Publishers))
}

// Unload closes the topic's producers and consumers; they come back, the
// consumer with a fresh grant, and the topic writes to a new ledger.
func diffUnload(tg *diffTarget, o *observation) {
	topic := tg.topic("unload")
	cons := tg.subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Name: "c", ReceiverQueueSize: 40})
	p := tg.producer(topic, 0)
	before := tg.sendN(p, "m", 2)
	tg.receive(cons, 2, true)
	tg.ledger(before[0].LedgerID())
	mark := tg.rec.Mark()
	status, _, _ := tg.call(http.MethodPut, topic+"/unload", "")
	o.set("unload status", "%d", status)
	since := wirerec.Filter{Since: mark}
	tg.eventually("producer and consumer closed", func() bool {
		return len(tg.events(since, wirerec.FromBroker, pb.BaseCommand_CLOSE_PRODUCER)) > 0 && len(tg.events(since, wirerec.FromBroker, pb.BaseCommand_CLOSE_CONSUMER)) > 0
	})
	tg.eventually("consumer and producer back", func() bool {
		return tg.rec.Permits(wirerec.Filter{Topic: topic, Since: mark}) > 0 && len(tg.events(since, wirerec.FromBroker, pb.BaseCommand_PRODUCER_SUCCESS)) > 0
	})
	// Another producer sends: pulsar-client-go v0.21 races (-race) between
	// a reconnecting producer's grabCnx and its sends.
	after := tg.sendN(tg.producer(topic, 0), "n", 1)
	tg.receive(cons, 1, true)
	o.set("closed by the broker", "producers=%d consumers=%d",
		len(tg.events(since, wirerec.FromBroker, pb.BaseCommand_CLOSE_PRODUCER)), len(tg.events(since, wirerec.FromBroker, pb.BaseCommand_CLOSE_CONSUMER)))
	o.set("flows after unload", "%s", tg.flows(wirerec.Filter{Topic: topic, Since: mark}))
	o.set("producers confirmed after unload", "%d", len(tg.events(since, wirerec.FromBroker, pb.BaseCommand_PRODUCER_SUCCESS))-1)
	o.set("message after unload", "%s", tg.pos(after[0].LedgerID(), after[0].EntryID()))
	// Only the ledger written now: Pulsar deletes the closed one in the background once every
	// subscription has consumed it (retention 0), so whether it is still listed is a race.
	st := tg.internalStats(topic)
	if n := len(st.Ledgers); n > 0 {
		o.set("current ledger after unload", "%s", tg.ledgerList(diffInternalStats{Ledgers: st.Ledgers[n-1:]}))
	}
	_, body, _ := tg.call(http.MethodGet, topic+"/internalStats", "")
	var top struct {
		Ledgers []json.RawMessage `json:"ledgers"`
	}
	_ = json.Unmarshal(body, &top)
	if n := len(top.Ledgers); n > 0 {
		o.set("current ledger fields", "%s", jsonKeys(top.Ledgers[n-1]))
	}
}

// rangeSet normalises the positions of a printed range set such as
// "[(5:1..5:2]]".
func (tg *diffTarget) rangeSet(s string) string {
	var out strings.Builder
	token := strings.Builder{}
	flush := func() {
		if token.Len() > 0 {
			out.WriteString(tg.position(token.String()))
			token.Reset()
		}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= '0' && c <= '9' || c == ':' || c == '-' {
			token.WriteByte(c)
			continue
		}
		flush()
		out.WriteByte(c)
	}
	flush()
	return out.String()
}

// Message expiry (PersistentMessageExpiryMonitor) mark-deletes up to the
// newest entry older than the TTL: those messages leave the backlog and
// are never dispatched. The broker runs it every minute with the applied
// messageTTL; expireMessages runs the same monitor at once, which keeps
// this scenario short.
func diffMessageExpiry(tg *diffTarget, o *observation) {
	topic := tg.topic("expiry")
	tg.subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Name: "c"}).Close()
	p := tg.producer(topic, 0)
	old := tg.sendN(p, "old", 2)
	tg.ledger(old[0].LedgerID())
	// The old messages must be more than a second old, by the clock of
	// whoever timestamps them (the broker, or the producer on this host).
	sentAt := time.Now()
	tg.eventually("a second passes", func() bool { return time.Since(sentAt) > 1100*time.Millisecond })
	tg.sendN(p, "new", 1)
	status, _, _ := tg.call(http.MethodPost, topic+"/subscription/sub/expireMessages/1", "")
	o.set("expire older than 1 s", "status=%d", status)
	tg.poll(3*time.Second, func() bool { st := tg.subStats(topic, "sub"); return st.MsgBacklog < 3 && st.TotalMsgExpired > 0 })
	st := tg.subStats(topic, "sub")
	o.set("after expiry", "backlog=%d totalMsgExpired=%d", st.MsgBacklog, st.TotalMsgExpired)
	c := tg.internalStats(topic).Cursors["sub"]
	o.set("cursor after expiry", "markDelete=%s", tg.position(c.MarkDeletePosition))
	cons := tg.subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Name: "c"})
	got := tg.receive(cons, 1, true)
	o.set("delivered after expiry", "%s", got[0].Payload())
	status, _, _ = tg.call(http.MethodPost, topic+"/subscription/nosuch/expireMessages/1", "")
	o.set("expire on an unknown subscription", "status=%d", status)
}

// The topic-level messageTTL policy over REST: unset, set, read back
// (topic policies reach the broker asynchronously), applied, removed.
func diffMessageTTLPolicy(tg *diffTarget, o *observation) {
	topic := tg.topic("ttl")
	tg.producer(topic, 0)
	get := func(query string) string {
		status, body, _ := tg.call(http.MethodGet, topic+"/messageTTL"+query, "")
		return fmt.Sprintf("status=%d body=%s", status, strings.TrimSpace(string(body)))
	}
	o.set("GET unset", "%s", get(""))
	status, _, _ := tg.call(http.MethodPost, topic+"/messageTTL?messageTTL=7", "")
	o.set("POST messageTTL=7", "status=%d", status)
	tg.eventually("the policy read back", func() bool { return get("") == "status=200 body=7" })
	o.set("GET after POST", "%s", get(""))
	o.set("GET applied", "%s", get("?applied=true"))
	status, _, _ = tg.call(http.MethodPost, topic+"/messageTTL?messageTTL=-1", "")
	o.set("POST messageTTL=-1", "status=%d", status)
	status, _, _ = tg.call(http.MethodDelete, topic+"/messageTTL", "")
	o.set("DELETE", "status=%d", status)
	tg.poll(5*time.Second, func() bool { return !strings.HasSuffix(get(""), "body=7") })
	o.set("GET after DELETE", "%s", get(""))
	o.set("GET applied after DELETE", "%s", get("?applied=true"))
}

// A Shared subscription serves the lowest priority level while it has permits, round robin
// within the level.
func diffPriorityShared(tg *diffTarget, o *observation) {
	topic := tg.topic("priority")
	consumers := map[string]pulsar.Consumer{}
	for _, c := range []struct {
		name  string
		level int
	}{{"low", 1}, {"high-a", 0}, {"high-b", 0}} {
		consumers[c.name] = tg.subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Type: pulsar.Shared, Name: c.name, PriorityLevel: c.level})
	}
	tg.eventually("three grants", func() bool {
		return len(tg.rec.Consumers(wirerec.Filter{Topic: topic})) == 3 && tg.rec.Permits(wirerec.Filter{Topic: topic}) >= 3
	})
	tg.sendN(tg.producer(topic, 0), "m", 10)
	got := map[string]int{}
	for _, name := range tg.drain(consumers, 10) {
		got[name]++
	}
	o.set("received by level", "level0=%d level1=%d", got["high-a"]+got["high-b"], got["low"])
	o.set("level-0 consumers served", "high-a=%v high-b=%v", got["high-a"] > 0, got["high-b"] > 0)
}

// A dead-letter producer's initial_subscription_name creates the subscription before anyone
// subscribes, so the dead letter waits for it.
func diffInitialSubscription(tg *diffTarget, o *observation) {
	topic, dlq := tg.topic("work"), tg.topic("work-dlq")
	cons := tg.subscribe(pulsar.ConsumerOptions{
		Topic: topic, SubscriptionName: "sub", Type: pulsar.Shared, NackRedeliveryDelay: 50 * time.Millisecond,
		DLQ: &pulsar.DLQPolicy{MaxDeliveries: 1, DeadLetterTopic: dlq, InitialSubscriptionName: "dead"},
	})
	tg.sendN(tg.producer(topic, 0), "m", 1)
	cons.Nack(tg.receive(cons, 1, false)[0])
	var st diffTopicStats
	tg.eventually("the dead letter stored", func() bool {
		return tg.getJSON(dlq+"/stats", &st) == http.StatusOK && st.Subscriptions["dead"].MsgBacklog == 1
	})
	o.set("subscriptions of the dead-letter topic before any consumer", "%s", strings.Join(slices.Sorted(mapKeys(st.Subscriptions)), " "))
	o.set("backlog of the initial subscription", "%d", st.Subscriptions["dead"].MsgBacklog)
	latest, err := tg.client.Subscribe(pulsar.ConsumerOptions{Topic: dlq, SubscriptionName: "dead", Type: pulsar.Shared})
	if err != nil {
		tg.t.Fatal(err)
	}
	defer latest.Close()
	o.set("received by a consumer starting at Latest", "%s", strings.Join(payloads(tg.receive(latest, 1, true)), " "))
}

// Producer access modes: Exclusive refuses the others, WaitForExclusive waits for the exclusive
// producer to go, ExclusiveWithFencing closes the producers there.
func diffProducerAccessModes(tg *diffTarget, o *observation) {
	topic := fullName(tg.topic("access"))
	tg.call(http.MethodPut, tg.topic("access"), "") // the broker loads the topic's bundle: raw clients do no lookup
	first, second := tg.raw(), tg.raw()
	var base int64 = -1
	producer := func(rc *rawClient, reqID, producerID uint64, name string, mode pb.ProducerAccessMode, ready bool) string {
		if name != "" {
			rc.send(&pb.BaseCommand{Type: pb.BaseCommand_PRODUCER.Enum(), Producer: &pb.CommandProducer{
				Topic: proto.String(topic), ProducerId: proto.Uint64(producerID), RequestId: proto.Uint64(reqID),
				ProducerName: proto.String(name), ProducerAccessMode: mode.Enum(),
			}})
		}
		resp := rc.await("producer answer", func(c *pb.BaseCommand) bool {
			ps := c.GetProducerSuccess()
			return ps.GetRequestId() == reqID && ps.GetProducerReady() == ready || c.GetType() == pb.BaseCommand_ERROR && c.GetError().GetRequestId() == reqID
		})
		if resp.GetType() == pb.BaseCommand_ERROR {
			return fmt.Sprintf("error %s %s", resp.GetError().GetError(), strings.ReplaceAll(resp.GetError().GetMessage(), tg.suffix, ""))
		}
		ps := resp.GetProducerSuccess()
		epoch := "none"
		if ps.TopicEpoch != nil {
			if base < 0 {
				base = int64(ps.GetTopicEpoch())
			}
			epoch = "e"
			if d := int64(ps.GetTopicEpoch()) - base; d != 0 {
				epoch += fmt.Sprintf("%+d", d)
			}
		}
		return fmt.Sprintf("success ready=%v epoch=%s", ps.GetProducerReady(), epoch)
	}
	o.set("exclusive", "%s", producer(first, 1, 1, "excl", pb.ProducerAccessMode_Exclusive, true))
	o.set("second exclusive", "%s", producer(first, 2, 2, "excl2", pb.ProducerAccessMode_Exclusive, true))
	o.set("shared", "%s", producer(first, 3, 3, "shared", pb.ProducerAccessMode_Shared, true))
	o.set("wait for exclusive", "%s", producer(first, 4, 4, "waiter", pb.ProducerAccessMode_WaitForExclusive, false))
	first.send(&pb.BaseCommand{Type: pb.BaseCommand_CLOSE_PRODUCER.Enum(), CloseProducer: &pb.CommandCloseProducer{ProducerId: proto.Uint64(1), RequestId: proto.Uint64(5)}})
	o.set("wait for exclusive after the exclusive one closed", "%s", producer(first, 4, 4, "", 0, true))
	o.set("exclusive with fencing", "%s", producer(second, 6, 1, "fencer", pb.ProducerAccessMode_ExclusiveWithFencing, true))
	first.mu.Lock()
	told := slices.ContainsFunc(first.frames, func(c *pb.BaseCommand) bool { return c.GetType() == pb.BaseCommand_CLOSE_PRODUCER })
	first.mu.Unlock()
	first.send(&pb.BaseCommand{Type: pb.BaseCommand_SEND.Enum(), Send: &pb.CommandSend{ProducerId: proto.Uint64(4), SequenceId: proto.Uint64(0)}},
		sendPayload(&pb.MessageMetadata{ProducerName: proto.String("waiter"), SequenceId: proto.Uint64(0), PublishTime: proto.Uint64(uint64(time.Now().UnixMilli()))}, []byte("late")))
	tg.eventually("the fenced producer's connection closed", func() bool {
		first.mu.Lock()
		defer first.mu.Unlock()
		return first.eof
	})
	o.set("the fenced producer", "told=%v, its next SEND closes the connection", told)
	var st struct {
		Publishers []json.RawMessage `json:"publishers"`
	}
	tg.getJSON(tg.topic("access")+"/stats", &st)
	o.set("publishers", "%d", len(st.Publishers))
}

// The admin calls as pulsaradmin sends them: PUT .../partitions with a PartitionedTopicMetadata
// body, DELETE .../partitions, terminate; the stats' metadata and clientVersion fields, and
// partitioned-stats per partition.
func diffAdminAsClientsSendIt(tg *diffTarget, o *observation) {
	parts := tg.topic("admin-parts")
	put := func(label, body string) {
		req, err := http.NewRequest(http.MethodPut, tg.adminURL+"/admin/v2/persistent/public/default/"+parts+"/partitions", strings.NewReader(body))
		if err != nil {
			tg.t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/vnd.partitioned-topic-metadata+json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			tg.t.Fatal(err)
		}
		resp.Body.Close()
		o.set(label, "status=%d", resp.StatusCode)
	}
	put("PUT partitions 0 as metadata", `{"partitions":0}`)
	put("PUT partitions as metadata", `{"properties":{"k":"v"},"partitions":2}`)
	put("PUT partitions as metadata again", `{"partitions":2}`)
	status, body, _ := tg.call(http.MethodGet, parts+"/partitions", "")
	o.set("GET partitions", "status=%d body=%s", status, strings.TrimSpace(string(body)))

	p, err := tg.client.CreateProducer(pulsar.ProducerOptions{Topic: parts, Name: "prod", Properties: map[string]string{"p": "1"}, DisableBatching: true})
	if err != nil {
		tg.t.Fatal(err)
	}
	cons := tg.subscribe(pulsar.ConsumerOptions{Topic: parts, SubscriptionName: "sub", Name: "cons", Properties: map[string]string{"c": "2"}})
	tg.sendN(p, "m", 2)
	var st struct {
		Publishers    []map[string]json.RawMessage `json:"publishers"`
		Subscriptions map[string]struct {
			Consumers []map[string]json.RawMessage `json:"consumers"`
		} `json:"subscriptions"`
		Partitions map[string]json.RawMessage `json:"partitions"`
	}
	status = tg.getJSON(parts+"/partitioned-stats?perPartition=true", &st)
	o.set("partitioned-stats perPartition", "status=%d partitions=%s", status, strings.ReplaceAll(strings.Join(slices.Sorted(mapKeys(st.Partitions)), " "), tg.suffix, ""))
	field := func(m map[string]json.RawMessage, k string) string {
		if v, ok := m[k]; ok {
			return string(v)
		}
		return "absent"
	}
	for _, pub := range st.Publishers {
		o.set("publisher metadata", "%s", field(pub, "metadata"))
		o.set("publisher clientVersion", "%s", field(pub, "clientVersion"))
	}
	for _, c := range st.Subscriptions["sub"].Consumers {
		o.set("consumer metadata", "%s", field(c, "metadata"))
		o.set("consumer clientVersion", "%s", field(c, "clientVersion"))
	}
	for _, path := range []string{"partitioned-stats?perPartition=true partition-0", "-partition-0/stats"} {
		var one struct {
			Publishers    []map[string]json.RawMessage `json:"publishers"`
			Subscriptions map[string]struct {
				Consumers []map[string]json.RawMessage `json:"consumers"`
			} `json:"subscriptions"`
		}
		raw, ok := st.Partitions[fullName(parts)+"-partition-0"]
		if path == "-partition-0/stats" {
			_, raw, _ = tg.call(http.MethodGet, parts+path, "")
			ok = true
		}
		if !ok {
			continue
		}
		_ = json.Unmarshal(raw, &one)
		for _, pub := range one.Publishers {
			o.set(path+" publisher", "metadata=%s clientVersion=%s", field(pub, "metadata"), field(pub, "clientVersion"))
		}
		for _, c := range one.Subscriptions["sub"].Consumers {
			o.set(path+" consumer", "metadata=%s clientVersion=%s", field(c, "metadata"), field(c, "clientVersion"))
		}
	}
	status, _, _ = tg.call(http.MethodDelete, parts+"/partitions", "")
	o.set("DELETE partitions with clients connected", "status=%d", status)
	p.Close()
	cons.Close()
	status, _, _ = tg.call(http.MethodDelete, parts+"/partitions?force=false", "")
	o.set("DELETE partitions", "status=%d", status)
	status, body, _ = tg.call(http.MethodGet, parts+"/partitions", "")
	o.set("GET partitions after DELETE", "status=%d body=%s", status, strings.ReplaceAll(strings.TrimSpace(string(body)), tg.suffix, ""))
	status, _, _ = tg.call(http.MethodDelete, parts+"/partitions", "")
	o.set("DELETE partitions again", "status=%d", status)

	single := tg.topic("admin-terminate")
	sp := tg.producer(single, 0)
	tg.sendN(sp, "t", 2)
	status, body, _ = tg.call(http.MethodPost, single+"/terminate", "")
	var id struct {
		LedgerID int64 `json:"ledgerId"`
		EntryID  int64 `json:"entryId"`
	}
	_ = json.Unmarshal(body, &id)
	// Fields by name: Jackson writes MessageIdImpl's getters in no fixed order (4.2.4 has been
	// seen writing batchSize before batchIndex).
	var fields map[string]json.RawMessage
	_ = json.Unmarshal(body, &fields)
	byName := map[string]string{}
	for k, v := range fields {
		byName[k] = string(v)
	}
	byName["ledgerId"] = "L"
	o.set("terminate", "status=%d last=%s body=%s", status, tg.pos(id.LedgerID, id.EntryID), sortedJoin(byName))

	// Not a send on sp: the broker's CLOSE_PRODUCER makes pulsar-client-go v0.21 close the
	// producer's channels in its reconnect while a Send may write to them (a data race in the
	// client, seen under -race on a loaded machine). A new producer is refused instead.
	_, err = tg.client.CreateProducer(pulsar.ProducerOptions{Topic: single})
	o.set("new producer after terminate", "%v", err != nil && strings.Contains(err.Error(), "TopicTerminated"))
	status, _, _ = tg.call(http.MethodPost, single+"/terminate", "")
	o.set("terminate again", "status=%d", status)
	tg.createPartitioned(tg.topic("admin-terminate-parts"), 2)
	status, _, _ = tg.call(http.MethodPost, tg.topic("admin-terminate-parts")+"/terminate", "")
	o.set("terminate a partitioned topic", "status=%d", status)
}
