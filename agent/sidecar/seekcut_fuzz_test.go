package sidecar

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"math"
	"testing"

	"github.com/klauspost/compress/snappy"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// What a cut may allocate: the batch uncompressed - at most what the entry's codec can make of
// its bytes (maxExpansion), never more than maxCutBatch - cutAllocPerBatchByte times over (the
// batch decompressed, zlib's reader doubling its buffer, the frame assembled, the batch
// compressed again and assembled again); decodeAllocPerByte per byte of the frame for its
// metadata and command; and cutAllocSlack for a codec's state (zstd's and deflate's encoders
// and decoders).
const (
	cutAllocPerBatchByte = 8
	cutAllocSlack        = 4 << 20
)

// cutAllocBound is the most a cut of a frame of n bytes, whose batch is body compressed with
// codec, may allocate.
func cutAllocBound(n int, codec int32, body int) uint64 {
	batch := int64(body)
	if codec != compressionNone {
		batch = min(maxCutBatch, maxExpansion(codec)*int64(body))
	}
	return uint64(cutAllocPerBatchByte*batch) + uint64(decodeAllocPerByte*n) + cutAllocSlack
}

// FuzzCutBatch cuts a batch entry - metadata meta, compressed batch body, the broker's ack_set
// (8 bytes a word) - at message keepFrom for a client taking frames of limit*16 bytes (0: the
// default). A cut either leaves the entry whole (errCannotCut) or delivers exactly the entry's
// messages from keepFrom on, byte for byte, as a client reads them: never more messages than
// the entry holds, in a frame the client takes, with a valid checksum, the broker-entry
// section, the rest of the metadata and the command unchanged and the ack_set renumbered. No
// entry makes it allocate more than cutAllocBound.
func FuzzCutBatch(f *testing.F) {
	for _, codec := range codecs {
		meta, body := seedBatch(10, codec, nil)
		f.Add(meta, body, wordBytes(bitsExcept(10, 6, 8)), int32(5), uint16(0))
		f.Add(meta, body, []byte(nil), int32(9), uint16(6))
		// 3 KiB kept uncompressed, a client taking 2 KiB frames: compressed again.
		meta, body = seedBatchOf(textBodies(8), codec, nil)
		f.Add(meta, body, []byte(nil), int32(5), uint16(128))
	}
	for _, in := range costlyEntries() {
		f.Add(in.meta, in.body, wordBytes(in.ackSet), int32(1), uint16(0))
	}
	meta, body := seedBatch(10, compressionNone, encryptionKeys("key", "encrypted data key"))
	f.Add(meta, body, []byte(nil), int32(5), uint16(0))
	warmUpFrames()
	f.Fuzz(func(t *testing.T, meta, body, ackSet []byte, keepFrom int32, limit uint16) {
		in := entryFrame(t, meta, body, words(ackSet))
		cmd, err := in.decode()
		if err != nil {
			t.Fatal(err)
		}
		maxFrame := DefaultMaxFrameSize
		if limit > 0 {
			maxFrame = int(limit) * 16
		}
		var (
			out     []byte
			removed int64
		)
		var original pb.MessageMetadata
		metaErr := partial.Unmarshal(meta, &original)
		n := allocated(func() { out, removed, err = cutBatch(in, cmd.GetMessage(), keepFrom, maxFrame) })
		if bound := cutAllocBound(len(in.raw), original.GetCompression(), len(body)); n > bound {
			t.Fatalf("cutting an entry of %d bytes (codec %d, %d compressed) allocated %d bytes, more than %d",
				len(in.raw), original.GetCompression(), len(body), n, bound)
		}
		if err != nil {
			if !errors.Is(err, errCannotCut) {
				t.Fatalf("a cut failed otherwise than by leaving the entry whole: %v", err)
			}
			return
		}
		if metaErr != nil {
			t.Fatalf("cut an entry whose metadata protobuf refuses: %v", metaErr)
		}
		if encrypted(meta) {
			t.Fatal("cut an encrypted entry")
		}
		total := original.GetNumMessagesInBatch()
		if keepFrom <= 0 || keepFrom >= total || removed != int64(keepFrom) {
			t.Fatalf("cut %d messages from message %d of a batch of %d", removed, keepFrom, total)
		}
		if len(out)-4 > maxFrame {
			t.Fatalf("the cut entry takes %d bytes, the client at most %d", len(out)-4, maxFrame)
		}
		held := clientMessages(t, original.GetCompression(), body, original.GetUncompressedSize())
		if len(held) < int(total) {
			t.Fatalf("cut an entry holding %d messages, its metadata claiming %d", len(held), total)
		}
		checkCut(t, in, out, &original, held[keepFrom:total], keepFrom)
	})
}

// checkCut checks the frame of a cut entry: what a client reads of it is kept, the messages
// the entry held from the target on.
func checkCut(t *testing.T, in frame, out []byte, original *pb.MessageMetadata, kept [][]byte, keepFrom int32) {
	t.Helper()
	g, err := parseFrame(out)
	if err != nil || int(binary.BigEndian.Uint32(out))+4 != len(out) {
		t.Fatalf("the cut frame does not parse: %v", err)
	}
	cmd, err := g.decode()
	if err != nil {
		t.Fatal(err)
	}
	inEntry, _, _, _ := pb.SplitPayload(in.payload)
	outEntry, rawMeta, body, err := pb.SplitPayload(g.payload)
	if err != nil || !bytes.Equal(outEntry, inEntry) {
		t.Fatalf("the broker-entry section changed (%v)", err)
	}
	checked := g.payload[len(outEntry):]
	if len(checked) < 6 || binary.BigEndian.Uint16(checked) != pb.MagicChecksum ||
		binary.BigEndian.Uint32(checked[2:]) != crc32.Checksum(checked[6:], pb.Castagnoli) {
		t.Fatal("the cut frame's checksum does not match")
	}
	var meta pb.MessageMetadata
	if err := partial.Unmarshal(rawMeta, &meta); err != nil {
		t.Fatal(err)
	}
	if c := meta.GetCompression(); c != compressionNone && c != original.GetCompression() {
		t.Fatalf("the cut entry is compressed with %d, the entry was with %d", c, original.GetCompression())
	}
	batch, err := clientBatch(meta.GetCompression(), body, meta.GetUncompressedSize())
	if err != nil || len(batch) != int(meta.GetUncompressedSize()) {
		t.Fatalf("the cut batch has %d bytes, its metadata says %d (%v)", len(batch), meta.GetUncompressedSize(), err)
	}
	got := splitMessages(batch)
	if int(meta.GetNumMessagesInBatch()) != len(kept) || len(got) < len(kept) {
		t.Fatalf("the cut entry claims %d messages and holds %d, want %d", meta.GetNumMessagesInBatch(), len(got), len(kept))
	}
	for i := range kept {
		if !bytes.Equal(got[i], kept[i]) {
			t.Fatalf("message %d of the cut entry is not message %d of the entry", i, int(keepFrom)+i)
		}
	}
	if e, err := readEntry(g.payload); err != nil || e.messages != int64(len(kept)) {
		t.Fatalf("the gate counts %d messages in the cut entry, want %d (%v)", e.messages, len(kept), err)
	}
	rest, was := proto.CloneOf(&meta), proto.CloneOf(original)
	for _, m := range []*pb.MessageMetadata{rest, was} {
		m.NumMessagesInBatch, m.UncompressedSize, m.Compression = nil, nil, nil
	}
	if !proto.Equal(rest, was) {
		t.Fatalf("the cut changed the metadata %v to %v", was, rest)
	}
	checkCutCommand(t, in, cmd, len(kept), keepFrom)
}

// checkCutCommand checks the cut frame's command: the original's, its ack_set renumbered
// from the target on.
func checkCutCommand(t *testing.T, in frame, cmd *pb.BaseCommand, kept int, keepFrom int32) {
	t.Helper()
	was, err := in.decode()
	if err != nil {
		t.Fatal(err)
	}
	ackSet, wasSet := cmd.GetMessage().GetAckSet(), was.GetMessage().GetAckSet()
	if len(wasSet) == 0 {
		if len(ackSet) != 0 {
			t.Fatalf("an ack_set %b appeared", ackSet)
		}
	} else {
		if len(ackSet) != (kept+63)/64 {
			t.Fatalf("ack_set of %d words for %d messages", len(ackSet), kept)
		}
		for i := range len(ackSet) * 64 {
			want := i < kept && bit(wasSet, i+int(keepFrom))
			if bit(ackSet, i) != want {
				t.Fatalf("bit %d of the ack_set is %v, bit %d of the broker's %v", i, !want, i+int(keepFrom), want)
			}
		}
	}
	cmd.Message.AckSet, was.Message.AckSet = nil, nil
	if !proto.Equal(cmd, was) {
		t.Fatalf("the cut changed the command %v to %v", was, cmd)
	}
}

// FuzzTranslateAck translates a client's ACK (the CommandAck ack) for a consumer that cut
// entry 3:7 of cutSize+2 messages at message keepFrom (modulo the entry), in ACK frames of at
// most maxBytes*8 bytes (0: the default). An ACK is refused only when its translated bit sets
// would outgrow a frame; otherwise each id of the cut entry names the messages the client
// named, in the broker's numbering (the ones before the target acknowledged), and nothing
// else changes. No ACK makes it allocate more than a frame beyond frameAllocBound.
func FuzzTranslateAck(f *testing.F) {
	for _, ack := range []*pb.CommandAck{ackCommand(3, 7, 1, bitsExcept(5, 1)), ackCommand(3, 8, 1, bitsExcept(5, 1)), ackCommand(3, 7, 0, nil)} {
		raw, _ := proto.Marshal(ack)
		f.Add(raw, int32(5), uint16(8), uint16(0))
	}
	raw, _ := proto.Marshal(ackCommand(3, 7, 1, bitsExcept(1)))
	f.Add(raw, int32(1), uint16(0xffff), uint16(64))
	raw, _ = proto.Marshal(ackCommand(3, 7, math.MaxInt32, nil)) // beyond the cut entry, and int32
	f.Add(raw, int32(5), uint16(8), uint16(0))
	f.Fuzz(func(t *testing.T, rawAck []byte, keepFrom int32, cutSize, maxBytes uint16) {
		cmd := protowire.AppendVarint(protowire.AppendTag(nil, fieldCommandType, protowire.VarintType), uint64(pb.BaseCommand_ACK))
		cmd = protowire.AppendBytes(protowire.AppendTag(cmd, protowire.Number(pb.BaseCommand_ACK), protowire.BytesType), rawAck)
		g, err := parseFrame(frameOf(cmd, nil))
		if err != nil {
			t.Fatal(err)
		}
		decoded, err := g.decode()
		if err != nil {
			return // the connection is closed
		}
		size := int32(cutSize) + 2
		keep := 1 + int32(uint32(keepFrom)%uint32(size-1))
		limit := DefaultMaxFrameSize
		if maxBytes > 0 {
			limit = int(maxBytes) * 8
		}
		ack, was := decoded.GetAck(), proto.CloneOf(decoded.GetAck())
		c := &Consumer{cut: &seekCut{ledger: 3, entry: 7, keepFrom: keep}, cutSize: size}
		var changed bool
		n := allocated(func() { changed, err = c.translateAck(ack, limit) })
		if bound := frameAllocBound(len(rawAck)) + uint64(limit); n > bound {
			t.Fatalf("translating an ACK of %d bytes allocated %d bytes, more than %d", len(rawAck), n, bound)
		}
		if err != nil {
			sets := 0
			for _, id := range was.GetMessageId() {
				if c.cut.matches(id) && len(id.GetAckSet()) > 0 {
					sets++
				}
			}
			if grown := sets * int((size+63)/64*8); grown <= limit {
				t.Fatalf("refused an ACK whose bit sets grow to %d bytes, frames take %d: %v", grown, limit, err)
			}
			if !proto.Equal(ack, was) {
				t.Fatal("a refused ACK changed")
			}
			return
		}
		matched := false
		for i, id := range ack.GetMessageId() {
			matched = checkTranslatedID(t, c.cut, size, was.GetMessageId()[i], id) || matched
		}
		if changed != matched {
			t.Fatalf("translateAck says changed %v, an id of the cut entry was there: %v", changed, matched)
		}
		ack.MessageId, was.MessageId = nil, nil
		if !proto.Equal(ack, was) {
			t.Fatalf("the ACK changed beyond its message ids: %v to %v", was, ack)
		}
	})
}

// checkTranslatedID checks one message id of a translated ACK and tells whether it names
// the cut entry.
func checkTranslatedID(t *testing.T, cut *seekCut, size int32, was, id *pb.MessageIdData) bool {
	t.Helper()
	if !cut.matches(was) {
		if !proto.Equal(id, was) {
			t.Fatalf("the id of another entry changed: %v to %v", was, id)
		}
		return false
	}
	if len(was.GetAckSet()) > 0 {
		if len(id.GetAckSet()) != int(size+63)/64 {
			t.Fatalf("an ack_set of %d words for an entry of %d messages", len(id.GetAckSet()), size)
		}
		for i := range len(id.GetAckSet()) * 64 {
			// A set bit is a message not acknowledged yet.
			want := i < int(size) && i >= int(cut.keepFrom) && bit(was.GetAckSet(), i-int(cut.keepFrom))
			if bit(id.GetAckSet(), i) != want {
				t.Fatalf("bit %d of the translated ack_set is %v, want %v (the client's bit %d)", i, !want, want, i-int(cut.keepFrom))
			}
		}
	} else if len(id.GetAckSet()) > 0 {
		t.Fatalf("an ack_set %b appeared", id.GetAckSet())
	}
	// An index naming a message of the cut entry names it in the whole entry. One beyond it
	// names nothing either way; the broker reads only whether an id has an index.
	index, wasIndex := id.GetBatchIndex(), was.GetBatchIndex()
	switch {
	case (was.BatchIndex == nil) != (id.BatchIndex == nil),
		wasIndex < 0 && index != wasIndex,
		wasIndex >= 0 && wasIndex < size-cut.keepFrom && index != wasIndex+cut.keepFrom:
		t.Fatalf("batch index %d (set %v) translated to %d (set %v); the target is message %d of %d",
			wasIndex, was.BatchIndex != nil, index, id.BatchIndex != nil, cut.keepFrom, size)
	case was.BatchSize != nil && id.GetBatchSize() != size, was.BatchSize == nil && id.BatchSize != nil:
		t.Fatalf("batch size %d (set %v) translated to %d (set %v); the entry holds %d",
			was.GetBatchSize(), was.BatchSize != nil, id.GetBatchSize(), id.BatchSize != nil, size)
	}
	rest, wasRest := proto.CloneOf(id), proto.CloneOf(was)
	for _, m := range []*pb.MessageIdData{rest, wasRest} {
		m.AckSet, m.BatchIndex, m.BatchSize = nil, nil, nil
	}
	if !proto.Equal(rest, wasRest) {
		t.Fatalf("the id changed beyond its batch fields: %v to %v", was, id)
	}
	return true
}

// encrypted tells whether an entry's metadata carries encryption keys, as a protobuf decoder
// of PulsarApi.proto reads it: its batch is ciphertext.
func encrypted(meta []byte) bool {
	m := dynamicpb.NewMessage(messageMetadata)
	return proto.UnmarshalOptions{AllowPartial: true}.Unmarshal(meta, m) == nil &&
		m.Get(messageMetadata.Fields().ByName("encryption_keys")).List().Len() > 0
}

// encryptionKeys is MessageMetadata.encryption_keys (field 13 in PulsarApi.proto) naming one
// key.
func encryptionKeys(key, value string) []byte {
	keys := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), key)
	keys = protowire.AppendString(protowire.AppendTag(keys, 2, protowire.BytesType), value)
	return protowire.AppendBytes(protowire.AppendTag(nil, 13, protowire.BytesType), keys)
}

// clientBatch decompresses a batch as a client does, into a buffer of the size the metadata
// announces where the codec needs one.
func clientBatch(codec int32, body []byte, size uint32) ([]byte, error) {
	switch codec {
	case compressionNone:
		return body, nil
	case compressionLZ4:
		out := make([]byte, size)
		n, err := lz4.UncompressBlock(body, out)
		return out[:n], err
	case compressionZLIB:
		r, err := zlib.NewReader(bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		return io.ReadAll(io.LimitReader(r, int64(size)))
	case compressionZSTD:
		return zstdDecoder.DecodeAll(body, nil)
	case compressionSnappy:
		return snappy.Decode(nil, body)
	}
	return nil, errors.New("unknown codec")
}

var zstdDecoder, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))

// clientMessages are the messages of an entry's batch as a client reads them.
func clientMessages(t *testing.T, codec int32, body []byte, size uint32) [][]byte {
	t.Helper()
	batch, err := clientBatch(codec, body, size)
	if err != nil {
		t.Fatalf("cut an entry a client cannot decompress: %v", err)
	}
	return splitMessages(batch)
}

// splitMessages splits a batch into its messages (size, SingleMessageMetadata, payload), up
// to the first that is not whole.
func splitMessages(batch []byte) [][]byte {
	var out [][]byte
	for len(batch) >= 4 {
		size := uint64(binary.BigEndian.Uint32(batch))
		if size+4 > uint64(len(batch)) {
			break
		}
		var single pb.SingleMessageMetadata
		if partial.Unmarshal(batch[4:4+size], &single) != nil {
			break
		}
		end := 4 + size + uint64(single.GetPayloadSize())
		if single.GetPayloadSize() < 0 || end > uint64(len(batch)) {
			break
		}
		out, batch = append(out, batch[:end]), batch[end:]
	}
	return out
}

// words reads a bit set's words, 8 bytes each (little-endian); wordBytes writes them.
func words(b []byte) []int64 {
	var out []int64
	for ; len(b) >= 8; b = b[8:] {
		out = append(out, int64(binary.LittleEndian.Uint64(b)))
	}
	return out
}

func wordBytes(w []int64) []byte {
	var out []byte
	for _, v := range w {
		out = binary.LittleEndian.AppendUint64(out, uint64(v))
	}
	return out
}

// bit tells whether bit i of a bit set (Java's BitSet.toLongArray) is set.
func bit(words []int64, i int) bool {
	return i >= 0 && i/64 < len(words) && words[i/64]&(1<<(i%64)) != 0
}
