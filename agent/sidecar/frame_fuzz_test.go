package sidecar

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sync/semaphore"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// What reading and decoding a frame may allocate: the frame's buffer starts at firstChunk and
// doubles as its bytes arrive, so the buffers of a frame add up to less than 4 times its size;
// a decoded command's Go structs take the most per byte of the frame for a repeated field of
// empty sub-messages (an ACK's message ids: two bytes each, a struct of 112 bytes and a
// pointer each, about 80 bytes a byte); decodeAllocPerByte leaves room for both.
// frameAllocSlack covers what a call allocates whatever its input (errors, decoder state).
const (
	decodeAllocPerByte = 128
	frameAllocSlack    = 64 << 10
)

// frameAllocBound is the most that reading and handling frames from n bytes may allocate.
func frameAllocBound(n int) uint64 {
	return uint64(decodeAllocPerByte*n + firstChunk + frameAllocSlack)
}

// The commands the sidecar decodes, by the side that sends them (conn.go fromClient,
// clientAck, dialFor; fromBroker). It routes the others by type and forwards their bytes.
var (
	clientDecodes = map[pb.BaseCommand_Type]bool{pb.BaseCommand_CONNECT: true, pb.BaseCommand_SUBSCRIBE: true,
		pb.BaseCommand_FLOW: true, pb.BaseCommand_CLOSE_CONSUMER: true, pb.BaseCommand_UNSUBSCRIBE: true, pb.BaseCommand_ACK: true}
	brokerDecodes = map[pb.BaseCommand_Type]bool{pb.BaseCommand_MESSAGE: true, pb.BaseCommand_SUCCESS: true,
		pb.BaseCommand_ERROR: true, pb.BaseCommand_CLOSE_CONSUMER: true, pb.BaseCommand_LOOKUP_RESPONSE: true,
		pb.BaseCommand_CONNECTED: true}
)

// FuzzClientFrames reads what a client sends as the sidecar does: a frame carrying cmd (framed
// here, so that the fuzzer reaches the command decoding), then rest as more frames. Every
// frame read is the client's bytes unchanged; a command is routed by the type the broker reads
// and, where the gate decodes it, decoded as the broker decodes it, or refused; a command as a
// client's protobuf encoder writes it is never refused; the frames give back the memory they
// took; and no input allocates more than frameAllocBound.
func FuzzClientFrames(f *testing.F) {
	for _, cmd := range [][]byte{connectFrame(), subscribeFrame("persistent://public/default/t", "c", 1),
		flowCommand(1, 1000), closeConsumerCommand(1, 2), redeliverAllCommand(1), pingFrame, ackFrame(3, 7, 2, bitsExcept(10, 2))} {
		f.Add(cmd[8:], pingFrame)
	}
	for _, cmd := range ambiguousCommands() {
		f.Add(cmd, flowCommand(1, 500))
	}
	// The most a command's structs take per byte: an ACK of empty message ids.
	manyIDs := protowire.AppendVarint(protowire.AppendTag(nil, fieldCommandType, protowire.VarintType), uint64(pb.BaseCommand_ACK))
	manyIDs = protowire.AppendBytes(protowire.AppendTag(manyIDs, protowire.Number(pb.BaseCommand_ACK), protowire.BytesType),
		bytes.Repeat(protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType), nil), 100))
	f.Add(manyIDs, []byte(nil))
	announced := binary.BigEndian.AppendUint32(nil, DefaultMaxFrameSize) // a frame begun and not sent
	f.Add(flowCommand(1, 1)[8:], append(announced, 0))
	f.Add(pingFrame[8:], binary.BigEndian.AppendUint32(nil, DefaultMaxFrameSize+1))
	f.Add(pingFrame[8:], []byte{0, 0, 0, 4, 0, 0, 0, 9})
	warmUpFrames()
	f.Fuzz(func(t *testing.T, cmd, rest []byte) {
		stream := append(frameOf(cmd, nil), rest...)
		budget := semaphore.NewWeighted(DefaultFrameMemory)
		fr := frameReader{r: bufio.NewReaderSize(bytes.NewReader(stream), bufferSize), max: DefaultMaxFrameSize,
			budget: budget, life: context.Background()}
		var (
			frames  []frame
			decoded []*pb.BaseCommand
			refused []error
			readErr error
		)
		n := allocated(func() {
			for {
				f, release, err := fr.read(time.Time{})
				if err != nil {
					readErr = err
					return
				}
				var cmd *pb.BaseCommand
				if clientDecodes[f.typ] {
					cmd, err = f.decode()
				}
				release()
				frames, decoded, refused = append(frames, f), append(decoded, cmd), append(refused, err)
			}
		})
		if bound := frameAllocBound(len(stream)); n > bound {
			t.Fatalf("reading %d bytes of client frames allocated %d bytes, more than %d", len(stream), n, bound)
		}
		if !budget.TryAcquire(DefaultFrameMemory) {
			t.Fatal("the frames read did not give back the memory they took")
		}
		checkStream(t, stream, frames, readErr)
		for i, f := range frames {
			checkCommand(t, f, decoded[i], refused[i], clientDecodes)
		}
	})
}

// FuzzBrokerMessage reads a frame of the broker's, command cmd and payload payload, as the
// sidecar does: the command as FuzzClientFrames checks it, and a MESSAGE's metadata (the
// message count the gate debits, the chunk fields) read as a protobuf decoder reads it, or
// not at all.
func FuzzBrokerMessage(f *testing.F) {
	for _, raw := range brokerSeeds() {
		g, err := parseFrame(raw)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(g.cmd, g.payload)
	}
	warmUpFrames()
	f.Fuzz(func(t *testing.T, cmd, payload []byte) {
		stream := frameOf(cmd, payload)
		var (
			fr              frame
			decoded         *pb.BaseCommand
			e               entry
			readErr, decErr error
			entryErr        = errors.New("not read")
		)
		r := bufio.NewReaderSize(bytes.NewReader(stream), bufferSize)
		n := allocated(func() {
			if fr, readErr = readFrame(r, DefaultMaxFrameSize); readErr != nil {
				return
			}
			if brokerDecodes[fr.typ] {
				decoded, decErr = fr.decode()
			}
			if fr.typ == pb.BaseCommand_MESSAGE && decErr == nil {
				e, entryErr = readEntry(fr.payload)
			}
		})
		if bound := frameAllocBound(len(stream)); n > bound {
			t.Fatalf("reading a broker frame of %d bytes allocated %d bytes, more than %d", len(stream), n, bound)
		}
		if readErr != nil {
			if !errors.Is(readErr, errBadFrame) {
				t.Fatalf("a whole frame failed otherwise than as bad input: %v", readErr)
			}
			return
		}
		if !bytes.Equal(fr.raw, stream) || !bytes.Equal(fr.cmd, cmd) || !bytes.Equal(fr.payload, payload) {
			t.Fatal("the frame read is not the frame sent")
		}
		checkCommand(t, fr, decoded, decErr, brokerDecodes)
		if fr.typ == pb.BaseCommand_MESSAGE && decErr == nil {
			checkEntry(t, payload, e, entryErr)
		}
	})
}

// checkStream checks that the frames read are the stream's bytes, in order and unchanged, up
// to where reading stopped, and why it stopped.
func checkStream(t *testing.T, stream []byte, frames []frame, readErr error) {
	t.Helper()
	at := 0
	for _, f := range frames {
		if !bytes.HasPrefix(stream[at:], f.raw) || int(binary.BigEndian.Uint32(f.raw))+4 != len(f.raw) {
			t.Fatalf("frame at byte %d is not the bytes the client sent", at)
		}
		at += len(f.raw)
	}
	switch {
	case readErr == io.EOF && len(stream)-at >= 4: // fewer bytes than a frame's size field: nothing to forward
		t.Fatalf("reading ended at byte %d of %d as if the client had closed", at, len(stream))
	case !errors.Is(readErr, io.EOF) && !errors.Is(readErr, io.ErrUnexpectedEOF) && !errors.Is(readErr, errBadFrame):
		t.Fatalf("reading ended with %v", readErr)
	}
}

var (
	partial        = proto.UnmarshalOptions{AllowPartial: true}
	partialClean   = proto.UnmarshalOptions{AllowPartial: true, DiscardUnknown: true}
	partialMerging = proto.UnmarshalOptions{AllowPartial: true, Merge: true}
)

// checkCommand checks a frame read against protobuf decoders: Go's (proto.Unmarshal into the
// pb type) and the broker's (as lastWins models it). decoded and refused are what f.decode
// returned, when the sidecar decodes commands of the frame's type (decodes).
func checkCommand(t *testing.T, f frame, decoded *pb.BaseCommand, refused error, decodes map[pb.BaseCommand_Type]bool) {
	t.Helper()
	var std pb.BaseCommand
	stdErr := partial.Unmarshal(f.cmd, &std)
	switch {
	case stdErr == nil && std.Type != nil && std.GetType() != f.typ:
		t.Fatalf("routed as %v, a protobuf decoder reads %v", f.typ, std.GetType())
	case stdErr == nil && std.Type == nil && pb.BaseCommand_Type_name[int32(f.typ)] != "":
		t.Fatalf("routed as %v, a protobuf decoder reads no type", f.typ)
	}
	if decodes[f.typ] && refused == nil {
		if stdErr != nil {
			t.Fatalf("decoded a %v command protobuf refuses: %v", f.typ, stdErr)
		}
		if !proto.Equal(decoded, &std) {
			t.Fatalf("decoded %v, protobuf decodes %v", decoded, &std)
		}
		var broker pb.BaseCommand
		if err := lastWins(f.cmd, broker.ProtoReflect()); err != nil || !proto.Equal(decoded, &broker) {
			t.Fatalf("decoded %v, the broker decodes %v (%v)", decoded, &broker, err)
		}
	}
	if refused != nil && !errors.Is(refused, errBadFrame) {
		t.Fatalf("a command refused otherwise than as bad input: %v", refused)
	}

	// The same command as a client's encoder writes it: once, each field once, nothing unknown.
	var clean pb.BaseCommand
	if partialClean.Unmarshal(f.cmd, &clean) != nil || clean.Type == nil || !onlyOwnCommand(&clean) {
		return
	}
	enc, err := proto.MarshalOptions{AllowPartial: true, Deterministic: true}.Marshal(&clean)
	if err != nil {
		t.Fatal(err)
	}
	g, err := parseFrame(frameOf(enc, nil))
	if err != nil || g.typ != clean.GetType() {
		t.Fatalf("refused or misread a %v command as an encoder writes it (%v): %v", clean.GetType(), g.typ, err)
	}
	if decodes[g.typ] {
		if again, err := g.decode(); err != nil || !proto.Equal(again, &clean) {
			t.Fatalf("refused or misread a %v command as an encoder writes it: %v", g.typ, err)
		}
	}
}

// onlyOwnCommand tells whether a command carries no other command's field than its type's.
func onlyOwnCommand(cmd *pb.BaseCommand) bool {
	own := true
	cmd.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		if n := fd.Number(); n != fieldCommandType && n != protowire.Number(cmd.GetType()) {
			own = false
		}
		return own
	})
	return own
}

// lastWins decodes b into m as the broker's decoder (LightProto) does: as proto.Unmarshal,
// except that a singular sub-message given twice is replaced by the last one, not merged.
func lastWins(b []byte, m protoreflect.Message) error {
	for len(b) > 0 {
		num, wt, value, rest, err := pb.ConsumeField(b)
		if err != nil {
			return err
		}
		field := b[:len(b)-len(rest)]
		b = rest
		fd := m.Descriptor().Fields().ByNumber(num)
		if fd == nil || fd.Message() == nil || wt != protowire.BytesType {
			if err := partialMerging.Unmarshal(field, m.Interface()); err != nil {
				return err
			}
			continue
		}
		inner, _ := protowire.ConsumeBytes(value)
		if fd.IsList() {
			list := m.Mutable(fd).List()
			sub := list.NewElement()
			if err := lastWins(inner, sub.Message()); err != nil {
				return err
			}
			list.Append(sub)
			continue
		}
		sub := m.NewField(fd)
		if err := lastWins(inner, sub.Message()); err != nil {
			return err
		}
		m.Set(fd, sub)
	}
	return nil
}

// checkEntry checks what the sidecar read of a MESSAGE payload: where it read the metadata, a
// protobuf decoder reads it too (required fields and sub-messages included, as the broker's
// decoder, which otherwise counts the entry as one message) and reads the same message count
// the gate debits and the same chunk fields; where it did not, the entry counts as one
// unchunked message.
func checkEntry(t *testing.T, payload []byte, e entry, readErr error) {
	t.Helper()
	if readErr != nil {
		if e != (entry{messages: 1}) {
			t.Fatalf("unreadable metadata (%v) read as %+v, not as one unchunked message", readErr, e)
		}
		return
	}
	_, rawMeta, _, err := pb.SplitPayload(payload)
	if err != nil {
		t.Fatalf("read the metadata of a payload without one: %v", err)
	}
	meta := dynamicpb.NewMessage(messageMetadata)
	if err := proto.Unmarshal(rawMeta, meta); err != nil {
		t.Fatalf("read metadata %+v a protobuf decoder refuses: %v", e, err)
	}
	get := func(name protoreflect.Name) protoreflect.Value {
		return meta.Get(messageMetadata.Fields().ByName(name))
	}
	want := entry{messages: get("num_messages_in_batch").Int(), uuid: get("uuid").String(),
		chunkID: int32(get("chunk_id").Int()), numChunks: int32(get("num_chunks_from_msg").Int())}
	if e != want {
		t.Fatalf("read the metadata as %+v, a protobuf decoder as %+v", e, want)
	}
}

// messageMetadata is MessageMetadata as PulsarApi.proto declares it, where the sidecar's
// protocol subset (internal/pulsarwire) leaves fields out: the required fields, the fields the
// gate reads and every sub-message (properties, encryption_keys), so that a decoder checks
// what the broker's checks.
var messageMetadata = func() protoreflect.MessageDescriptor {
	var file descriptorpb.FileDescriptorProto
	err := prototext.Unmarshal([]byte(`name: "metadata.proto" package: "fuzz" syntax: "proto2"
		message_type { name: "KeyValue"
			field { name: "key" number: 1 label: LABEL_REQUIRED type: TYPE_STRING }
			field { name: "value" number: 2 label: LABEL_REQUIRED type: TYPE_STRING } }
		message_type { name: "EncryptionKeys"
			field { name: "key" number: 1 label: LABEL_REQUIRED type: TYPE_STRING }
			field { name: "value" number: 2 label: LABEL_REQUIRED type: TYPE_BYTES }
			field { name: "metadata" number: 3 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".fuzz.KeyValue" } }
		message_type { name: "MessageMetadata"
			field { name: "producer_name" number: 1 label: LABEL_REQUIRED type: TYPE_STRING }
			field { name: "sequence_id" number: 2 label: LABEL_REQUIRED type: TYPE_UINT64 }
			field { name: "publish_time" number: 3 label: LABEL_REQUIRED type: TYPE_UINT64 }
			field { name: "properties" number: 4 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".fuzz.KeyValue" }
			field { name: "num_messages_in_batch" number: 11 label: LABEL_OPTIONAL type: TYPE_INT32 default_value: "1" }
			field { name: "encryption_keys" number: 13 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".fuzz.EncryptionKeys" }
			field { name: "uuid" number: 26 label: LABEL_OPTIONAL type: TYPE_STRING }
			field { name: "num_chunks_from_msg" number: 27 label: LABEL_OPTIONAL type: TYPE_INT32 }
			field { name: "chunk_id" number: 29 label: LABEL_OPTIONAL type: TYPE_INT32 } }`), &file)
	if err != nil {
		panic(err)
	}
	fd, err := protodesc.NewFile(&file, nil)
	if err != nil {
		panic(err)
	}
	return fd.Messages().ByName("MessageMetadata")
}()

// frameOf frames a command and a payload.
func frameOf(cmd, payload []byte) []byte {
	out := binary.BigEndian.AppendUint32(nil, uint32(4+len(cmd)+len(payload)))
	out = binary.BigEndian.AppendUint32(out, uint32(len(cmd)))
	return append(append(out, cmd...), payload...)
}

// ackFrame is an ACK of consumer 1 of one message id with its ack_set.
func ackFrame(ledger, entry uint64, batchIndex int32, ackSet []int64) []byte {
	return encodeCommand(&pb.BaseCommand{Type: pb.BaseCommand_ACK.Enum(), Ack: ackCommand(ledger, entry, batchIndex, ackSet)})
}

func ackCommand(ledger, entry uint64, batchIndex int32, ackSet []int64) *pb.CommandAck {
	return &pb.CommandAck{ConsumerId: proto.Uint64(1), AckType: pb.CommandAck_Individual.Enum(),
		MessageId: []*pb.MessageIdData{{LedgerId: proto.Uint64(ledger), EntryId: proto.Uint64(entry),
			BatchIndex: proto.Int32(batchIndex), BatchSize: proto.Int32(10), AckSet: ackSet}}}
}

// ambiguousCommands are the commands of issue 38 that a broker could read otherwise than
// the sidecar did (TestAmbiguousCommandClosesTheConnection sends them to a sidecar).
func ambiguousCommands() [][]byte {
	typed := func(b []byte, typ pb.BaseCommand_Type) []byte {
		return protowire.AppendVarint(protowire.AppendTag(b, fieldCommandType, protowire.VarintType), uint64(typ))
	}
	field := func(b []byte, num protowire.Number, m proto.Message) []byte {
		enc, _ := proto.Marshal(m)
		return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), enc)
	}
	flow := &pb.CommandFlow{ConsumerId: proto.Uint64(1), MessagePermits: proto.Uint32(500)}
	subscribe := subscribeCommand("persistent://public/default/t", "hidden", 2)
	const fieldSubscribe, fieldFlow = protowire.Number(pb.BaseCommand_SUBSCRIBE), protowire.Number(pb.BaseCommand_FLOW)
	// Merged, the two start positions are 1:5 batch index 3; the broker keeps the last, 1:5.
	twice, _ := proto.Marshal(subscribe)
	twice = field(twice, 9, &pb.MessageIdData{LedgerId: proto.Uint64(1), EntryId: proto.Uint64(0), BatchIndex: proto.Int32(3)})
	twice = field(twice, 9, &pb.MessageIdData{LedgerId: proto.Uint64(1), EntryId: proto.Uint64(5)})
	return [][]byte{
		typed(field(typed(nil, pb.BaseCommand_SEND), fieldFlow, flow), pb.BaseCommand_FLOW),
		field(typed(nil, pb.BaseCommand_SEND), fieldFlow, flow),
		field(field(typed(nil, pb.BaseCommand_FLOW), fieldFlow, flow), fieldFlow, flow),
		typed(field(typed(nil, pb.BaseCommand_SEND), fieldSubscribe, subscribe), pb.BaseCommand_SUBSCRIBE),
		protowire.AppendBytes(protowire.AppendTag(typed(nil, pb.BaseCommand_SUBSCRIBE), fieldSubscribe, protowire.BytesType), twice),
		// The type's low 32 bits are FLOW's.
		protowire.AppendVarint(protowire.AppendTag(nil, fieldCommandType, protowire.VarintType), 1<<32|uint64(pb.BaseCommand_FLOW)),
	}
}

// brokerSeeds are frames a broker sends, and the metadata issue 38 found costly.
func brokerSeeds() [][]byte {
	seeds := [][]byte{successCommand(1), closeConsumerCommand(1, 2), pingFrame,
		encodeCommand(&pb.BaseCommand{Type: pb.BaseCommand_CONNECTED.Enum(), Connected: &pb.CommandConnected{
			ServerVersion: proto.String("b"), MaxMessageSize: proto.Int32(5 << 20)}}),
		encodeCommand(&pb.BaseCommand{Type: pb.BaseCommand_LOOKUP_RESPONSE.Enum(), LookupTopicResponse: &pb.CommandLookupTopicResponse{
			BrokerServiceUrl: proto.String("pulsar://b:6650"), Response: pb.CommandLookupTopicResponse_Connect.Enum(), RequestId: proto.Uint64(3)}}),
		chunkFrame("u", 0, 3, 1), chunkFrame("u", 2, 3, 3),
	}
	for _, codec := range codecs {
		meta, body := seedBatch(10, codec, nil)
		seeds = append(seeds, seedEntry(meta, body, bitsExcept(10, 6)))
	}
	for _, in := range costlyEntries() {
		seeds = append(seeds, seedEntry(in.meta, in.body, in.ackSet))
	}
	return seeds
}

var codecs = []int32{compressionNone, compressionLZ4, compressionZLIB, compressionZSTD, compressionSnappy}

// seedBatch is the metadata and body of a batch entry of n messages "m-0".."m-<n-1>"
// compressed with codec, with extra metadata fields appended (a later field wins).
func seedBatch(n int, codec int32, extraMeta []byte) (meta, body []byte) {
	bodies := make([]string, n)
	for i := range bodies {
		bodies[i] = fmt.Sprintf("m-%d", i)
	}
	return seedBatchOf(bodies, codec, extraMeta)
}

// seedBatchOf is seedBatch with the messages' bodies given.
func seedBatchOf(bodies []string, codec int32, extraMeta []byte) (meta, body []byte) {
	var batch []byte
	for _, msg := range bodies {
		single, _ := proto.Marshal(&pb.SingleMessageMetadata{PayloadSize: proto.Int32(int32(len(msg)))})
		batch = binary.BigEndian.AppendUint32(batch, uint32(len(single)))
		batch = append(append(batch, single...), msg...)
	}
	m := &pb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(1), PublishTime: proto.Uint64(1),
		NumMessagesInBatch: proto.Int32(int32(len(bodies))), UncompressedSize: proto.Uint32(uint32(len(batch)))}
	if codec != compressionNone {
		m.Compression = proto.Int32(codec)
	}
	meta, _ = proto.Marshal(m)
	body, err := compress(codec, batch)
	if err != nil {
		panic(err)
	}
	return append(meta, extraMeta...), body
}

// seedEntry is a MESSAGE frame of entry 3:7 as entryFrame builds it.
func seedEntry(meta, body []byte, ackSet []int64) []byte {
	entryMeta, _ := proto.Marshal(&pb.BrokerEntryMetadata{Index: proto.Uint64(99)})
	brokerEntry := binary.BigEndian.AppendUint16(nil, pb.MagicBrokerEntry)
	brokerEntry = append(binary.BigEndian.AppendUint32(brokerEntry, uint32(len(entryMeta))), entryMeta...)
	cmd, _ := proto.Marshal(&pb.BaseCommand{Type: pb.BaseCommand_MESSAGE.Enum(), Message: &pb.CommandMessage{
		ConsumerId: proto.Uint64(1), MessageId: &pb.MessageIdData{LedgerId: proto.Uint64(3), EntryId: proto.Uint64(7)}, AckSet: ackSet}})
	return pb.AppendMessage(nil, cmd, brokerEntry, meta, body)
}

type costlyEntry struct {
	meta, body []byte
	ackSet     []int64
}

// costlyEntries are the entries of issue 38 whose metadata drove the cut's allocation: tiny
// LZ4 and ZSTD entries announcing 64 MiB uncompressed (in the metadata or in the zstd frame),
// and one claiming 2^31-1 messages with the broker's ack_set.
func costlyEntries() []costlyEntry {
	varint := func(field protowire.Number, v uint64) []byte {
		return protowire.AppendVarint(protowire.AppendTag(nil, field, protowire.VarintType), v)
	}
	const fieldUncompressedSize = 9
	var out []costlyEntry
	for _, codec := range []int32{compressionLZ4, compressionZSTD} {
		meta, body := seedBatch(2, codec, varint(fieldUncompressedSize, maxCutBatch))
		out = append(out, costlyEntry{meta: meta, body: body})
	}
	zstdFrame := []byte{0x28, 0xb5, 0x2f, 0xfd, 0xa0} // single segment, a 4-byte content size
	zstdFrame = binary.LittleEndian.AppendUint32(zstdFrame, maxCutBatch)
	zstdFrame = append(zstdFrame, 1|1<<1|10<<3, 0, 0, 'x') // one RLE block of 10 bytes
	meta, _ := seedBatch(2, compressionZSTD, varint(fieldUncompressedSize, uint64(len(zstdFrame))*32<<10))
	out = append(out, costlyEntry{meta: meta, body: zstdFrame})
	meta, body := seedBatch(2, compressionNone, varint(fieldMetadataNumMessages, math.MaxInt32))
	return append(out, costlyEntry{meta: meta, body: body, ackSet: bitsExcept(2)})
}

// warmUpFrames runs the decoders once before allocations are measured: their first use
// builds tables that later calls share.
func warmUpFrames() {
	for _, raw := range append(brokerSeeds(), connectFrame(), subscribeFrame("t", "c", 1), ackFrame(3, 7, 1, nil)) {
		if f, err := parseFrame(raw); err == nil {
			cmd, _ := f.decode()
			var std, broker pb.BaseCommand
			_ = partial.Unmarshal(f.cmd, &std)
			_ = lastWins(f.cmd, broker.ProtoReflect())
			_, _ = readEntry(f.payload)
			if msg := cmd.GetMessage(); msg != nil {
				_, _, _ = cutBatch(f, msg, 1, DefaultMaxFrameSize)
				_, _, _ = cutBatch(f, msg, 1, 64)
			}
		}
	}
	runtime.GC()
}
