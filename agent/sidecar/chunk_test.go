package sidecar

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/subflow-dev/subflow/agent/protocol"
	pb "github.com/subflow-dev/subflow/internal/pulsarpb"
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

// scriptedBroker answers PINGs and lets the test send frames; it reports the type of every
// other frame it receives.
func scriptedBroker(t *testing.T) (addr string, conns chan net.Conn, received chan pb.BaseCommand_Type) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	conns = make(chan net.Conn, 1)
	received = make(chan pb.BaseCommand_Type, 100)
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
			select {
			case received <- f.typ:
			default:
			}
		}
	}()
	return ln.Addr().String(), conns, received
}

// nextMessages reads the client's frames up to the next PING (the broker's marker) and
// returns the entry ids of the MESSAGEs among them.
func nextMessages(t *testing.T, r *bufio.Reader) []uint64 {
	t.Helper()
	var ids []uint64
	for {
		f, err := readFrame(r, DefaultMaxFrameSize)
		if err != nil {
			t.Fatal(err)
		}
		switch f.typ {
		case pb.BaseCommand_PING:
			return ids
		case pb.BaseCommand_MESSAGE:
			cmd, _ := f.decode()
			ids = append(ids, cmd.GetMessage().GetMessageId().GetEntryId())
		}
	}
}

// While paused, the rest of a chunked message the client has begun still reaches it (its
// incomplete-chunk expiry would discard it during a long pause); a chunked message not begun
// is held like any message, and comes first on resume.
func TestPauseCompletesChunkedMessagesTheClientBegan(t *testing.T) {
	addr, conns, received := scriptedBroker(t)
	sc, url := startSidecar(t, Options{BrokerURL: "pulsar://" + addr})
	client, err := net.Dial("tcp", url[len("pulsar://"):])
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	subscribe := encodeCommand(&pb.BaseCommand{Type: pb.BaseCommand_SUBSCRIBE.Enum(), Subscribe: &pb.CommandSubscribe{
		Topic: proto.String("persistent://public/default/chunks"), Subscription: proto.String("s"), SubType: pb.CommandSubscribe_Shared.Enum(),
		ConsumerId: proto.Uint64(1), RequestId: proto.Uint64(1), ConsumerName: proto.String("c1")}})
	if _, err := client.Write(append(append(connectFrame(), subscribe...), flowCommand(1, 100)...)); err != nil {
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
	for typ := range received {
		if typ == pb.BaseCommand_SUBSCRIBE {
			break
		}
	}
	send(successCommand(1))
	c := consumerNamed(t, sc, "s", "c1")
	fromSidecar := bufio.NewReader(client)
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
