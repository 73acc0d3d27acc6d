package sidecar

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/subflow-dev/subflow/agent/protocol"
	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// batchFrame builds a MESSAGE frame as a broker sends it: broker-entry metadata with the
// entry's index, a checksum, and a batch of "m-0".."m-<n-1>" compressed with codec. ackSet is
// the CommandMessage's (nil: none).
func batchFrame(t *testing.T, n int, codec int32, ackSet []int64, extraMeta []byte) frame {
	t.Helper()
	bodies := make([]string, n)
	for i := range bodies {
		bodies[i] = fmt.Sprintf("m-%d", i)
	}
	return batchFrameOf(t, bodies, codec, ackSet, extraMeta)
}

// batchFrameOf is batchFrame with the messages' bodies given.
func batchFrameOf(t *testing.T, bodies []string, codec int32, ackSet []int64, extraMeta []byte) frame {
	t.Helper()
	batch := batchOf(t, bodies)
	meta := &pb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(1), PublishTime: proto.Uint64(1),
		NumMessagesInBatch: proto.Int32(int32(len(bodies))), UncompressedSize: proto.Uint32(uint32(len(batch)))}
	if codec != compressionNone {
		meta.Compression = proto.Int32(codec)
	}
	rawMeta, err := proto.Marshal(meta)
	if err != nil {
		t.Fatal(err)
	}
	return entryFrame(t, append(rawMeta, extraMeta...), mustCompress(t, codec, batch), ackSet)
}

// batchOf is an uncompressed batch of messages with these bodies.
func batchOf(t *testing.T, bodies []string) []byte {
	t.Helper()
	var batch []byte
	for _, body := range bodies {
		single, err := proto.Marshal(&pb.SingleMessageMetadata{PayloadSize: proto.Int32(int32(len(body)))})
		if err != nil {
			t.Fatal(err)
		}
		batch = binary.BigEndian.AppendUint32(batch, uint32(len(single)))
		batch = append(append(batch, single...), body...)
	}
	return batch
}

// entryFrame is a MESSAGE frame of entry 3:7 with broker-entry metadata, a checksum, the
// serialized MessageMetadata meta and body.
func entryFrame(t *testing.T, meta, body []byte, ackSet []int64) frame {
	t.Helper()
	entryMeta, _ := proto.Marshal(&pb.BrokerEntryMetadata{Index: proto.Uint64(99)})
	brokerEntry := binary.BigEndian.AppendUint16(nil, pb.MagicBrokerEntry)
	brokerEntry = append(binary.BigEndian.AppendUint32(brokerEntry, uint32(len(entryMeta))), entryMeta...)
	cmd, _ := proto.Marshal(&pb.BaseCommand{Type: pb.BaseCommand_MESSAGE.Enum(), Message: &pb.CommandMessage{
		ConsumerId: proto.Uint64(1), MessageId: &pb.MessageIdData{LedgerId: proto.Uint64(3), EntryId: proto.Uint64(7)}, AckSet: ackSet}})
	f, err := parseFrame(pb.AppendMessage(nil, cmd, brokerEntry, meta, body))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func mustCompress(t *testing.T, codec int32, src []byte) []byte {
	t.Helper()
	out, err := compress(codec, src)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// readBatch checks a MESSAGE frame's checksum and returns its batch's message bodies, the
// broker-entry section and the CommandMessage.
func readBatch(t *testing.T, raw []byte) (bodies []string, brokerEntry []byte, msg *pb.CommandMessage) {
	t.Helper()
	f, err := parseFrame(raw)
	if err != nil {
		t.Fatal(err)
	}
	if got := binary.BigEndian.Uint32(raw); int(got) != len(raw)-4 {
		t.Fatalf("frame size field %d, frame of %d bytes", got, len(raw))
	}
	cmd, err := f.decode()
	if err != nil {
		t.Fatal(err)
	}
	p := f.payload
	size := binary.BigEndian.Uint32(p[2:])
	brokerEntry, p = p[:6+size], p[6+size:]
	if binary.BigEndian.Uint16(p) != pb.MagicChecksum {
		t.Fatal("no checksum section")
	}
	if sum := binary.BigEndian.Uint32(p[2:]); sum != crc32.Checksum(p[6:], crc32.MakeTable(crc32.Castagnoli)) {
		t.Fatal("checksum does not match")
	}
	p = p[6:]
	var meta pb.MessageMetadata
	if err := proto.Unmarshal(p[4:4+binary.BigEndian.Uint32(p)], &meta); err != nil {
		t.Fatal(err)
	}
	batch, err := decompress(meta.GetCompression(), p[4+binary.BigEndian.Uint32(p):], int(meta.GetUncompressedSize()))
	if err != nil {
		t.Fatal(err)
	}
	for range meta.GetNumMessagesInBatch() {
		var single pb.SingleMessageMetadata
		n := binary.BigEndian.Uint32(batch)
		if err := proto.Unmarshal(batch[4:4+n], &single); err != nil {
			t.Fatal(err)
		}
		batch = batch[4+n:]
		bodies = append(bodies, string(batch[:single.GetPayloadSize()]))
		batch = batch[single.GetPayloadSize():]
	}
	if len(batch) != 0 {
		t.Errorf("%d bytes after the batch's last message", len(batch))
	}
	return bodies, brokerEntry, cmd.GetMessage()
}

// A cut batch begins at the target, whatever the codec: checksum, sizes, broker-entry
// metadata (the index the client numbers the messages back from) and the broker's
// acknowledged indexes all agree with the messages kept.
func TestCutBatch(t *testing.T) {
	for name, codec := range map[string]int32{"none": compressionNone, "lz4": compressionLZ4, "zlib": compressionZLIB,
		"zstd": compressionZSTD, "snappy": compressionSnappy} {
		t.Run(name, func(t *testing.T) {
			// A set bit is a message not acknowledged yet: the broker has 6 and 8 acknowledged.
			ackSet := bitsExcept(10, 6, 8)
			in := batchFrame(t, 10, codec, ackSet, nil)
			inBodies, inEntry, inMsg := readBatch(t, in.raw)
			if len(inBodies) != 10 {
				t.Fatalf("the frame built holds %d messages", len(inBodies))
			}
			out, removed, err := cutBatch(in, inMsg, 5, DefaultMaxFrameSize)
			if err != nil {
				t.Fatal(err)
			}
			bodies, entry, msg := readBatch(t, out)
			if removed != 5 || !slices.Equal(bodies, []string{"m-5", "m-6", "m-7", "m-8", "m-9"}) {
				t.Errorf("removed %d, kept %v; want 5 removed and m-5 to m-9", removed, bodies)
			}
			if !bytes.Equal(entry, inEntry) {
				t.Error("the broker-entry metadata changed")
			}
			if want := bitsExcept(5, 1, 3); !slices.Equal(msg.GetAckSet(), want) {
				t.Errorf("ack_set %b, want %b", msg.GetAckSet(), want)
			}
			if e, err := readEntry(mustFrame(t, out).payload); err != nil || e.messages != 5 {
				t.Errorf("readEntry of the cut frame: %+v, %v", e, err)
			}
		})
	}
}

// bitsExcept is a bit set of n bits, all set but the cleared ones.
func bitsExcept(n int, cleared ...int) []int64 {
	out := make([]int64, (n+63)/64)
	for i := range n {
		if !slices.Contains(cleared, i) {
			out[i/64] |= 1 << (i % 64)
		}
	}
	return out
}

func mustFrame(t *testing.T, raw []byte) frame {
	t.Helper()
	f, err := parseFrame(raw)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// Entries the sidecar cannot open, or that hold no such message, are left whole.
func TestCutBatchRefuses(t *testing.T) {
	encrypted := protowire.AppendBytes(protowire.AppendTag(nil, fieldMetadataEncryptionKeys, protowire.BytesType), []byte("key"))
	// A later field wins: the metadata announces 1 GiB uncompressed.
	huge := protowire.AppendVarint(protowire.AppendTag(nil, 9, protowire.VarintType), 1<<30)
	for name, tc := range map[string]struct {
		f        frame
		keepFrom int32
	}{
		"encrypted":         {batchFrame(t, 10, compressionLZ4, nil, encrypted), 5},
		"1 GiB announced":   {batchFrame(t, 10, compressionLZ4, nil, huge), 5},
		"past the batch":    {batchFrame(t, 10, compressionNone, nil, nil), 10},
		"the first message": {batchFrame(t, 10, compressionNone, nil, nil), 0},
	} {
		t.Run(name, func(t *testing.T) {
			if _, _, err := cutBatch(tc.f, &pb.CommandMessage{}, tc.keepFrom, DefaultMaxFrameSize); !errors.Is(err, errCannotCut) {
				t.Errorf("cutBatch: %v, want errCannotCut", err)
			}
		})
	}
}

// A client's acknowledgement of messages of a cut entry names them as the broker does: the
// batch index and the bit set are counted in the whole entry, and the messages before the
// target count as acknowledged.
func TestTranslateAck(t *testing.T) {
	c := &Consumer{cut: &seekCut{ledger: 3, entry: 7, keepFrom: 5}, cutSize: 10}
	// The client's view: 5 messages, index 1 acknowledged.
	clientSet := bitsExcept(5, 1)
	ack := &pb.CommandAck{MessageId: []*pb.MessageIdData{
		{LedgerId: proto.Uint64(3), EntryId: proto.Uint64(7), BatchIndex: proto.Int32(1), BatchSize: proto.Int32(5), AckSet: clientSet},
		{LedgerId: proto.Uint64(3), EntryId: proto.Uint64(8)},
	}}
	if changed, err := c.translateAck(ack, DefaultMaxFrameSize); err != nil || !changed {
		t.Fatalf("the ACK of the cut entry was left as it was (%v)", err)
	}
	id := ack.GetMessageId()[0]
	want := bitsExcept(10, 0, 1, 2, 3, 4, 6)
	if id.GetBatchIndex() != 6 || id.GetBatchSize() != 10 || !slices.Equal(id.GetAckSet(), want) {
		t.Errorf("translated to batch index %d of %d, ack_set %b; want 6 of 10, %b", id.GetBatchIndex(), id.GetBatchSize(), id.GetAckSet(), want)
	}
	if other := ack.GetMessageId()[1]; other.BatchIndex != nil || other.AckSet != nil {
		t.Errorf("another entry's id changed: %v", other)
	}
	if changed, _ := (&Consumer{}).translateAck(&pb.CommandAck{MessageId: []*pb.MessageIdData{{LedgerId: proto.Uint64(3), EntryId: proto.Uint64(7)}}}, DefaultMaxFrameSize); changed {
		t.Error("a consumer without a cut changed an ACK")
	}
}

func TestSeekCutOf(t *testing.T) {
	for id, want := range map[string]*seekCut{
		"3:7:-1:5": {ledger: 3, entry: 7, keepFrom: 5},
		"3:7:2:1":  {ledger: 3, entry: 7, keepFrom: 1},
		"3:7:-1:0": nil, "3:7:-1:-1": nil, "": nil, "3:7:x:5": {ledger: 3, entry: 7, keepFrom: 5}, "3:7:5": nil,
	} {
		got, ok := seekCutOf(protocol.SeekPosition{MessageID: id})
		if (want == nil) == ok || (ok && got != *want) {
			t.Errorf("seekCutOf(%q) = %+v, %v; want %+v", id, got, ok, want)
		}
	}
}

// A cut costs what the entry holds, not what its metadata claims: a few bytes announcing 64 MiB
// uncompressed (in the metadata or in the zstd frame) or 2^31-1 messages, with the broker's
// ack_set, allocate little, and so do the client's acknowledgements of that entry.
func TestCutAllocatesWhatTheEntryHolds(t *testing.T) {
	varint := func(field protowire.Number, v uint64) []byte {
		return protowire.AppendVarint(protowire.AppendTag(nil, field, protowire.VarintType), v)
	}
	const (
		fieldUncompressedSize = 9
		claimed               = maxCutBatch
	)
	// A zstd frame announcing 64 MiB of content (single segment, a 4-byte size) that holds
	// one RLE block of 10 bytes.
	zstdFrame := []byte{0x28, 0xb5, 0x2f, 0xfd, 0xa0}
	zstdFrame = binary.LittleEndian.AppendUint32(zstdFrame, claimed)
	zstdFrame = append(zstdFrame, 1|1<<1|10<<3, 0, 0, 'x')
	zstdMeta, err := proto.Marshal(&pb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(1),
		PublishTime: proto.Uint64(1), NumMessagesInBatch: proto.Int32(2), Compression: proto.Int32(compressionZSTD),
		UncompressedSize: proto.Uint32(uint32(len(zstdFrame)) * 32 << 10)})
	if err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]frame{
		"LZ4 announcing 64 MiB":        batchFrame(t, 2, compressionLZ4, nil, varint(fieldUncompressedSize, claimed)),
		"zstd announcing 64 MiB":       batchFrame(t, 2, compressionZSTD, nil, varint(fieldUncompressedSize, claimed)),
		"zstd frame announcing 64 MiB": entryFrame(t, zstdMeta, zstdFrame, nil),
		"2^31-1 messages":              batchFrame(t, 2, compressionNone, bitsExcept(2), varint(fieldMetadataNumMessages, math.MaxInt32)),
	} {
		t.Run(name, func(t *testing.T) {
			cmd, err := f.decode()
			if err != nil {
				t.Fatal(err)
			}
			e, err := readEntry(f.payload)
			if err != nil {
				t.Fatal(err)
			}
			c := &Consumer{conn: &conn{log: logr.Discard()}, cut: &seekCut{ledger: 3, entry: 7, keepFrom: 1}}
			n := allocated(func() { c.cutLocked(f, cmd.GetMessage(), e) })
			t.Logf("the cut allocated %d bytes", n)
			if n > 1<<20 {
				t.Errorf("the cut allocated %d bytes", n)
			}
			ack := &pb.CommandAck{MessageId: []*pb.MessageIdData{{LedgerId: proto.Uint64(3), EntryId: proto.Uint64(7), AckSet: bitsExcept(1)}}}
			if n := allocated(func() { _, _ = c.translateAck(ack, DefaultMaxFrameSize) }); n > 1<<20 {
				t.Errorf("translating an ACK of the entry allocated %d bytes", n)
			}
		})
	}
}

// An ACK naming the cut entry so often that its translated bit sets would outgrow a frame is
// refused.
func TestTranslateAckRefusesManySets(t *testing.T) {
	c := &Consumer{cut: &seekCut{ledger: 3, entry: 7, keepFrom: 1}, cutSize: 64 << 10}
	ack := &pb.CommandAck{}
	for range 100 {
		ack.MessageId = append(ack.MessageId, &pb.MessageIdData{LedgerId: proto.Uint64(3), EntryId: proto.Uint64(7), AckSet: []int64{-1}})
	}
	if _, err := c.translateAck(ack, 64<<10); err == nil {
		t.Error("an ACK that grows to 800 KiB was translated")
	}
}

// allocated is how many bytes fn allocates on the heap.
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// A cut entry that would outgrow, uncompressed, the frames its client takes is compressed again
// with its codec; one that does not fit even so is left whole.
func TestCutFitsTheClientsFrames(t *testing.T) {
	const maxFrame = 64 << 10
	text, noise := textBodies(200), make([]string, 200)
	random := rand.New(rand.NewPCG(1, 2))
	for i := range noise {
		b := make([]byte, 1000)
		for j := range b {
			b[j] = byte(random.Uint32())
		}
		noise[i] = string(b)
	}
	for name, codec := range map[string]int32{"lz4": compressionLZ4, "zlib": compressionZLIB, "zstd": compressionZSTD, "snappy": compressionSnappy} {
		t.Run(name, func(t *testing.T) {
			in := batchFrameOf(t, text, codec, nil, nil)
			_, _, msg := readBatch(t, in.raw)
			out, removed, err := cutBatch(in, msg, 5, maxFrame)
			if err != nil {
				t.Fatal(err)
			}
			if len(out)-4 > maxFrame {
				t.Errorf("the cut frame takes %d bytes, the client at most %d", len(out)-4, maxFrame)
			}
			bodies, _, _ := readBatch(t, out)
			if removed != 5 || !slices.Equal(bodies, text[5:]) {
				t.Errorf("removed %d, kept %d messages; want 5 removed and the 195 from the target on", removed, len(bodies))
			}
			_, rawMeta, _, err := pb.SplitPayload(mustFrame(t, out).payload)
			var meta pb.MessageMetadata
			if err == nil {
				err = proto.Unmarshal(rawMeta, &meta)
			}
			if err != nil || meta.GetCompression() != codec {
				t.Errorf("the cut entry is compressed with %d (%v), want %d as the entry was", meta.GetCompression(), err, codec)
			}

			in = batchFrameOf(t, noise, codec, nil, nil)
			if _, _, err := cutBatch(in, msg, 5, maxFrame); !errors.Is(err, errCannotCut) {
				t.Errorf("an entry that does not fit the client's frames once cut: %v, want errCannotCut", err)
			}
		})
	}
}

// textBodies are n message bodies of a kilobyte that compress well.
func textBodies(n int) []string {
	bodies := make([]string, n)
	for i := range bodies {
		bodies[i] = fmt.Sprintf("m-%d ", i) + strings.Repeat("the body of a message ", 50)
	}
	return bodies
}

// The frames a client takes are what its broker told it in CONNECTED (max_message_size, plus
// padding): a cut entry that would outgrow them uncompressed reaches it compressed.
func TestCutEntryFitsWhatTheBrokerToldTheClient(t *testing.T) {
	const maxMessageSize = 64 << 10
	fb := startFakeBroker(t)
	s, url := startSidecar(t, Options{BrokerURL: "pulsar://" + fb.ln.Addr().String()})
	c := dialRaw(t, url, false)
	c.send(connectFrame())
	broker := <-fb.conn
	fromBroker := func(frame []byte) {
		if _, err := broker.Write(frame); err != nil {
			t.Fatal(err)
		}
	}
	fromBroker(encodeCommand(&pb.BaseCommand{Type: pb.BaseCommand_CONNECTED.Enum(),
		Connected: &pb.CommandConnected{ServerVersion: proto.String("fake"), MaxMessageSize: proto.Int32(maxMessageSize)}}))
	c.await(pb.BaseCommand_CONNECTED)
	subscribe := subscribeFrame("persistent://public/default/t", "raw", 1)
	c.send(subscribe)
	eventually(t, "the SUBSCRIBE to reach the broker", func() bool { return bytes.HasSuffix(fb.received(), subscribe) })
	fromBroker(successCommand(1))
	c.await(pb.BaseCommand_SUCCESS)
	cons := consumerNamed(t, s, "s", "raw")
	if err := cons.FilterSeekTargets([]protocol.SeekPosition{{Partition: -1, MessageID: "3:7:-1:5"}}); err != nil {
		t.Fatal(err)
	}
	c.send(flowCommand(1, 1000))

	text := textBodies(200)
	fromBroker(batchFrameOf(t, text, compressionLZ4, nil, nil).raw)
	_, f := c.await(pb.BaseCommand_MESSAGE)
	if size := len(f.raw) - 4; size > maxMessageSize+pb.FramePadding {
		t.Errorf("the cut entry came in a frame of %d bytes; the client takes at most %d", size, maxMessageSize+pb.FramePadding)
	}
	if bodies, _, _ := readBatch(t, f.raw); !slices.Equal(bodies, text[5:]) {
		t.Errorf("the client got %d messages, want the 195 from the target on", len(bodies))
	}
}
