package sidecar

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"io"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// BenchmarkFrameHotPath times what the sidecar does with every frame, without the network:
// reading and splitting a frame, decoding the commands the gates read, reading a MESSAGE's
// metadata, and framing a FLOW. BenchmarkSidecarThroughput times the whole path.
func BenchmarkFrameHotPath(b *testing.B) {
	message := benchMessageFrame(b, 100, 2000)
	flow := flowCommand(1, 1000)
	stream := func(frame []byte, n int) *bytes.Reader { return bytes.NewReader(bytes.Repeat(frame, n)) }
	const perRead = 1000
	b.Run("read-message", func(b *testing.B) {
		b.SetBytes(int64(len(message)))
		in := stream(message, perRead)
		r := bufio.NewReaderSize(in, bufferSize)
		for i := 0; b.Loop(); i++ {
			if i%perRead == 0 {
				_, _ = in.Seek(0, io.SeekStart)
				r.Reset(in)
			}
			f, err := readFrame(r, DefaultMaxFrameSize)
			if err != nil {
				b.Fatal(err)
			}
			cmd, err := f.decode()
			if err != nil || cmd.GetMessage() == nil {
				b.Fatal(err)
			}
			if e, err := readEntry(f.payload); err != nil || e.messages != 100 {
				b.Fatal(e, err)
			}
		}
	})
	b.Run("read-flow", func(b *testing.B) {
		in := stream(flow, perRead)
		r := bufio.NewReaderSize(in, bufferSize)
		for i := 0; b.Loop(); i++ {
			if i%perRead == 0 {
				_, _ = in.Seek(0, io.SeekStart)
				r.Reset(in)
			}
			f, err := readFrame(r, DefaultMaxFrameSize)
			if err != nil {
				b.Fatal(err)
			}
			if cmd, err := f.decode(); err != nil || cmd.GetFlow() == nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("read-passthrough", func(b *testing.B) { // a frame no gate reads: typed only
		ack := encodeCommand(&pb.BaseCommand{Type: pb.BaseCommand_ACK.Enum(), Ack: &pb.CommandAck{ConsumerId: proto.Uint64(1),
			AckType: pb.CommandAck_Individual.Enum(), MessageId: []*pb.MessageIdData{{LedgerId: proto.Uint64(3), EntryId: proto.Uint64(7)}}}})
		in := stream(ack, perRead)
		r := bufio.NewReaderSize(in, bufferSize)
		for i := 0; b.Loop(); i++ {
			if i%perRead == 0 {
				_, _ = in.Seek(0, io.SeekStart)
				r.Reset(in)
			}
			if f, err := readFrame(r, DefaultMaxFrameSize); err != nil || f.typ != pb.BaseCommand_ACK {
				b.Fatal(err)
			}
		}
	})
	b.Run("encode-flow", func(b *testing.B) {
		for b.Loop() {
			if len(flowCommand(1, 1000)) == 0 {
				b.Fatal("empty FLOW")
			}
		}
	})
}

// benchMessageFrame is a MESSAGE frame as a broker sends one: broker-entry metadata, checksum,
// metadata of a batch of messages, and a body of bodySize bytes.
func benchMessageFrame(b *testing.B, messages int32, bodySize int) []byte {
	b.Helper()
	cmd, err := proto.Marshal(&pb.BaseCommand{Type: pb.BaseCommand_MESSAGE.Enum(), Message: &pb.CommandMessage{
		ConsumerId: proto.Uint64(1), MessageId: &pb.MessageIdData{LedgerId: proto.Uint64(12), EntryId: proto.Uint64(345)}}})
	if err != nil {
		b.Fatal(err)
	}
	brokerEntry, _ := proto.Marshal(&pb.BrokerEntryMetadata{BrokerTimestamp: proto.Uint64(1700000000000), Index: proto.Uint64(99)})
	meta, _ := proto.Marshal(&pb.MessageMetadata{ProducerName: proto.String("standalone-0-1"), SequenceId: proto.Uint64(7),
		PublishTime: proto.Uint64(1700000000000), NumMessagesInBatch: proto.Int32(messages),
		Properties: []*pb.KeyValue{{Key: proto.String("k"), Value: proto.String("v")}}})
	checked := binary.BigEndian.AppendUint32(nil, uint32(len(meta)))
	checked = append(append(checked, meta...), make([]byte, bodySize)...)
	payload := binary.BigEndian.AppendUint16(nil, 0x0e02)
	payload = binary.BigEndian.AppendUint32(payload, uint32(len(brokerEntry)))
	payload = append(payload, brokerEntry...)
	payload = binary.BigEndian.AppendUint16(payload, 0x0e01)
	payload = binary.BigEndian.AppendUint32(payload, crc32.Checksum(checked, crc32.MakeTable(crc32.Castagnoli)))
	payload = append(payload, checked...)
	frame := binary.BigEndian.AppendUint32(nil, uint32(4+len(cmd)+len(payload)))
	frame = binary.BigEndian.AppendUint32(frame, uint32(len(cmd)))
	return append(append(frame, cmd...), payload...)
}
