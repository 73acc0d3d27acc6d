package sidecar

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// fakeBroker accepts one connection and keeps every byte it receives; the test writes what
// the broker answers.
type fakeBroker struct {
	ln   net.Listener
	mu   sync.Mutex
	got  bytes.Buffer
	conn chan net.Conn
}

func startFakeBroker(t *testing.T) *fakeBroker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fb := &fakeBroker{ln: ln, conn: make(chan net.Conn, 1)}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		t.Cleanup(func() { _ = nc.Close() })
		fb.conn <- nc
		buf := make([]byte, 4096)
		for {
			n, err := nc.Read(buf)
			fb.mu.Lock()
			fb.got.Write(buf[:n])
			fb.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return fb
}

func (fb *fakeBroker) received() []byte {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	return bytes.Clone(fb.got.Bytes())
}

// rawFrame builds a frame of a command type the generated subset does not know, with an
// unknown field and a payload.
func rawFrame(commandType uint64, payload string) []byte {
	cmd := protowire.AppendTag(nil, 1, protowire.VarintType)
	cmd = protowire.AppendVarint(cmd, commandType)
	cmd = protowire.AppendTag(cmd, 77, protowire.BytesType)
	cmd = protowire.AppendString(cmd, "a field nobody here knows")
	frame := binary.BigEndian.AppendUint32(nil, uint32(4+len(cmd)+len(payload)))
	frame = binary.BigEndian.AppendUint32(frame, uint32(len(cmd)))
	return append(append(frame, cmd...), payload...)
}

// Frames the gate does not change pass byte for byte in both directions, command types
// unknown to this package included, and the CONNECT with its authentication data.
func TestFramesPassByteForByte(t *testing.T) {
	fb := startFakeBroker(t)
	_, url := startSidecar(t, Options{BrokerURL: "pulsar://" + fb.ln.Addr().String()})
	nc, err := net.Dial("tcp", url[len("pulsar://"):])
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	connect := encodeCommand(&pb.BaseCommand{Type: pb.BaseCommand_CONNECT.Enum(), Connect: &pb.CommandConnect{
		ClientVersion: proto.String("raw"), ProtocolVersion: proto.Int32(20),
		AuthMethodName: proto.String("token"), AuthData: []byte("the application's own token")}})
	producer := encodeCommand(&pb.BaseCommand{Type: pb.BaseCommand_PRODUCER.Enum(), Producer: &pb.CommandProducer{
		Topic: proto.String("persistent://public/default/t"), ProducerId: proto.Uint64(1), RequestId: proto.Uint64(1)}})
	fromClient := bytes.Join([][]byte{connect, rawFrame(200, "unknown from the client"), producer,
		rawFrame(uint64(pb.BaseCommand_AUTH_RESPONSE), "auth answer")}, nil)
	if _, err := nc.Write(fromClient); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the broker to receive every byte", func() bool { return len(fb.received()) >= len(fromClient) })
	if got := fb.received(); !bytes.Equal(got, fromClient) {
		t.Fatalf("the broker received other bytes than the client sent:\n got %x\nwant %x", got, fromClient)
	}

	brokerSide := <-fb.conn
	fromBroker := bytes.Join([][]byte{rawFrame(uint64(pb.BaseCommand_CONNECTED), ""), rawFrame(201, "unknown from the broker"),
		rawFrame(uint64(pb.BaseCommand_AUTH_CHALLENGE), "challenge")}, nil)
	if _, err := brokerSide.Write(fromBroker); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(fromBroker))
	if _, err := io.ReadFull(nc, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, fromBroker) {
		t.Fatalf("the client received other bytes than the broker sent:\n got %x\nwant %x", got, fromBroker)
	}
}
