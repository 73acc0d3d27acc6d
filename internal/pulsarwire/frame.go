package pulsarwire

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// A frame is [size][command size][command][payload]: both sizes are 4-byte big-endian, size
// counts what follows it, and the payload (MESSAGE, SEND) is
// [broker-entry section][checksum section][metadata size][metadata][message or batch], its
// first two sections optional.

// DefaultMaxMessageSize is the broker's maxMessageSize by default
// (Commands.DEFAULT_MAX_MESSAGE_SIZE); clients take frames of the broker's maxMessageSize plus
// FramePadding (Commands.MESSAGE_SIZE_FRAME_PADDING), the room for the command and metadata.
const (
	DefaultMaxMessageSize = 5 << 20
	FramePadding          = 10 << 10
)

// The magic numbers that open a payload's optional sections: the checksum section
// ([MagicChecksum][CRC32C of what follows it]) and the broker-entry section
// ([MagicBrokerEntry][size][BrokerEntryMetadata]), which precedes it.
const (
	MagicChecksum    = 0x0e01
	MagicBrokerEntry = 0x0e02
)

// Castagnoli is the CRC32C table of the checksum section.
var Castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrFrameSize marks a size field out of the range a reader takes (ReadFrame): the stream does
// not look like Pulsar frames.
var ErrFrameSize = errors.New("frame size out of range")

// FrameSize reads the size field a frame begins with (header holds at least its 4 bytes) and
// returns the frame's length, the field included. The field must count a command's size
// field at least, and at most max.
func FrameSize(header []byte, max int) (int, error) {
	field := binary.BigEndian.Uint32(header)
	if field < 4 || uint64(field) > uint64(max) {
		return 0, fmt.Errorf("size %d (allowed 4..%d)", field, max)
	}
	return 4 + int(field), nil
}

// ReadFrame reads one whole frame, size field included, whose size field is at most max, into
// buf when it is large enough (else into a buffer of the frame's size). On error it returns
// the bytes it read, so that a reader passing frames on can pass on a truncated one as it
// came: io.EOF before the first byte, io.ErrUnexpectedEOF in the size field, ErrFrameSize
// after it, and the reader's error in the rest of the frame (io.EOF when it ends right after
// the size field).
func ReadFrame(r *bufio.Reader, buf []byte, max int) ([]byte, error) {
	buf = buf[:0]
	var header [4]byte
	n, err := io.ReadFull(r, header[:])
	buf = append(buf, header[:n]...)
	if err != nil {
		return buf, err
	}
	size, err := FrameSize(header[:], max)
	if err != nil {
		return buf, fmt.Errorf("%w: %w", ErrFrameSize, err)
	}
	buf = slices.Grow(buf, size-len(buf))[:size]
	n, err = io.ReadFull(r, buf[4:])
	return buf[:4+n], err
}

// SplitFrame returns the command and payload of a whole frame, size field included, which
// holds 8 bytes at least.
func SplitFrame(frame []byte) (cmd, payload []byte, err error) {
	cmdSize := binary.BigEndian.Uint32(frame[4:])
	if uint64(cmdSize)+8 > uint64(len(frame)) {
		return nil, nil, fmt.Errorf("command of %d bytes in a frame of %d", cmdSize, len(frame))
	}
	return frame[8 : 8+cmdSize], frame[8+cmdSize:], nil
}

// CommandType reads BaseCommand.type from an encoded command without decoding the rest, so
// that a frame passed through unread costs nothing and a command type missing from this
// subset of the protocol keeps its number. It takes the first type given.
func CommandType(cmd []byte) (BaseCommand_Type, error) {
	for len(cmd) > 0 {
		num, typ, value, rest, err := ConsumeField(cmd)
		if err != nil {
			return 0, err
		}
		if num == 1 && typ == protowire.VarintType {
			v, _ := protowire.ConsumeVarint(value)
			return BaseCommand_Type(v), nil
		}
		cmd = rest
	}
	return 0, errors.New("command without a type")
}

// ConsumeField splits the first field off an encoded message: its number, wire type and
// encoded value (tag excluded), and what follows it.
func ConsumeField(b []byte) (protowire.Number, protowire.Type, []byte, []byte, error) {
	num, wt, n := protowire.ConsumeTag(b)
	if n < 0 {
		return 0, 0, nil, nil, protowire.ParseError(n)
	}
	b = b[n:]
	if n = protowire.ConsumeFieldValue(num, wt, b); n < 0 {
		return 0, 0, nil, nil, protowire.ParseError(n)
	}
	return num, wt, b[:n], b[n:], nil
}

// SplitPayload cuts a MESSAGE or SEND payload into its sections: the optional broker-entry
// section (with its magic and size), the serialized MessageMetadata and the message or batch.
// The optional checksum section between them is dropped (VerifyChecksum checks it). On error
// the broker-entry section is still returned when it was read whole.
func SplitPayload(payload []byte) (brokerEntry, meta, body []byte, err error) {
	brokerEntry, p, err := cutBrokerEntry(payload)
	if err != nil {
		return nil, nil, nil, err
	}
	if hasChecksum(p) {
		p = p[6:]
	}
	if len(p) < 4 {
		return brokerEntry, nil, nil, errors.New("short message metadata")
	}
	size := binary.BigEndian.Uint32(p)
	if uint64(size)+4 > uint64(len(p)) {
		return brokerEntry, nil, nil, errors.New("message metadata exceeds the payload")
	}
	return brokerEntry, p[4 : 4+size], p[4+size:], nil
}

// VerifyChecksum checks the checksum section of a payload that has one (after its broker-entry
// section): the CRC32C of what follows it.
func VerifyChecksum(payload []byte) error {
	_, p, err := cutBrokerEntry(payload)
	if err != nil || !hasChecksum(p) {
		return err
	}
	if crc32.Checksum(p[6:], Castagnoli) != binary.BigEndian.Uint32(p[2:]) {
		return errors.New("checksum mismatch")
	}
	return nil
}

// cutBrokerEntry splits a payload's broker-entry section, when it has one, from the rest.
func cutBrokerEntry(payload []byte) (section, rest []byte, err error) {
	if len(payload) < 6 || binary.BigEndian.Uint16(payload) != MagicBrokerEntry {
		return nil, payload, nil
	}
	size := binary.BigEndian.Uint32(payload[2:])
	if uint64(size)+6 > uint64(len(payload)) {
		return nil, nil, errors.New("broker-entry metadata exceeds the payload")
	}
	return payload[:6+size], payload[6+size:], nil
}

func hasChecksum(p []byte) bool {
	return len(p) >= 6 && binary.BigEndian.Uint16(p) == MagicChecksum
}

// marshalOptions encode a command as it was decoded or built: a peer's command may miss
// required fields (the broker judges them), and its unknown fields are kept. Sizes come from
// the proto.Size that precedes each marshal.
var marshalOptions = proto.MarshalOptions{AllowPartial: true, UseCachedSize: true}

// AppendFrame appends the frame of cmd, with the payload's parts after it as they are.
func AppendFrame(buf []byte, cmd *BaseCommand, payload ...[]byte) []byte {
	cmdSize := proto.Size(cmd)
	total := 4 + cmdSize
	for _, p := range payload {
		total += len(p)
	}
	buf = slices.Grow(buf, 4+total)
	buf = binary.BigEndian.AppendUint32(buf, uint32(total))
	buf = binary.BigEndian.AppendUint32(buf, uint32(cmdSize))
	buf, err := marshalOptions.MarshalAppend(buf, cmd)
	if err != nil { // with AllowPartial only a broken message type fails
		panic(fmt.Sprintf("pulsarwire: encoding %v: %v", cmd.GetType(), err))
	}
	for _, p := range payload {
		buf = append(buf, p...)
	}
	return buf
}

// AppendMessage appends a frame of an encoded command (a MESSAGE, a SEND) with a payload of
// the broker-entry section when given, then meta and body checksummed (AppendPayload).
func AppendMessage(buf, cmd, brokerEntry, meta, body []byte) []byte {
	total := 4 + len(cmd) + len(brokerEntry) + 6 + 4 + len(meta) + len(body)
	buf = slices.Grow(buf, 4+total)
	buf = binary.BigEndian.AppendUint32(buf, uint32(total))
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(cmd)))
	buf = append(buf, cmd...)
	buf = append(buf, brokerEntry...)
	return AppendPayload(buf, meta, body)
}

// AppendPayload appends a payload as a producer sends it: the checksum section, then the
// metadata's size, the metadata and the body, which the checksum covers.
func AppendPayload(buf, meta, body []byte) []byte {
	buf = binary.BigEndian.AppendUint16(buf, MagicChecksum)
	sumAt := len(buf)
	buf = binary.BigEndian.AppendUint32(buf, 0)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(meta)))
	buf = append(buf, meta...)
	buf = append(buf, body...)
	binary.BigEndian.PutUint32(buf[sumAt:], crc32.Checksum(buf[sumAt+4:], Castagnoli))
	return buf
}

// AppendBrokerEntry appends the broker-entry section of m, which a broker puts before the
// stored payload of each MESSAGE to a client that supports it.
func AppendBrokerEntry(buf []byte, m *BrokerEntryMetadata) []byte {
	size := proto.Size(m)
	buf = slices.Grow(buf, 6+size)
	buf = binary.BigEndian.AppendUint16(buf, MagicBrokerEntry)
	buf = binary.BigEndian.AppendUint32(buf, uint32(size))
	buf, _ = marshalOptions.MarshalAppend(buf, m) // BrokerEntryMetadata has no required field
	return buf
}
