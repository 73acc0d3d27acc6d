package pulsartest

import (
	"github.com/apache/pulsar-client-go/pulsar"

	"bufio"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"net"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// rawClient speaks the binary protocol directly, for behaviours that
// pulsar-client-go does not let a test provoke (it refuses a cumulative ack
// on Shared, resends only on reconnect, and refills permits by itself).
type rawClient struct {
	t      testing.TB
	nc     net.Conn
	mu     sync.Mutex
	frames []*pb.BaseCommand
	eof    bool // the broker closed the connection
}

func dialRaw(t testing.TB, b *Broker) *rawClient {
	t.Helper()
	return dialRawURL(t, b.ServiceURL())
}

// dialRawURL connects a raw client to any broker (or a recorder in front
// of one) at a pulsar:// URL.
func dialRawURL(t testing.TB, url string) *rawClient {
	t.Helper()
	nc, err := net.Dial("tcp", strings.TrimPrefix(url, "pulsar://"))
	if err != nil {
		t.Fatal(err)
	}
	rc := &rawClient{t: t, nc: nc}
	t.Cleanup(func() { _ = nc.Close() })
	go func() {
		r := bufio.NewReader(nc)
		for {
			cmd, _, err := readFrame(r, 1<<30) // a client takes what the broker sends
			if err != nil {
				rc.mu.Lock()
				rc.eof = true
				rc.mu.Unlock()
				return
			}
			rc.mu.Lock()
			rc.frames = append(rc.frames, cmd)
			rc.mu.Unlock()
		}
	}()
	rc.send(&pb.BaseCommand{Type: pb.BaseCommand_CONNECT.Enum(), Connect: &pb.CommandConnect{ClientVersion: ptr("raw"), ProtocolVersion: ptr(int32(20))}})
	rc.await("CONNECTED", func(c *pb.BaseCommand) bool { return c.GetType() == pb.BaseCommand_CONNECTED })
	return rc
}

func (rc *rawClient) send(cmd *pb.BaseCommand, payload ...[]byte) {
	rc.t.Helper()
	if _, err := rc.nc.Write(pb.AppendFrame(nil, cmd, payload...)); err != nil {
		rc.t.Fatal(err)
	}
}

// await waits for a frame matching match and returns it.
func (rc *rawClient) await(what string, match func(*pb.BaseCommand) bool) *pb.BaseCommand {
	rc.t.Helper()
	var got *pb.BaseCommand
	testkit.Eventually(rc.t, waitFor, what, func() bool {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		for _, c := range rc.frames {
			if match(c) {
				got = c
				return true
			}
		}
		return false
	})
	return got
}

// messages returns the MESSAGE frames received so far.
func (rc *rawClient) messages() []*pb.CommandMessage {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []*pb.CommandMessage
	for _, c := range rc.frames {
		if c.GetType() == pb.BaseCommand_MESSAGE {
			out = append(out, c.GetMessage())
		}
	}
	return out
}

func (rc *rawClient) subscribe(topic, sub string, kind pb.CommandSubscribe_SubType, consumerID uint64) {
	rc.t.Helper()
	rc.send(&pb.BaseCommand{Type: pb.BaseCommand_SUBSCRIBE.Enum(), Subscribe: &pb.CommandSubscribe{
		Topic: ptr(topic), Subscription: ptr(sub), SubType: kind.Enum(), ConsumerId: ptr(consumerID),
		RequestId: ptr(consumerID + 1000), ConsumerName: ptr(fmt.Sprintf("raw-%d", consumerID)), InitialPosition: pb.CommandSubscribe_Earliest.Enum(),
	}})
	rc.await("subscribed", func(c *pb.BaseCommand) bool { return c.GetSuccess().GetRequestId() == consumerID+1000 })
}

func (rc *rawClient) flow(consumerID uint64, permits uint32) {
	rc.send(&pb.BaseCommand{Type: pb.BaseCommand_FLOW.Enum(), Flow: &pb.CommandFlow{ConsumerId: ptr(consumerID), MessagePermits: ptr(permits)}})
}

// sendPayload is a SEND body: checksum, metadata and payload.
func sendPayload(meta *pb.MessageMetadata, payload []byte) []byte {
	m, _ := proto.Marshal(meta)
	body := binary.BigEndian.AppendUint32(nil, uint32(len(m)))
	body = append(append(body, m...), payload...)
	out := binary.BigEndian.AppendUint16(nil, pb.MagicChecksum)
	out = binary.BigEndian.AppendUint32(out, crc32.Checksum(body, pb.Castagnoli))
	return append(out, body...)
}

// An Exclusive consumer subscribing while the subscription's holder sits on a connection that
// answers no PING: the broker checks the holder's liveness, closes its connection and admits
// the newcomer (AbstractDispatcherSingleActiveConsumer.addConsumer, checkConnectionLiveness),
// so a client reconnecting before its old connection is noticed gone is not refused. A live
// holder still refuses a second Exclusive consumer.
func TestExclusiveSubscribeChecksTheHoldersLiveness(t *testing.T) {
	b := Start(t)
	silent := dialRaw(t, b) // reads, never answers
	silent.subscribe("excl", "sub", pb.CommandSubscribe_Exclusive, 1)
	c := newClient(t, b)
	if _, err := c.Subscribe(pulsar.ConsumerOptions{Topic: "excl", SubscriptionName: "sub", Type: pulsar.Exclusive}); err != nil {
		t.Fatalf("subscribe next to a dead holder: %v", err)
	}
	silent.await("the liveness PING", func(cmd *pb.BaseCommand) bool { return cmd.GetType() == pb.BaseCommand_PING })
	other := newClient(t, b)
	_, err := other.Subscribe(pulsar.ConsumerOptions{Topic: "excl", SubscriptionName: "sub", Type: pulsar.Exclusive})
	if err == nil || !strings.Contains(err.Error(), "ConsumerBusy") {
		t.Fatalf("a second Exclusive consumer next to a live holder: %v, want ConsumerBusy", err)
	}
}

// producer creates a producer on the connection and waits for its PRODUCER_SUCCESS.
func (rc *rawClient) producer(topic string, producerID uint64, name string) {
	rc.t.Helper()
	reqID := producerID + 2000
	rc.send(&pb.BaseCommand{Type: pb.BaseCommand_PRODUCER.Enum(), Producer: &pb.CommandProducer{
		Topic: ptr(topic), ProducerId: ptr(producerID), RequestId: ptr(reqID), ProducerName: ptr(name),
	}})
	rc.await("producer "+name, func(c *pb.BaseCommand) bool { return c.GetProducerSuccess().GetRequestId() == reqID })
}

// sendFrameOfSize writes a SEND whose frame size field (the bytes after it) is exactly size,
// its payload padded to fit. The write may fail half-way: a broker that refuses the frame
// closes the connection as soon as it reads the size.
func (rc *rawClient) sendFrameOfSize(producerID, seq uint64, name string, size int) {
	rc.t.Helper()
	cmd := &pb.BaseCommand{Type: pb.BaseCommand_SEND.Enum(), Send: &pb.CommandSend{ProducerId: ptr(producerID), SequenceId: ptr(seq)}}
	meta := &pb.MessageMetadata{ProducerName: ptr(name), SequenceId: ptr(seq), PublishTime: ptr(uint64(1))}
	fixed := 4 + proto.Size(cmd) + 2 + 4 + 4 + proto.Size(meta) // cmdSize, command, magic, checksum, metaSize, metadata
	if size < fixed {
		rc.t.Fatalf("a SEND frame cannot be %d bytes (at least %d)", size, fixed)
	}
	frame := pb.AppendFrame(nil, cmd, sendPayload(meta, make([]byte, size-fixed)))
	if got := int(binary.BigEndian.Uint32(frame)); got != size {
		rc.t.Fatalf("built a frame of %d bytes, want %d", got, size)
	}
	_, _ = rc.nc.Write(frame)
}

// answerTo returns what the broker answered to a SEND: "receipt", "error <code>", or "" for
// nothing yet.
func (rc *rawClient) answerTo(producerID, seq uint64) string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, c := range rc.frames {
		if r := c.GetSendReceipt(); r != nil && r.GetProducerId() == producerID && r.GetSequenceId() == seq {
			return "receipt"
		}
		if e := c.GetSendError(); e != nil && e.GetProducerId() == producerID && e.GetSequenceId() == seq {
			return "error " + e.GetError().String()
		}
	}
	return ""
}

func (rc *rawClient) closed() bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.eof
}

// roundTrip sends a PING and waits for its PONG: whatever the broker queued on the
// connection before it answered has arrived.
func (rc *rawClient) roundTrip() {
	rc.t.Helper()
	count := func() int {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		n := 0
		for _, c := range rc.frames {
			if c.GetType() == pb.BaseCommand_PONG {
				n++
			}
		}
		return n
	}
	before := count()
	rc.send(&pb.BaseCommand{Type: pb.BaseCommand_PING.Enum(), Ping: &pb.CommandPing{}})
	testkit.Eventually(rc.t, waitFor, "PONG", func() bool { return count() > before })
}

// ackWait acknowledges entries individually and waits for the broker's ACK_RESPONSE.
func (rc *rawClient) ackWait(consumerID, reqID uint64, ids ...*pb.MessageIdData) {
	rc.t.Helper()
	rc.send(&pb.BaseCommand{Type: pb.BaseCommand_ACK.Enum(), Ack: &pb.CommandAck{
		ConsumerId: ptr(consumerID), AckType: pb.CommandAck_Individual.Enum(), MessageId: ids, RequestId: ptr(reqID),
	}})
	rc.await("ack response", func(c *pb.BaseCommand) bool { return c.GetAckResponse().GetRequestId() == reqID })
}

// reachedEnd counts the REACHED_END_OF_TOPIC frames for a consumer received so far.
func (rc *rawClient) reachedEnd(consumerID uint64) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	n := 0
	for _, c := range rc.frames {
		if c.GetType() == pb.BaseCommand_REACHED_END_OF_TOPIC && c.GetReachedEndOfTopic().GetConsumerId() == consumerID {
			n++
		}
	}
	return n
}

// messagesFor returns the ids of the MESSAGE frames for a consumer received so far.
func (rc *rawClient) messagesFor(consumerID uint64) []*pb.MessageIdData {
	var out []*pb.MessageIdData
	for _, m := range rc.messages() {
		if m.GetConsumerId() == consumerID {
			out = append(out, m.GetMessageId())
		}
	}
	return out
}
