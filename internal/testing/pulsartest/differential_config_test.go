package pulsartest

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/apache/pulsar-client-go/pulsar"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
)

// maxMessageSize: what CONNECTED announces, the client's own refusal of a larger message,
// and the broker's frame limit, to the byte.
func diffMaxMessageSize(tg *diffTarget, o *observation) {
	topic := tg.topic("max-size")
	tg.call(http.MethodPut, topic, "") // the broker loads the topic's bundle: raw clients do no lookup
	rc := tg.raw()
	connected := rc.await("CONNECTED", func(c *pb.BaseCommand) bool { return c.GetType() == pb.BaseCommand_CONNECTED })
	maxSize := int(connected.GetConnected().GetMaxMessageSize())
	o.set("CONNECTED max_message_size", "%d", maxSize)

	p := tg.producer(topic, 0)
	_, err := p.Send(context.Background(), &pulsar.ProducerMessage{Payload: make([]byte, maxSize+1)})
	o.set("pulsar-client-go send of max_message_size + 1 bytes", "%v", err)

	// Not a frame between maxMessageSize and the decoder's limit: the broker takes it, but the
	// standalone's bookie (nettyMaxFrameSizeBytes 5 MiB) refuses the entry and the broker
	// retries it on new ledgers for good, which holds up the scenarios after this one.
	rc.producer(fullName(topic), 1, "raw-big")
	rc.sendFrameOfSize(1, 0, "raw-big", maxSize-1024)
	tg.eventually("the frame answered", func() bool { return rc.answerTo(1, 0) != "" || rc.closed() })
	o.set("SEND frame of max_message_size - 1 KiB", "%s", orNone(rc.answerTo(1, 0)))
	rc.sendFrameOfSize(1, 1, "raw-big", maxSize+10*1024-3)
	tg.eventually("the connection closed", rc.closed)
	o.set("SEND frame of max_message_size + 10 KiB - 3 (one byte over the decoder's limit)", "connection closed, answer=%s", orNone(rc.answerTo(1, 1)))
	var st diffTopicStats
	tg.getJSON(topic+"/stats", &st)
	o.set("msgInCounter", "%d", st.MsgInCounter)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// Key_Shared with subscriptionKeySharedUseConsistentHashing=false: hash ranges split in join
// order; a consumer that comes back splits the biggest range again.
func diffKeySharedHashRanges(tg *diffTarget, o *observation) {
	topic := tg.topic("ks-ranges")
	consumers := map[string]pulsar.Consumer{}
	subscribe := func(name string) {
		consumers[name] = tg.subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Name: name, Type: pulsar.KeyShared, ReceiverQueueSize: 100})
	}
	for _, name := range []string{"a", "b", "c"} {
		subscribe(name)
	}
	tg.eventually("all granted", func() bool { return len(tg.rec.Flows(wirerec.Filter{Topic: topic})) >= 3 })
	p := tg.producer(topic, 0)
	round := func(label string) {
		var msgs []*pulsar.ProducerMessage
		for i := range 40 {
			msgs = append(msgs, &pulsar.ProducerMessage{Key: fmt.Sprintf("key-%d", i), Payload: fmt.Appendf(nil, "key-%d", i)})
		}
		tg.send(p, msgs...)
		got := tg.drain(consumers, len(msgs))
		var parts []string
		for i := range msgs {
			parts = append(parts, got[fmt.Sprintf("key-%d", i)])
		}
		o.set(label, "%s", strings.Join(parts, " "))
		tg.eventually("acks applied", func() bool { return tg.subStats(topic, "sub").MsgBacklog == 0 })
	}
	round("keys to a b c")
	consumers["b"].Close()
	delete(consumers, "b")
	round("keys after b left")
	mark := tg.rec.Mark()
	subscribe("b")
	tg.eventually("b back", func() bool { return len(tg.rec.Flows(wirerec.Filter{Topic: topic, Since: mark})) > 0 })
	round("keys after b came back")
}

// REACHED_END_OF_TOPIC: when the broker tells the consumers of a terminated topic that they
// acknowledged everything, seen by raw consumers, and what pulsar-client-go does with it.
func diffReachedEndOfTopic(tg *diffTarget, o *observation) {
	topic := tg.topic("end")
	full := fullName(topic)
	tg.sendN(tg.producer(topic, 0), "m", 2)
	rc := tg.raw()
	rc.subscribe(full, "done", pb.CommandSubscribe_Exclusive, 1)
	rc.subscribe(full, "pending", pb.CommandSubscribe_Shared, 2)
	rc.flow(1, 10)
	rc.flow(2, 10)
	tg.eventually("both delivered", func() bool { return len(rc.messagesFor(1)) == 2 && len(rc.messagesFor(2)) == 2 })
	rc.ackWait(1, 11, rc.messagesFor(1)...)
	rc.ackWait(2, 12, rc.messagesFor(2)[0])
	rc.roundTrip()
	told := func() string { return fmt.Sprintf("done=%d pending=%d", rc.reachedEnd(1), rc.reachedEnd(2)) }
	o.set("before terminate", "%s", told())

	status, _, _ := tg.call(http.MethodPost, topic+"/terminate", "")
	tg.eventually("the acknowledged subscription told", func() bool { return rc.reachedEnd(1) > 0 })
	rc.roundTrip()
	o.set("after terminate", "status=%d %s", status, told())
	rc.ackWait(2, 13, rc.messagesFor(2)[1])
	tg.eventually("told after the last ack", func() bool { return rc.reachedEnd(2) > 0 })
	rc.roundTrip()
	o.set("after the pending subscription's last ack", "%s", told())

	rc.send(&pb.BaseCommand{Type: pb.BaseCommand_CLOSE_CONSUMER.Enum(), CloseConsumer: &pb.CommandCloseConsumer{ConsumerId: ptr(uint64(1)), RequestId: ptr(uint64(14))}})
	rc.await("closed", func(c *pb.BaseCommand) bool { return c.GetSuccess().GetRequestId() == 14 })
	rc.subscribe(full, "done", pb.CommandSubscribe_Exclusive, 3)
	rc.roundTrip()
	o.set("a new consumer of done, before FLOW", "%d", rc.reachedEnd(3))
	rc.flow(3, 10)
	tg.eventually("the new consumer told on its read", func() bool { return rc.reachedEnd(3) > 0 })
	rc.flow(3, 10)
	rc.roundTrip()
	o.set("a new consumer of done, after two FLOWs", "%d", rc.reachedEnd(3))
	rc.subscribe(full, "late", pb.CommandSubscribe_Shared, 4)
	rc.flow(4, 10)
	tg.eventually("the late subscription delivered", func() bool { return len(rc.messagesFor(4)) == 2 })
	rc.roundTrip()
	o.set("a new subscription from the earliest, delivered everything", "%d", rc.reachedEnd(4))
	rc.ackWait(4, 15, rc.messagesFor(4)...)
	tg.eventually("told after its acks", func() bool { return rc.reachedEnd(4) > 0 })
	rc.roundTrip()
	// Twice on Pulsar when the ACK comes before the cursor re-checks the read it parked after
	// the delivery (managedLedgerNewEntriesCheckDelayInMillis, 10 ms): the ACK tells, and the
	// re-check's failed read, which then finds no backlog, tells again. Seen under load.
	o.set("a new subscription from the earliest, acked everything", "%s", within(rc.reachedEnd(4), 1, 2))

	goTopic := tg.topic("end-go")
	p := tg.producer(goTopic, 0)
	cons := tg.subscribe(pulsar.ConsumerOptions{Topic: goTopic, SubscriptionName: "sub"})
	tg.sendN(p, "g", 1)
	tg.receive(cons, 1, true)
	tg.eventually("ack applied", func() bool { return tg.subStats(goTopic, "sub").MsgBacklog == 0 })
	tg.call(http.MethodPost, goTopic+"/terminate", "")
	// The client is told and subscribes again until a subscription's read waits behind the
	// cursor's failed one; that subscription stays connected: the third. On Pulsar the number
	// of tells moves with timing (a read parked before termination can tell once more), and
	// the same re-check could tell the third too, so the client would subscribe a fourth time.
	f := wirerec.Filter{Topic: goTopic, Subscription: "sub"}
	tg.eventually("a third subscription that FLOWs and is not told", func() bool {
		each := tg.toldPerSubscription(f)
		return len(each) >= 3 && !slices.Contains(each[:len(each)-1], false) && !each[len(each)-1]
	})
	tg.barrier(cons)
	o.set("pulsar-client-go consumer connected at terminate", "%s", eachButTheLast(tg.toldPerSubscription(f)))
}

// toldPerSubscription tells, for each SUBSCRIBE that f matches, whether the broker sent that
// consumer REACHED_END_OF_TOPIC, once a FLOW of the last one is on record (nil before).
func (tg *diffTarget) toldPerSubscription(f wirerec.Filter) []bool {
	subs := tg.rec.Consumers(f)
	if len(subs) == 0 || len(tg.rec.Flows(wirerec.Filter{Consumer: &subs[len(subs)-1].ConsumerKey, Since: subs[len(subs)-1].Session})) == 0 {
		return nil
	}
	told := make([]bool, len(subs))
	for i, c := range subs {
		told[i] = len(tg.rec.Events(wirerec.Filter{Consumer: &c.ConsumerKey, Since: c.Session}, pb.BaseCommand_REACHED_END_OF_TOPIC)) > 0
	}
	return told
}

// eachButTheLast writes told as "told on each but the last of 3-4 subscriptions" when it is
// that, and as the list otherwise.
func eachButTheLast(told []bool) string {
	n := len(told)
	if n >= 3 && n <= 4 && !told[n-1] && !slices.Contains(told[:n-1], false) {
		return "told on each but the last of 3-4 subscriptions"
	}
	return fmt.Sprintf("told per subscription %v", told)
}

// within writes n as the range lo-hi when it falls in it: a count that Pulsar's timing moves
// within that range, so the test broker and Pulsar are compared on the range, not the number.
func within(n, lo, hi int) string {
	if n >= lo && n <= hi {
		return fmt.Sprintf("%d-%d", lo, hi)
	}
	return strconv.Itoa(n)
}

// GET .../partitions of a topic that does not exist, with and without checkAllowAutoCreation.
func diffPartitionsOfMissingTopic(tg *diffTarget, o *observation) {
	topic := tg.topic("never-created")
	for _, q := range []string{"", "?checkAllowAutoCreation=true", "?checkAllowAutoCreation=false"} {
		status, body, _ := tg.call(http.MethodGet, topic+"/partitions"+q, "")
		o.set("GET partitions"+q, "status=%d body=%s", status, strings.ReplaceAll(strings.TrimSpace(string(body)), tg.suffix, ""))
	}
	status, _, _ := tg.call(http.MethodGet, topic+"/stats", "")
	o.set("the topic after those calls", "status=%d", status)
	tg.sendN(tg.producer(tg.topic("created"), 0), "m", 1)
	status, body, _ := tg.call(http.MethodGet, tg.topic("created")+"/partitions", "")
	o.set("GET partitions of a non-partitioned topic", "status=%d body=%s", status, strings.TrimSpace(string(body)))
}
