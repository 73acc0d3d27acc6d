package sidecar

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/subflow-dev/subflow/agent/protocol"
	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
)

// chunkFrame is a MESSAGE for consumer 1 carrying chunk id of a message sent in chunks.
func chunkFrame(uuid string, id, chunks int32, entryID uint64) []byte {
	meta, _ := proto.Marshal(&pb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(1), PublishTime: proto.Uint64(1)})
	meta = protowire.AppendTag(meta, fieldMetadataUUID, protowire.BytesType)
	meta = protowire.AppendString(meta, uuid)
	meta = protowire.AppendTag(meta, fieldMetadataNumChunks, protowire.VarintType)
	meta = protowire.AppendVarint(meta, uint64(chunks))
	meta = protowire.AppendTag(meta, fieldMetadataChunkID, protowire.VarintType)
	meta = protowire.AppendVarint(meta, uint64(id))
	payload := append(binary.BigEndian.AppendUint32(nil, uint32(len(meta))), meta...)
	payload = append(payload, "chunk"...)
	cmd, _ := proto.Marshal(&pb.BaseCommand{Type: pb.BaseCommand_MESSAGE.Enum(), Message: &pb.CommandMessage{
		ConsumerId: proto.Uint64(1), MessageId: &pb.MessageIdData{LedgerId: proto.Uint64(1), EntryId: proto.Uint64(entryID)}}})
	frame := binary.BigEndian.AppendUint32(nil, uint32(4+len(cmd)+len(payload)))
	frame = binary.BigEndian.AppendUint32(frame, uint32(len(cmd)))
	return append(append(frame, cmd...), payload...)
}

// scriptedBroker answers PINGs and lets the test send frames; it reports every other command
// it receives.
func scriptedBroker(t *testing.T) (addr string, conns chan net.Conn, received chan *pb.BaseCommand) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	conns = make(chan net.Conn, 1)
	received = make(chan *pb.BaseCommand, 100)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		conns <- nc
		r := bufio.NewReader(nc)
		for {
			f, err := readFrame(r, DefaultMaxFrameSize)
			if err != nil {
				return
			}
			if f.typ == pb.BaseCommand_PING {
				_, _ = nc.Write(encodeCommand(&pb.BaseCommand{Type: pb.BaseCommand_PONG.Enum(), Pong: &pb.CommandPong{}}))
				continue
			}
			cmd, err := f.decode()
			if err != nil {
				return
			}
			select {
			case received <- cmd:
			default:
			}
		}
	}()
	return ln.Addr().String(), conns, received
}

// nextCommand returns the next command of type typ the scripted broker received, skipping
// others.
func nextCommand(t *testing.T, received chan *pb.BaseCommand, typ pb.BaseCommand_Type) *pb.BaseCommand {
	t.Helper()
	deadline := time.After(waitFor)
	for {
		select {
		case cmd := <-received:
			if cmd.GetType() == typ {
				return cmd
			}
		case <-deadline:
			t.Fatalf("the broker received no %v within %v", typ, waitFor)
		}
	}
}

// nextMessages reads the client's frames up to the next PING (the broker's marker) and
// returns the entry ids of the MESSAGEs among them.
func nextMessages(t *testing.T, r *bufio.Reader) []uint64 {
	t.Helper()
	ids, _ := nextFrames(t, r)
	return ids
}

// nextFrames is nextMessages that also returns the type of each frame before the PING.
func nextFrames(t *testing.T, r *bufio.Reader) (ids []uint64, types []pb.BaseCommand_Type) {
	t.Helper()
	for {
		f, err := readFrame(r, DefaultMaxFrameSize)
		if err != nil {
			t.Fatal(err)
		}
		if f.typ == pb.BaseCommand_PING {
			return ids, types
		}
		types = append(types, f.typ)
		if f.typ == pb.BaseCommand_MESSAGE {
			cmd, _ := f.decode()
			ids = append(ids, cmd.GetMessage().GetMessageId().GetEntryId())
		}
	}
}

// scripted is a sidecar between a scripted broker and a raw client whose consumer 1 has
// subscribed (Shared) and granted its first permits.
type scripted struct {
	consumer    *Consumer
	send        func(frames ...[]byte) // from the broker
	client      net.Conn
	fromSidecar *bufio.Reader // what reaches the client
	received    chan *pb.BaseCommand
}

func startScripted(t *testing.T, o Options, permits uint32) *scripted {
	t.Helper()
	addr, conns, received := scriptedBroker(t)
	o.BrokerURL = "pulsar://" + addr
	sc, url := startSidecar(t, o)
	client, err := net.Dial("tcp", url[len("pulsar://"):])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	subscribe := encodeCommand(&pb.BaseCommand{Type: pb.BaseCommand_SUBSCRIBE.Enum(), Subscribe: &pb.CommandSubscribe{
		Topic: proto.String("persistent://public/default/chunks"), Subscription: proto.String("s"), SubType: pb.CommandSubscribe_Shared.Enum(),
		ConsumerId: proto.Uint64(1), RequestId: proto.Uint64(1), ConsumerName: proto.String("c1")}})
	if _, err := client.Write(append(append(connectFrame(), subscribe...), flowCommand(1, permits)...)); err != nil {
		t.Fatal(err)
	}
	broker := <-conns
	send := func(frames ...[]byte) {
		for _, f := range frames {
			if _, err := broker.Write(f); err != nil {
				t.Fatal(err)
			}
		}
	}
	nextCommand(t, received, pb.BaseCommand_SUBSCRIBE)
	send(successCommand(1))
	return &scripted{consumer: consumerNamed(t, sc, "s", "c1"), send: send, client: client,
		fromSidecar: bufio.NewReader(client), received: received}
}

// While paused, the rest of a chunked message the client has begun still reaches it (its
// incomplete-chunk expiry would discard it during a long pause); a chunked message not begun
// is held like any message, and comes first on resume.
func TestPauseCompletesChunkedMessagesTheClientBegan(t *testing.T) {
	sb := startScripted(t, Options{}, 100)
	c, send, fromSidecar := sb.consumer, sb.send, sb.fromSidecar
	send(chunkFrame("a", 0, 3, 10), pingFrame)
	if got := nextMessages(t, fromSidecar); len(got) != 1 {
		t.Fatalf("before the pause the client got entries %v, want [10]", got)
	}

	if err := c.SetState(context.Background(), protocol.Paused, 1); err != nil {
		t.Fatal(err)
	}
	send(chunkFrame("a", 1, 3, 11), chunkFrame("b", 0, 2, 12), chunkFrame("a", 2, 3, 13), chunkFrame("b", 1, 2, 14), pingFrame)
	if got := nextMessages(t, fromSidecar); len(got) != 2 || got[0] != 11 || got[1] != 13 {
		t.Fatalf("while paused the client got entries %v, want [11 13]: the rest of the chunked message it had begun", got)
	}
	if held := c.Counts().Held; held != 2 {
		t.Fatalf("%d held, want the 2 chunks of the message not begun", held)
	}

	if err := c.SetState(context.Background(), protocol.Running, 2); err != nil {
		t.Fatal(err)
	}
	send(pingFrame)
	if got := nextMessages(t, fromSidecar); len(got) != 2 || got[0] != 12 || got[1] != 14 {
		t.Fatalf("on resume the client got entries %v, want [12 14]", got)
	}
}

// Chunked messages from a real producer through the sidecar, with a pause while they are
// being consumed: every message arrives whole, none lost.
func TestChunkedMessagesThroughAPause(t *testing.T) {
	w := newWorld(t)
	topic := uniqueTopic(t)
	client := newClient(t, w.url)
	cons := collect(t, subscribe(t, client, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s", Name: "c1", ReceiverQueueSize: 4}))
	p, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true, EnableChunking: true, ChunkMaxMessageSize: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var sent []string
	for i := range 20 {
		v := fmt.Sprintf("%d-%s", i, strings.Repeat("x", 5000))
		if _, err := p.Send(context.Background(), &pulsar.ProducerMessage{Payload: []byte(v)}); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, v)
	}
	eventually(t, "the first chunked message", func() bool { return len(cons.values()) > 0 })
	c := consumerNamed(t, w.sidecar, "s", "c1")
	setState(t, c, protocol.Paused)
	eventually(t, "the pause to hold or withhold something (unless all had arrived)", func() bool {
		n := c.Counts()
		return n.Owed > 0 || n.Held > 0 || len(missing(sent, cons.values())) == 0
	})
	setState(t, c, protocol.Running)
	eventually(t, "every chunked message, whole", func() bool { return len(missing(sent, cons.values())) == 0 })
}

// A pause far longer than the client's incomplete-chunk expiry, taken while the client holds
// the first chunks of messages from interleaving producers and has no permits left: every
// message still reaches the application whole (pulsar-client-go would otherwise expire the
// begun messages and acknowledge their chunks), in the default and the strict mode, with
// receiver queues of 1, 4 and the default.
func TestLongPauseLosesNoChunkedMessage(t *testing.T) {
	const expiry, pause = time.Second, 2500 * time.Millisecond
	for _, strict := range []bool{false, true} {
		w := newWorld(t, Options{StrictPause: strict})
		for _, queue := range []int{1, 4, 0} {
			t.Run(fmt.Sprintf("strict=%v/queue=%d", strict, queue), func(t *testing.T) {
				t.Parallel()
				topic := uniqueTopic(t)
				client := newClient(t, w.url)
				name := fmt.Sprintf("queue-%d", queue) // the subtests share the sidecar
				cons := subscribe(t, client, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s", Name: name,
					ReceiverQueueSize: queue, ExpireTimeOfIncompleteChunk: expiry})
				sent := produceChunkedInterleaved(t, client, topic, 2, 15)
				c := consumerNamed(t, w.sidecar, "s", name)
				var got []string
				for round := range 3 {
					got = append(got, receiveN(t, cons, 3)...)
					setState(t, c, protocol.Paused)
					paused := w.rec.Mark()
					<-time.After(pause) // the pause's length is what is tested
					for _, f := range w.rec.Flows(wirerec.Filter{Topic: topic, Since: paused}) {
						if f.Permits != 1 {
							t.Fatalf("a FLOW of %d permits while paused: only single permits for the rest of begun chunked messages may go", f.Permits)
						}
					}
					setState(t, c, protocol.Running)
					t.Logf("round %d: %d received, counts %+v", round, len(got), c.Counts())
				}
				ctx, cancel := context.WithTimeout(context.Background(), waitFor)
				defer cancel()
				for len(missing(sent, got)) > 0 {
					m, err := cons.Receive(ctx)
					if err != nil {
						t.Fatalf("%d of %d messages never arrived (%v): %v", len(missing(sent, got)), len(sent), err, chunkedNames(missing(sent, got)))
					}
					_ = cons.Ack(m)
					got = append(got, string(m.Payload()))
				}
			})
		}
	}
}

// The same with the Java client, which does not acknowledge an expired chunked message: without
// the rest of its chunks the message would stall, unacknowledged, until a reconnect.
func TestLongPauseLosesNoChunkedMessageJava(t *testing.T) {
	needRealBroker(t)
	const expiry, pause = time.Second, 2500 * time.Millisecond
	for _, strict := range []bool{false, true} {
		t.Run(fmt.Sprintf("strict=%v", strict), func(t *testing.T) {
			w := newWorld(t, Options{StrictPause: strict})
			topic := uniqueTopic(t)
			app := startPeer(t, "java", w.url, peerOptions{topic: topic, subscription: "s", name: "java", subType: "Exclusive",
				queue: 4, delayMs: 50, chunkExpiryMs: int(expiry / time.Millisecond)})
			sent := produceChunkedInterleaved(t, newClient(t, w.url), topic, 2, 15)
			c := consumerNamed(t, w.sidecar, "s", "java")
			for range 3 {
				n := app.count()
				eventually(t, "three more messages", func() bool { return app.count() >= n+3 || len(missing(sent, app.messages())) == 0 })
				setState(t, c, protocol.Paused)
				<-time.After(pause) // the pause's length is what is tested
				setState(t, c, protocol.Running)
			}
			eventually(t, "every chunked message, whole", func() bool { return len(missing(sent, app.messages())) == 0 })
		})
	}
}

// produceChunkedInterleaved sends perProducer messages of three chunks from each of
// producers concurrent producers, so that their chunks interleave on the topic, and returns
// the payloads once every send is confirmed.
func produceChunkedInterleaved(t *testing.T, client pulsar.Client, topic string, producers, perProducer int) []string {
	t.Helper()
	errs := make(chan error, producers*perProducer)
	var sent []string
	for p := range producers {
		prod, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true, EnableChunking: true, ChunkMaxMessageSize: 1024})
		if err != nil {
			t.Fatal(err)
		}
		defer prod.Close()
		for i := range perProducer {
			v := fmt.Sprintf("p%d-%d-%s", p, i, strings.Repeat("x", 2500))
			sent = append(sent, v)
			prod.SendAsync(context.Background(), &pulsar.ProducerMessage{Payload: []byte(v)},
				func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) { errs <- err })
		}
	}
	for range producers * perProducer {
		if err := <-errs; err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	return sent
}

// chunkedNames shortens payloads of produceChunkedInterleaved to their producer and number.
func chunkedNames(values []string) []string {
	out := make([]string, len(values))
	for i, v := range values {
		out[i] = strings.Join(strings.SplitN(v, "-", 3)[:2], "-")
	}
	return out
}

// Paused with the client's permits spent while it holds the first chunk of a message, the
// sidecar asks the broker for one entry at a time until the message is complete: the chunks go
// to the client, another message's are held, and no permit is asked for after the last chunk.
func TestPausedWithoutPermitsAsksForTheRestOfABegunChunkedMessage(t *testing.T) {
	for _, strict := range []bool{false, true} {
		t.Run(fmt.Sprintf("strict=%v", strict), func(t *testing.T) {
			sb := startScripted(t, Options{StrictPause: strict}, 1)
			if got := nextCommand(t, sb.received, pb.BaseCommand_FLOW).GetFlow().GetMessagePermits(); got != 1 {
				t.Fatalf("the client's FLOW reached the broker with %d permits, want 1", got)
			}
			sb.send(chunkFrame("a", 0, 3, 10), pingFrame)
			if got := nextMessages(t, sb.fromSidecar); len(got) != 1 {
				t.Fatalf("before the pause the client got entries %v, want [10]", got)
			}
			paused := make(chan error, 1)
			go func() { paused <- sb.consumer.SetState(context.Background(), protocol.Paused, 1) }()
			for _, next := range [][]byte{chunkFrame("b", 0, 2, 11), chunkFrame("a", 1, 3, 12), chunkFrame("a", 2, 3, 13)} {
				if got := nextCommand(t, sb.received, pb.BaseCommand_FLOW).GetFlow().GetMessagePermits(); got != 1 {
					t.Fatalf("paused with a chunked message begun, the broker was granted %d permits, want 1", got)
				}
				sb.send(next)
			}
			sb.send(pingFrame)
			got, types := nextFrames(t, sb.fromSidecar)
			if len(got) != 2 || got[0] != 12 || got[1] != 13 {
				t.Fatalf("while paused the client got entries %v, want [12 13]: the rest of the message it had begun", got)
			}
			if strict {
				// The strict pause detaches the client once the message is complete.
				if want := []pb.BaseCommand_Type{pb.BaseCommand_MESSAGE, pb.BaseCommand_MESSAGE, pb.BaseCommand_CLOSE_CONSUMER}; !slices.Equal(types, want) {
					t.Fatalf("while paused the client got %v, want %v", types, want)
				}
				resubscribe := encodeCommand(&pb.BaseCommand{Type: pb.BaseCommand_SUBSCRIBE.Enum(), Subscribe: &pb.CommandSubscribe{
					Topic: proto.String("persistent://public/default/chunks"), Subscription: proto.String("s"), SubType: pb.CommandSubscribe_Shared.Enum(),
					ConsumerId: proto.Uint64(1), RequestId: proto.Uint64(2), ConsumerName: proto.String("c1")}})
				if _, err := sb.client.Write(resubscribe); err != nil {
					t.Fatal(err)
				}
			}
			if err := <-paused; err != nil {
				t.Fatal(err)
			}
			if held := sb.consumer.Counts().Held; held != 1 {
				t.Fatalf("%d held, want the first chunk of the message not begun", held)
			}
			// Nothing more is asked for: the next FLOW the broker sees is the client's own,
			// forwarded on resume.
			if err := sb.consumer.SetState(context.Background(), protocol.Running, 2); err != nil {
				t.Fatal(err)
			}
			if _, err := sb.client.Write(flowCommand(1, 7)); err != nil {
				t.Fatal(err)
			}
			if got := nextCommand(t, sb.received, pb.BaseCommand_FLOW).GetFlow().GetMessagePermits(); got == 1 {
				t.Fatal("a permit was asked for after the chunked message was complete")
			}
		})
	}
}
