package pulsartest

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"google.golang.org/protobuf/proto"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

const (
	magicChecksum    = 0x0e01
	magicBrokerEntry = 0x0e02
	// defaultMaxMessageSize is maxMessageSize's default, Commands.DEFAULT_MAX_MESSAGE_SIZE.
	defaultMaxMessageSize = 5 * 1024 * 1024
	// messageSizeFramePadding is Commands.MESSAGE_SIZE_FRAME_PADDING: the room a frame has for
	// its command and metadata beside a message of the maximum size.
	messageSizeFramePadding = 10 * 1024
)

// maxFrameField is the largest frame size field the broker accepts: its frame decoder
// (FrameDecoderUtil.createFrameDecoder, Netty's LengthFieldBasedFrameDecoder with
// maxFrameLength = maxMessageSize + MESSAGE_SIZE_FRAME_PADDING) counts the 4 bytes of the
// field itself, and fails a longer frame as soon as it reads the field (TooLongFrameException:
// ServerCnx.exceptionCaught closes the connection; nothing is answered).
func maxFrameField(maxMessageSize int) uint32 {
	return uint32(maxMessageSize + messageSizeFramePadding - 4)
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// readFrame reads one frame: the command and the payload that follows it. A frame whose
// size field exceeds limit is an error before any more of it is read.
func readFrame(r *bufio.Reader, limit uint32) (*pb.BaseCommand, []byte, error) {
	var header [4]byte
	if _, err := io.ReadFull(r, header[:]); err != nil {
		return nil, nil, err
	}
	total := binary.BigEndian.Uint32(header[:])
	if total < 4 || total > limit {
		return nil, nil, fmt.Errorf("frame size %d out of range", total)
	}
	// One allocation per frame: a SEND payload is kept as the stored entry.
	frame := make([]byte, total)
	if _, err := io.ReadFull(r, frame); err != nil {
		return nil, nil, err
	}
	cmdSize := binary.BigEndian.Uint32(frame)
	if uint64(cmdSize)+4 > uint64(total) {
		return nil, nil, errors.New("command size exceeds frame")
	}
	cmd := &pb.BaseCommand{}
	if err := proto.Unmarshal(frame[4:4+cmdSize], cmd); err != nil {
		return nil, nil, fmt.Errorf("decode command: %w", err)
	}
	return cmd, frame[4+cmdSize:], nil
}

// appendFrame encodes a command and optional payload parts onto buf.
func appendFrame(buf []byte, cmd *pb.BaseCommand, payload ...[]byte) []byte {
	cmdSize := proto.Size(cmd)
	total := 4 + cmdSize
	for _, p := range payload {
		total += len(p)
	}
	buf = binary.BigEndian.AppendUint32(buf, uint32(total))
	buf = binary.BigEndian.AppendUint32(buf, uint32(cmdSize))
	buf, _ = proto.MarshalOptions{}.MarshalAppend(buf, cmd)
	for _, p := range payload {
		buf = append(buf, p...)
	}
	return buf
}

// parseSendPayload reads the message metadata of a SEND payload and checks
// its CRC when present.
func parseSendPayload(payload []byte) (*pb.MessageMetadata, []byte, error) {
	p := payload
	if len(p) >= 2 && binary.BigEndian.Uint16(p) == magicChecksum {
		if len(p) < 6 {
			return nil, nil, errors.New("short checksum header")
		}
		sum := binary.BigEndian.Uint32(p[2:])
		p = p[6:]
		if crc32.Checksum(p, castagnoli) != sum {
			return nil, nil, errors.New("checksum mismatch")
		}
	}
	if len(p) < 4 {
		return nil, nil, errors.New("short metadata header")
	}
	metaSize := binary.BigEndian.Uint32(p)
	if uint64(metaSize)+4 > uint64(len(p)) {
		return nil, nil, errors.New("metadata size exceeds payload")
	}
	meta := &pb.MessageMetadata{}
	if err := proto.Unmarshal(p[4:4+metaSize], meta); err != nil {
		return nil, nil, fmt.Errorf("decode metadata: %w", err)
	}
	return meta, p[4+metaSize:], nil
}

// brokerEntrySection encodes the broker-entry metadata that precedes a
// stored entry in MESSAGE frames.
func brokerEntrySection(m *pb.BrokerEntryMetadata) []byte {
	body, _ := proto.Marshal(m)
	out := make([]byte, 0, 6+len(body))
	out = binary.BigEndian.AppendUint16(out, magicBrokerEntry)
	out = binary.BigEndian.AppendUint32(out, uint32(len(body)))
	return append(out, body...)
}
