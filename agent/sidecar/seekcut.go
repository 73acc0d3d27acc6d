package sidecar

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/klauspost/compress/snappy"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/subflow-dev/subflow/agent/protocol"
	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// seekCut hides the messages before a seek's target inside the target's batch entry. After a
// reset the broker delivers that entry from its first message, and a client hands on every
// message of an entry; so the sidecar rewrites the entry to begin at the target, as the agent
// filters it. The messages keep their indexes: a client numbers a batch's messages back from
// the entry's broker index, which counts the last one.
type seekCut struct {
	ledger, entry uint64
	keepFrom      int32 // the target's batch index: the first message kept
}

// seekCutOf reads the cut a seek position asks for from its message id,
// "ledger:entry:partition:batch"; none when the target begins its entry.
func seekCutOf(p protocol.SeekPosition) (seekCut, bool) {
	parts := strings.Split(p.MessageID, ":")
	if len(parts) != 4 {
		return seekCut{}, false
	}
	ledger, err1 := strconv.ParseUint(parts[0], 10, 64)
	entryID, err2 := strconv.ParseUint(parts[1], 10, 64)
	batch, err3 := strconv.ParseInt(parts[3], 10, 32)
	if err1 != nil || err2 != nil || err3 != nil || batch <= 0 {
		return seekCut{}, false
	}
	return seekCut{ledger: ledger, entry: entryID, keepFrom: int32(batch)}, true
}

func (s seekCut) matches(id *pb.MessageIdData) bool {
	return id != nil && id.GetLedgerId() == s.ledger && id.GetEntryId() == s.entry
}

// Compression codecs of MessageMetadata.compression (PulsarApi.proto CompressionType).
const (
	compressionNone   = 0
	compressionLZ4    = 1
	compressionZLIB   = 2
	compressionZSTD   = 3
	compressionSnappy = 4
)

// maxCutBatch bounds what a cut decompresses: a batch is at most the broker's maximum message
// size (5 MiB by default), so more than this is not a batch as the metadata says.
const maxCutBatch = 64 << 20

// errCannotCut marks an entry the sidecar forwards whole: encrypted, or not as its metadata says.
var errCannotCut = errors.New("batch entry cannot be cut")

// cutBatch rewrites a MESSAGE frame so that its batch begins at message keepFrom: the
// messages before it are removed, the checksum is computed anew, and the indexes the broker
// marks as acknowledged (ack_set) are renumbered. The rest is left uncompressed (the client
// reads any codec), unless that would make the frame larger than maxFrame, the most the client
// takes: then it is compressed again with the entry's codec, and an entry still too large is
// not cut. It returns the new frame and how many messages it removed.
func cutBatch(f frame, msg *pb.CommandMessage, keepFrom int32, maxFrame int) ([]byte, int64, error) {
	brokerEntry, meta, rest, err := batchFrom(f, keepFrom)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", errCannotCut, err)
	}
	n, codec := meta.GetNumMessagesInBatch(), meta.GetCompression()
	cmd := f.cmd
	if len(msg.GetAckSet()) > 0 {
		shifted := proto.CloneOf(msg)
		shifted.AckSet = renumberBits(msg.GetAckSet(), int(n-keepFrom), func(i int) int { return i + int(keepFrom) })
		if cmd, err = encodeOptions.Marshal(&pb.BaseCommand{Type: pb.BaseCommand_MESSAGE.Enum(), Message: shifted}); err != nil {
			return nil, 0, fmt.Errorf("%w: %w", errCannotCut, err)
		}
	}
	meta.NumMessagesInBatch = proto.Int32(n - keepFrom)
	meta.UncompressedSize = proto.Uint32(uint32(len(rest)))
	out, err := packBatch(cmd, brokerEntry, meta, rest, compressionNone)
	if err == nil && len(out)-4 > maxFrame && codec != compressionNone {
		out, err = packBatch(cmd, brokerEntry, meta, rest, codec)
	}
	if err == nil && len(out)-4 > maxFrame {
		err = fmt.Errorf("the cut entry takes %d bytes, the client at most %d", len(out)-4, maxFrame)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", errCannotCut, err)
	}
	return out, int64(keepFrom), nil
}

// batchFrom opens the batch of a MESSAGE frame: its broker-entry section, its metadata and its
// messages from keepFrom on, uncompressed.
func batchFrom(f frame, keepFrom int32) (brokerEntry []byte, meta *pb.MessageMetadata, rest []byte, err error) {
	brokerEntry, rawMeta, body, err := pb.SplitPayload(f.payload)
	if err != nil {
		return nil, nil, nil, err
	}
	if hasField(rawMeta, fieldMetadataEncryptionKeys) { // ciphertext: it cannot be opened
		return nil, nil, nil, errors.New("encrypted")
	}
	// The broker counts such an entry as one message: the messages cut would not be its debit.
	if err := metadataRules.check(rawMeta); err != nil {
		return nil, nil, nil, fmt.Errorf("metadata the broker cannot read: %w", err)
	}
	meta = &pb.MessageMetadata{}
	if err := (proto.UnmarshalOptions{AllowPartial: true}).Unmarshal(rawMeta, meta); err != nil {
		return nil, nil, nil, err
	}
	n := meta.GetNumMessagesInBatch()
	if meta.NumMessagesInBatch == nil || keepFrom <= 0 || keepFrom >= n {
		return nil, nil, nil, fmt.Errorf("message %d of a batch of %d", keepFrom, n)
	}
	// Allocation follows what the entry holds, not what its metadata claims.
	codec, size := meta.GetCompression(), int64(meta.GetUncompressedSize())
	if size > maxCutBatch || (codec != compressionNone && size > maxExpansion(codec)*int64(len(body))) {
		return nil, nil, nil, fmt.Errorf("%d bytes uncompressed announced for %d compressed", size, len(body))
	}
	batch, err := decompress(codec, body, int(size))
	if err != nil {
		return nil, nil, nil, err
	}
	rest, err = messagesFrom(batch, int(n), int(keepFrom))
	return brokerEntry, meta, rest, err
}

// packBatch frames a MESSAGE of batch, compressed with codec, and its metadata.
func packBatch(cmd, brokerEntry []byte, meta *pb.MessageMetadata, batch []byte, codec int32) ([]byte, error) {
	body, err := compress(codec, batch)
	if err != nil {
		return nil, err
	}
	meta.Compression = nil
	if codec != compressionNone {
		meta.Compression = proto.Int32(codec)
	}
	rawMeta, err := proto.MarshalOptions{AllowPartial: true}.Marshal(meta)
	if err != nil {
		return nil, err
	}
	return pb.AppendMessage(nil, cmd, brokerEntry, rawMeta, body), nil
}

// translateAck renumbers, in an ACK of the cut entry, the batch indexes the client gives
// (counted in the cut entry) to the broker's (counted in the whole entry); the messages before
// the target count as acknowledged. It tells whether it changed the command. An ACK whose bit
// sets would grow beyond maxBytes (what a frame may hold) is refused: a client acknowledges an
// entry once per ACK.
func (c *Consumer) translateAck(ack *pb.CommandAck, maxBytes int) (bool, error) {
	c.mu.Lock()
	cut, size := c.cut, int(c.cutSize)
	c.mu.Unlock()
	if cut == nil || size == 0 {
		return false, nil
	}
	sets := 0
	for _, id := range ack.GetMessageId() {
		if cut.matches(id) && len(id.GetAckSet()) > 0 {
			sets++
		}
	}
	if grown := sets * (size + 63) / 64 * 8; grown > maxBytes {
		return false, fmt.Errorf("an ACK naming the cut entry %d times would grow to %d bytes", sets, grown)
	}
	changed := false
	for _, id := range ack.GetMessageId() {
		if !cut.matches(id) {
			continue
		}
		from := int(cut.keepFrom)
		if len(id.GetAckSet()) > 0 { // a set bit is a message not acknowledged yet
			id.AckSet = renumberBits(id.GetAckSet(), size, func(i int) int { return i - from })
		}
		if id.BatchIndex != nil && id.GetBatchIndex() >= 0 {
			id.BatchIndex = proto.Int32(id.GetBatchIndex() + int32(from))
		}
		if id.BatchSize != nil {
			id.BatchSize = proto.Int32(int32(size))
		}
		changed = true
	}
	return changed, nil
}

// renumberBits builds a bit set (Java's BitSet.toLongArray, as the protocol carries it) of n
// bits whose bit i is bit from(i) of words, or clear when from(i) is out of range.
func renumberBits(words []int64, n int, from func(i int) int) []int64 {
	out := make([]int64, (n+63)/64)
	for i := range n {
		j := from(i)
		if j >= 0 && j/64 < len(words) && words[j/64]&(1<<(j%64)) != 0 {
			out[i/64] |= 1 << (i % 64)
		}
	}
	return out
}

// messagesFrom returns a batch payload from its message from on, having checked that the batch
// holds its n messages: each is a 4-byte size, its SingleMessageMetadata, then payload_size
// bytes. Each takes 4 bytes at least, so a count the bytes cannot hold ends the walk early.
func messagesFrom(batch []byte, n, from int) ([]byte, error) {
	var rest []byte
	p := batch
	for i := range n {
		if i == from {
			rest = p
		}
		if len(p) < 4 || uint64(binary.BigEndian.Uint32(p))+4 > uint64(len(p)) {
			return nil, fmt.Errorf("batch holds %d messages, its metadata says %d", i, n)
		}
		size := binary.BigEndian.Uint32(p)
		payload, err := payloadSize(p[4 : 4+size])
		if err != nil {
			return nil, err
		}
		p = p[4+size:]
		if payload < 0 || int(payload) > len(p) {
			return nil, fmt.Errorf("batch holds %d messages, its metadata says %d", i, n)
		}
		p = p[payload:]
	}
	return rest, nil
}

// fieldSinglePayloadSize is SingleMessageMetadata.payload_size.
const fieldSinglePayloadSize = 3

// payloadSize reads a SingleMessageMetadata's payload_size (the last one given, as decoders
// do) without decoding the rest.
func payloadSize(single []byte) (int32, error) {
	var size int32
	for len(single) > 0 {
		num, wt, value, rest, err := pb.ConsumeField(single)
		if err != nil {
			return 0, err
		}
		single = rest
		if num == fieldSinglePayloadSize && wt == protowire.VarintType {
			v, _ := protowire.ConsumeVarint(value)
			size = int32(v)
		}
	}
	return size, nil
}

// maxExpansion is the most a codec writes per byte of input: LZ4 255 (a length's extension
// byte), deflate 1032, Snappy 22 (a three-byte copy of 64 bytes), zstd 32768 (a four-byte RLE
// block of 128 KiB).
func maxExpansion(codec int32) int64 {
	switch codec {
	case compressionLZ4:
		return 255
	case compressionZLIB:
		return 1032
	case compressionSnappy:
		return 22
	}
	return 32 << 10
}

// decompress opens a batch payload with the codec its metadata names, into at most size bytes
// (the size announced, which the caller has checked the body can hold).
func decompress(codec int32, body []byte, size int) ([]byte, error) {
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
		defer r.Close()
		return io.ReadAll(io.LimitReader(r, int64(size)+1))
	case compressionZSTD:
		// DecodeAll refuses a frame announcing more than this bound before allocating, and stops
		// one that announces nothing once its output passes it. Its window may not pass it
		// either: a one-shot encoder's window covers the content, the smallest is 1 KiB.
		limit := uint64(max(size, zstd.MinWindowSize))
		d, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(limit))
		if err != nil {
			return nil, err
		}
		defer d.Close()
		return d.DecodeAll(body, nil)
	case compressionSnappy:
		if n, err := snappy.DecodedLen(body); err != nil || n > size {
			return nil, fmt.Errorf("snappy: %d bytes decoded, %d announced (%v)", n, size, err)
		}
		return snappy.Decode(nil, body)
	}
	return nil, fmt.Errorf("unknown compression %d", codec)
}

// compress packs a batch payload with codec, in the format the clients read: raw LZ4 and
// Snappy blocks, zlib, zstd frames.
func compress(codec int32, batch []byte) ([]byte, error) {
	switch codec {
	case compressionNone:
		return batch, nil
	case compressionLZ4:
		out := make([]byte, lz4.CompressBlockBound(len(batch)))
		n, err := lz4.CompressBlock(batch, out, nil)
		return out[:n], err
	case compressionZLIB:
		var b bytes.Buffer
		w := zlib.NewWriter(&b)
		if _, err := w.Write(batch); err != nil {
			return nil, err
		}
		err := w.Close()
		return b.Bytes(), err
	case compressionZSTD:
		e, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
		if err != nil {
			return nil, err
		}
		defer e.Close()
		return e.EncodeAll(batch, nil), nil
	case compressionSnappy:
		return snappy.Encode(nil, batch), nil
	}
	return nil, fmt.Errorf("unknown compression %d", codec)
}

// hasField tells whether an encoded message carries field num.
func hasField(msg []byte, num protowire.Number) bool {
	for len(msg) > 0 {
		n, typ, l := protowire.ConsumeTag(msg)
		if l < 0 {
			return false
		}
		if n == num {
			return true
		}
		msg = msg[l:]
		if l = protowire.ConsumeFieldValue(n, typ, msg); l < 0 {
			return false
		}
		msg = msg[l:]
	}
	return false
}
