package pulsartest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// Each test here states one "real broker behaviour" of a 4.x broker and
// names the Java class and method that implements it.

// PersistentSubscription.resetCursor -> AbstractDispatcherSingleActiveConsumer.disconnectActiveConsumers:
// a seek on Failover closes only the ACTIVE consumer; the standby stays
// connected and is never told (no CLOSE_CONSUMER, no new FLOW).
func TestSeekOnFailoverClosesOnlyTheActiveConsumer(t *testing.T) {
	b := Start(t, Options{ActiveConsumerFailoverDelay: -1})
	c := newClient(t, b)
	byName := map[string]pulsar.Consumer{}
	for _, name := range []string{"a", "b"} {
		byName[name] = testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "fo-seek", SubscriptionName: "sub", Type: pulsar.Failover, Name: name})
	}
	activeName := activeConsumer(t, b, "fo-seek", "sub")
	standbyName := map[string]string{"a": "b", "b": "a"}[activeName]
	ids := testkit.Produce(t, testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "fo-seek"}), "m", 5)
	testkit.ReceiveAndAck(t, byName[activeName], 5, waitFor)
	standbyBefore := consumerStats(b, "fo-seek", "sub", standbyName)

	seekAt := time.Now()
	if err := byName[activeName].Seek(ids[1]); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, waitFor, "the active consumer re-subscribed with a fresh grant", func() bool {
		return slices.ContainsFunc(b.Flows("fo-seek", "sub"), func(f Flow) bool { return f.Time.After(seekAt) && f.ConsumerName == activeName })
	})
	if got := consumerStats(b, "fo-seek", "sub", standbyName); got.ConsumerID != standbyBefore.ConsumerID || got.Conn != standbyBefore.Conn {
		t.Fatalf("standby was reconnected: %+v -> %+v", standbyBefore, got)
	}
	for _, f := range b.Flows("fo-seek", "sub") {
		if f.Time.After(seekAt) && f.ConsumerName == standbyName {
			t.Fatalf("standby sent a FLOW after the seek: %+v", f)
		}
	}
}

// The same reset on Shared closes every consumer
// (PersistentDispatcherMultipleConsumers.disconnectActiveConsumers = all).
func TestSeekOnSharedClosesEveryConsumer(t *testing.T) {
	b := Start(t)
	c := newClient(t, b)
	opts := pulsar.ConsumerOptions{Topic: "sh-seek", SubscriptionName: "sub", Type: pulsar.Shared}
	first := testkit.Subscribe(t, c, opts)
	testkit.Subscribe(t, c, opts)
	testkit.Eventually(t, waitFor, "both granted", func() bool { return len(b.Flows("sh-seek", "sub")) >= 2 })
	ids := testkit.Produce(t, testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "sh-seek"}), "m", 2)
	seekAt := time.Now()
	if err := first.Seek(ids[0]); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, waitFor, "both consumers re-subscribed", func() bool {
		names := map[string]bool{}
		for _, f := range b.Flows("sh-seek", "sub") {
			if f.Time.After(seekAt) {
				names[f.ConsumerName] = true
			}
		}
		return len(names) == 2
	})
}

func consumerStats(b *Broker, topic, sub, name string) ConsumerStats {
	for _, cs := range b.Subscription(topic, sub).Consumers {
		if cs.Name == name {
			return cs
		}
	}
	return ConsumerStats{}
}

// PersistentDispatcherSingleActiveConsumer.calculateToRead reads
// min(permits, dispatcherMaxReadBatchSize) ENTRIES: a FLOW of 2 permits
// gets two batches of 10 messages and permits end at -18.
// PersistentDispatcherMultipleConsumers.trySendMessagesToConsumers divides
// by the average batch size: the same grant on Shared gets one batch.
// preciseDispatcherFlowControl sizes single-active reads by messages.
func TestOneGrantDeliversWholeBatches(t *testing.T) {
	for _, tc := range []struct {
		name        string
		opts        Options
		kind        pb.CommandSubscribe_SubType
		wantDeliver int64
	}{
		{"exclusive reads entries", Options{}, pb.CommandSubscribe_Exclusive, 20},
		{"shared divides by batch size", Options{}, pb.CommandSubscribe_Shared, 10},
		{"precise flow control", Options{PreciseDispatcherFlowControl: true}, pb.CommandSubscribe_Exclusive, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := Start(t, tc.opts)
			c := newClient(t, b)
			p := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "batches", BatchingMaxMessages: 10, BatchingMaxPublishDelay: time.Hour})
			testkit.ProduceAsync(t, p, "m", 50, nil)
			rc := dialRaw(t, b)
			rc.subscribe("batches", "sub", tc.kind, 1)
			rc.flow(1, 2)
			testkit.Eventually(t, waitFor, "dispatch", func() bool { return b.Subscription("batches", "sub").Dispatched == tc.wantDeliver })
			st := b.Subscription("batches", "sub")
			if got := st.Consumers[0].Permits; got != 2-tc.wantDeliver {
				t.Fatalf("permits %d after delivering %d messages for 2", got, tc.wantDeliver)
			}
			testkit.Eventually(t, waitFor, "messages on the wire", func() bool { return len(rc.messages()) == int(tc.wantDeliver/10) })
		})
	}
}

// ConsistentHashingStickyKeyConsumerSelector: keys map to consumers through a
// Murmur3 ring keyed by consumer NAME; a consumer that comes back under the
// same name gets the same keys.
func TestKeySharedRingIsKeyedByConsumerName(t *testing.T) {
	b := Start(t)
	c := newClient(t, b)
	names := []string{"ks-1", "ks-2", "ks-3"}
	ring := buildKeySharedRing([]*consumer{{name: names[0]}, {name: names[1]}, {name: names[2]}})
	var consumers []pulsar.Consumer
	for _, n := range names {
		consumers = append(consumers, testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "ring", SubscriptionName: "sub", Type: pulsar.KeyShared, Name: n}))
	}
	testkit.Eventually(t, waitFor, "all granted", func() bool { return len(b.Flows("ring", "sub")) >= 3 })
	p := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "ring", DisableBatching: true})
	for i := 0; i < 30; i++ {
		if _, err := p.Send(context.Background(), &pulsar.ProducerMessage{Key: fmt.Sprintf("key-%d", i), Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	total := 0
	drain(t, consumers, func(i int, m pulsar.Message) bool {
		total++
		if want := ring.selectConsumer(stickyKeyHash([]byte(m.Key()))).name; want != names[i] {
			t.Fatalf("key %s went to %s, the ring says %s", m.Key(), names[i], want)
		}
		return total == 30
	})
}

// PersistentStickyKeyDispatcherMultipleConsumers.getEffectiveLookAheadLimit:
// entries of a consumer without permits wait in the replay queue while other
// keys flow, until the queue holds min(perConsumer x consumers,
// perSubscription) entries; then normal reads stop for EVERY consumer.
func TestKeySharedLookAheadLimitStopsEveryConsumer(t *testing.T) {
	b := Start(t, Options{KeySharedLookAheadPerConsumer: 2, KeySharedLookAheadPerSubscription: 3})
	rc := dialRaw(t, b)
	rc.subscribe("lookahead", "sub", pb.CommandSubscribe_Key_Shared, 1) // raw-1: no permits
	rc.subscribe("lookahead", "sub", pb.CommandSubscribe_Key_Shared, 2) // raw-2
	rc.flow(2, 1000)
	ring := buildKeySharedRing([]*consumer{{name: "raw-1"}, {name: "raw-2"}})
	stuck, free := keyFor(ring, "raw-1"), keyFor(ring, "raw-2")
	c := newClient(t, b)
	p := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "lookahead", DisableBatching: true})
	testkit.Eventually(t, waitFor, "grant applied", func() bool { return consumerStats(b, "lookahead", "sub", "raw-2").Permits == 1000 })
	send := func(key string) {
		if _, err := p.Send(context.Background(), &pulsar.ProducerMessage{Key: key, Payload: []byte(key)}); err != nil {
			t.Fatal(err)
		}
	}
	send(stuck)
	send(free) // flows: the replay queue holds 1 < 3
	testkit.Eventually(t, waitFor, "free key delivered", func() bool { return consumerStats(b, "lookahead", "sub", "raw-2").Dispatched == 1 })
	send(stuck)
	send(stuck) // replay queue now 3 = limit
	send(free)  // not read: normal reads stopped for every consumer
	if got := consumerStats(b, "lookahead", "sub", "raw-2").Dispatched; got != 1 {
		t.Fatalf("consumer with permits got %d messages past the look-ahead limit", got)
	}
	rc.flow(1, 1000)
	testkit.Eventually(t, waitFor, "everything flows once the stuck consumer has permits", func() bool {
		return b.Subscription("lookahead", "sub").Dispatched == 5
	})
}

func keyFor(ring keySharedRing, name string) string {
	for i := 0; ; i++ {
		k := fmt.Sprintf("k%d", i)
		if ring.selectConsumer(stickyKeyHash([]byte(k))).name == name {
			return k
		}
	}
}

// Consumer.addAndGetUnAckedMsgs / flowPermits: at maxUnackedMessagesPerConsumer
// the consumer is blocked (FLOW permits are put aside) and unblocked at half.
func TestMaxUnackedPerConsumerBlocksDispatch(t *testing.T) {
	b := Start(t, Options{MaxUnackedPerConsumer: 4})
	c := newClient(t, b)
	ids := testkit.Produce(t, testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "unacked", DisableBatching: true}), "m", 10)
	rc := dialRaw(t, b)
	rc.subscribe("unacked", "sub", pb.CommandSubscribe_Shared, 1)
	rc.flow(1, 100)
	testkit.Eventually(t, waitFor, "blocked at the limit", func() bool {
		st := consumerStats(b, "unacked", "sub", "raw-1")
		return st.Dispatched == 4 && st.Unacked == 4
	})
	if !adminStats(t, b, "unacked").Subscriptions["sub"].Consumers[0].BlockedConsumerOnUnackedMsgs {
		t.Fatal("stats do not show the consumer blocked")
	}
	rc.flow(1, 50) // put aside while blocked
	ack := func(i int) {
		rc.send(&pb.BaseCommand{Type: pb.BaseCommand_ACK.Enum(), Ack: &pb.CommandAck{
			ConsumerId: ptr(uint64(1)), AckType: pb.CommandAck_Individual.Enum(),
			MessageId: []*pb.MessageIdData{{LedgerId: ptr(uint64(ids[i].LedgerID())), EntryId: ptr(uint64(ids[i].EntryID()))}},
		}})
	}
	ack(0)
	testkit.Eventually(t, waitFor, "first ack applied", func() bool { return b.Subscription("unacked", "sub").Acked == 1 })
	if st := consumerStats(b, "unacked", "sub", "raw-1"); st.Dispatched != 4 {
		t.Fatalf("unblocked above half the limit: %+v", st)
	}
	ack(1) // 2 unacked = half: unblocked, the put-aside permits count again
	testkit.Eventually(t, waitFor, "unblocked and blocked again at the limit", func() bool {
		st := consumerStats(b, "unacked", "sub", "raw-1")
		return st.Dispatched == 6 && st.Permits == 150-6
	})
}

// PersistentDispatcherMultipleConsumers.addUnAckedMessages: once the
// subscription holds maxUnackedMessagesPerSubscription unacked messages,
// normal reads stop for all its consumers (the read in progress completes).
func TestMaxUnackedPerSubscriptionBlocksDispatch(t *testing.T) {
	b := Start(t, Options{MaxUnackedPerSubscription: 3})
	c := newClient(t, b)
	p := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "unacked-sub", DisableBatching: true})
	rc := dialRaw(t, b)
	rc.subscribe("unacked-sub", "sub", pb.CommandSubscribe_Shared, 1)
	rc.subscribe("unacked-sub", "sub", pb.CommandSubscribe_Shared, 2)
	rc.flow(1, 100)
	rc.flow(2, 100)
	testkit.Eventually(t, waitFor, "grants applied", func() bool { return consumerStats(b, "unacked-sub", "sub", "raw-2").Permits == 100 })
	testkit.Produce(t, p, "m", 8) // each send is dispatched before its receipt
	if got := b.Subscription("unacked-sub", "sub").Dispatched; got != 3 {
		t.Fatalf("dispatched %d past a subscription limit of 3", got)
	}
}

// incrementAndGetRedeliveryCount runs only on a nack or ack-timeout
// redelivery; single-active dispatchers use RedeliveryTrackerDisabled, so a
// nacked message on Failover comes back with count 0.
func TestRedeliveryCountOnFailoverStaysZero(t *testing.T) {
	b := Start(t, Options{ActiveConsumerFailoverDelay: -1})
	c := newClient(t, b)
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{
		Topic: "fo-nack", SubscriptionName: "sub", Type: pulsar.Failover, NackRedeliveryDelay: 50 * time.Millisecond,
	})
	testkit.Produce(t, testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "fo-nack"}), "m", 1)
	cons.Nack(testkit.Receive(t, cons, 1, waitFor)[0])
	if again := testkit.ReceiveAndAck(t, cons, 1, waitFor)[0]; string(again.Payload()) != "m-0" || again.RedeliveryCount() != 0 {
		t.Fatalf("redelivered %q count %d", again.Payload(), again.RedeliveryCount())
	}
}

// brokerDeduplicationEnabled=false by default (MessageDeduplication): a
// resend with the same sequence id is stored twice, and PRODUCER_SUCCESS
// carries last_sequence_id -1. With deduplication it is stored once.
func TestDeduplicationIsOffByDefault(t *testing.T) {
	for _, dedup := range []bool{false, true} {
		t.Run(fmt.Sprintf("dedup=%v", dedup), func(t *testing.T) {
			b := Start(t, Options{Deduplication: dedup})
			rc := dialRaw(t, b)
			producer := func(reqID uint64) *pb.CommandProducerSuccess {
				rc.send(&pb.BaseCommand{Type: pb.BaseCommand_PRODUCER.Enum(), Producer: &pb.CommandProducer{
					Topic: ptr("dedup"), ProducerId: ptr(reqID), RequestId: ptr(reqID), ProducerName: ptr("p"),
				}})
				return rc.await("producer", func(c *pb.BaseCommand) bool { return c.GetProducerSuccess().GetRequestId() == reqID }).GetProducerSuccess()
			}
			producer(1)
			body := sendPayload(&pb.MessageMetadata{ProducerName: ptr("p"), SequenceId: ptr(uint64(0)), PublishTime: ptr(uint64(1))}, []byte("x"))
			for i := 0; i < 2; i++ {
				rc.send(&pb.BaseCommand{Type: pb.BaseCommand_SEND.Enum(), Send: &pb.CommandSend{ProducerId: ptr(uint64(1)), SequenceId: ptr(uint64(0))}}, body)
			}
			testkit.Eventually(t, waitFor, "two receipts", func() bool {
				n := 0
				rc.mu.Lock()
				for _, f := range rc.frames {
					if f.GetType() == pb.BaseCommand_SEND_RECEIPT {
						n++
					}
				}
				rc.mu.Unlock()
				return n == 2
			})
			stored, wantStored, wantLast := adminStats(t, b, "dedup").MsgInCounter, int64(2), int64(-1)
			if dedup {
				wantStored, wantLast = 1, 0
			}
			if stored != wantStored {
				t.Fatalf("stored %d messages, want %d", stored, wantStored)
			}
			rc.send(&pb.BaseCommand{Type: pb.BaseCommand_CLOSE_PRODUCER.Enum(), CloseProducer: &pb.CommandCloseProducer{ProducerId: ptr(uint64(1)), RequestId: ptr(uint64(50))}})
			rc.await("closed", func(c *pb.BaseCommand) bool { return c.GetSuccess().GetRequestId() == 50 })
			if got := producer(2).GetLastSequenceId(); got != wantLast {
				t.Fatalf("last sequence id %d, want %d", got, wantLast)
			}
		})
	}
}

// Consumer.messageAcked ignores a cumulative ack on Shared and Key_Shared;
// on Exclusive it acknowledges everything up to the id.
func TestCumulativeAckIgnoredOnShared(t *testing.T) {
	for _, kind := range []pb.CommandSubscribe_SubType{pb.CommandSubscribe_Shared, pb.CommandSubscribe_Exclusive} {
		t.Run(kind.String(), func(t *testing.T) {
			b := Start(t)
			c := newClient(t, b)
			testkit.Produce(t, testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "cumul", DisableBatching: true}), "m", 3)
			rc := dialRaw(t, b)
			rc.subscribe("cumul", "sub", kind, 1)
			rc.flow(1, 10)
			testkit.Eventually(t, waitFor, "3 messages", func() bool { return len(rc.messages()) == 3 })
			rc.send(&pb.BaseCommand{Type: pb.BaseCommand_ACK.Enum(), Ack: &pb.CommandAck{
				ConsumerId: ptr(uint64(1)), AckType: pb.CommandAck_Cumulative.Enum(), RequestId: ptr(uint64(77)),
				MessageId: []*pb.MessageIdData{rc.messages()[2].GetMessageId()},
			}})
			rc.await("ack response", func(c *pb.BaseCommand) bool { return c.GetAckResponse().GetRequestId() == 77 })
			want := int64(3)
			if kind == pb.CommandSubscribe_Exclusive {
				want = 0
			}
			if got := b.Subscription("cumul", "sub").Backlog; got != want {
				t.Fatalf("backlog %d after a cumulative ack, want %d", got, want)
			}
		})
	}
}

// AbstractDispatcherSingleActiveConsumer.pickAndScheduleActiveConsumer: on a
// non-partitioned topic the active consumer comes from a hash ring of the
// names probed with the topic name, whatever the join order; on partitions,
// partition index mod consumer count over the sorted names.
func TestFailoverActiveIsPickedByNameNotJoinOrder(t *testing.T) {
	b := Start(t, Options{ActiveConsumerFailoverDelay: -1})
	c := newClient(t, b)
	sorted := []*consumer{{name: "x"}, {name: "y"}}
	for _, topic := range []string{"fo-pick-1", "fo-pick-2", "fo-pick-3", "fo-pick-4"} {
		want := sorted[failoverIndex(sorted, 2, -1, mustFull(topic))].name
		for _, order := range [][]string{{"x", "y"}, {"y", "x"}} {
			sub := "sub-" + order[0]
			var opened []pulsar.Consumer
			for _, name := range order {
				opened = append(opened, testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: sub, Type: pulsar.Failover, Name: name}))
			}
			testkit.Eventually(t, waitFor, "two consumers", func() bool { return len(b.Subscription(topic, sub).Consumers) == 2 })
			if got := activeConsumer(t, b, topic, sub); got != want {
				t.Fatalf("%s joined %v: active %s, want %s", topic, order, got, want)
			}
			for _, o := range opened {
				o.Close()
			}
		}
	}

	if err := b.CreatePartitionedTopic("fo-parts", 2); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"y", "x"} {
		testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "fo-parts", SubscriptionName: "sub", Type: pulsar.Failover, Name: name})
	}
	for i, want := range []string{"x", "y"} {
		if got := activeConsumer(t, b, partitionName(mustFull("fo-parts"), i), "sub"); got != want {
			t.Fatalf("partition %d active %s, want %s", i, got, want)
		}
	}
}

// PersistentDispatcherSingleActiveConsumer.scheduleReadOnActiveConsumer: a
// Failover subscription dispatches to a newly chosen active consumer only
// after activeConsumerFailoverDelayTimeMillis (1 s by default).
func TestFailoverSwitchWaitsTheDelay(t *testing.T) {
	if d := (Options{}).withDefaults().ActiveConsumerFailoverDelay; d != time.Second {
		t.Fatalf("default failover delay %v", d)
	}
	const delay = 300 * time.Millisecond
	b := Start(t, Options{ActiveConsumerFailoverDelay: delay})
	c := newClient(t, b)
	testkit.Produce(t, testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "fo-delay"}), "m", 1)
	start := time.Now()
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{
		Topic: "fo-delay", SubscriptionName: "sub", Type: pulsar.Failover,
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest,
	})
	testkit.ReceiveAndAck(t, cons, 1, waitFor)
	if waited := time.Since(start); waited < delay {
		t.Fatalf("first message after %v, before the %v failover delay", waited, delay)
	}
}

// REST shapes: PIP-415 answers batch index -1 and -1:-1 inside the first
// entry; resetcursor takes excluded
// (not isExcluded) in the ResetCursorData body and answers 405 on a partitioned base name;
// /stats on a partitioned base name is 404 (partitioned-stats is the way);
// DateFormatter writes the entry timestamps.
func TestRESTShapes(t *testing.T) {
	b := Start(t)
	if err := b.CreatePartitionedTopic("rest-parts", 2); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, b)
	p := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "rest", BatchingMaxMessages: 5, BatchingMaxPublishDelay: time.Hour})
	testkit.ProduceAsync(t, p, "m", 10, nil)
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "rest", SubscriptionName: "sub", SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
	msgs := testkit.ReceiveAndAck(t, cons, 10, waitFor)
	base := b.AdminURL() + "/admin/v2/persistent/public/default/"

	var raw map[string]any
	testkit.GetJSON(t, base+"rest/getMessageIdByIndex?index=7", &raw)
	if raw["batchIndex"] != float64(-1) || raw["entryId"] != float64(1) {
		t.Fatalf("getMessageIdByIndex answered %v", raw)
	}
	// Inside the first entry, but for its last index, Pulsar 4.2 answers -1:-1.
	for index, want := range map[int]float64{0: -1, 3: -1, 4: 0} {
		raw = nil
		testkit.GetJSON(t, base+"rest/getMessageIdByIndex?index="+strconv.Itoa(index), &raw)
		if raw["ledgerId"] == nil || raw["entryId"] != want || (want == -1) != (raw["ledgerId"] == float64(-1)) {
			t.Fatalf("getMessageIdByIndex?index=%d answered %v, want entry %v", index, raw, want)
		}
	}

	second := msgs[5].ID() // first message of the second entry
	// "isExcluded" is not a field of ResetCursorData on the wire: it is ignored.
	body := fmt.Sprintf(`{"ledgerId":%d,"entryId":%d,"isExcluded":true}`, second.LedgerID(), second.EntryID())
	if code := post(t, base+"rest/subscription/sub/resetcursor", body); code != http.StatusNoContent {
		t.Fatalf("resetcursor answered %d", code)
	}
	testkit.Eventually(t, waitFor, "cursor at the entry, isExcluded ignored", func() bool {
		st := b.Subscription("rest", "sub")
		return len(st.Cursors) == 1 && st.Cursors[0].MarkDeletePosition == fmt.Sprintf("%d:%d", msgs[0].ID().LedgerID(), msgs[0].ID().EntryID())
	})
	body = fmt.Sprintf(`{"ledgerId":%d,"entryId":%d,"excluded":true}`, second.LedgerID(), second.EntryID())
	if code := post(t, base+"rest/subscription/sub/resetcursor", body); code != http.StatusNoContent {
		t.Fatalf("resetcursor answered %d", code)
	}
	testkit.Eventually(t, waitFor, "cursor past the excluded entry", func() bool {
		st := b.Subscription("rest", "sub")
		return len(st.Cursors) == 1 && st.Cursors[0].MarkDeletePosition == fmt.Sprintf("%d:%d", second.LedgerID(), second.EntryID())
	})
	if code := post(t, base+"rest-parts/subscription/sub/resetcursor", `{"ledgerId":1,"entryId":0}`); code != http.StatusMethodNotAllowed {
		t.Fatalf("resetcursor on a partitioned base name answered %d", code)
	}
	testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "rest-parts"})
	if resp := getCode(t, base+"rest-parts/stats"); resp != http.StatusNotFound {
		t.Fatalf("/stats on a partitioned base name answered %d", resp)
	}
	if resp := getCode(t, base+"rest-parts/partitioned-stats"); resp != http.StatusOK {
		t.Fatalf("/partitioned-stats answered %d", resp)
	}

	resp, err := http.Get(fmt.Sprintf("%srest/ledger/%d/entry/%d", base, second.LedgerID(), second.EntryID()))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	for _, h := range []string{"X-Pulsar-publish-time", "X-Pulsar-Broker-Entry-METADATA-timestamp"} {
		v := resp.Header.Get(h)
		if _, err := time.Parse(time.RFC3339Nano, v); err != nil || !strings.HasSuffix(v, "Z") || strings.HasSuffix(v, "0Z") {
			t.Fatalf("%s = %q, want ISO_OFFSET_DATE_TIME without trailing zeros", h, v)
		}
	}
}

func adminStats(t testing.TB, b *Broker, topic string) topicStatsJSON {
	t.Helper()
	var out topicStatsJSON
	testkit.GetJSON(t, b.AdminURL()+"/admin/v2/persistent/public/default/"+topic+"/stats", &out)
	return out
}

func getCode(t testing.TB, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

func post(t testing.TB, url, body string) int {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// Lookups answer the broker's advertised address: with AdvertisedURL set
// to a proxy, the client's topic connections go through the proxy.
func TestLookupAnswersTheAdvertisedURL(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	b := Start(t, Options{AdvertisedURL: "pulsar://" + ln.Addr().String()})
	var proxied atomic.Int32
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			proxied.Add(1)
			out, err := net.Dial("tcp", strings.TrimPrefix(b.ServiceURL(), "pulsar://"))
			if err != nil {
				_ = in.Close()
				continue
			}
			go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
			go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
		}
	}()
	c := newClient(t, b) // the service URL is the broker itself
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "adv", SubscriptionName: "sub"})
	testkit.Produce(t, testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "adv"}), "m", 1)
	testkit.ReceiveAndAck(t, cons, 1, waitFor)
	if proxied.Load() == 0 {
		t.Fatal("no connection went through the advertised address")
	}
}
