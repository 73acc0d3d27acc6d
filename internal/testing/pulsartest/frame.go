package pulsartest

import (
	"bufio"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// maxFrameField is the largest frame size field the broker accepts: its frame decoder
// (FrameDecoderUtil.createFrameDecoder, Netty's LengthFieldBasedFrameDecoder with
// maxFrameLength = maxMessageSize + MESSAGE_SIZE_FRAME_PADDING) counts the 4 bytes of the
// field itself, and fails a longer frame as soon as it reads the field (TooLongFrameException:
// ServerCnx.exceptionCaught closes the connection; nothing is answered).
func maxFrameField(maxMessageSize int) uint32 {
	return uint32(maxMessageSize + pb.FramePadding - 4)
}

// readFrame reads one frame: the command and the payload that follows it. A frame whose
// size field exceeds limit is an error before any more of it is read. Each frame has a buffer
// of its own: a SEND payload is kept as the stored entry.
func readFrame(r *bufio.Reader, limit uint32) (*pb.BaseCommand, []byte, error) {
	frame, err := pb.ReadFrame(r, nil, int(limit))
	if err != nil {
		return nil, nil, err
	}
	cmdBytes, payload, err := pb.SplitFrame(frame)
	if err != nil {
		return nil, nil, err
	}
	cmd := &pb.BaseCommand{}
	if err := proto.Unmarshal(cmdBytes, cmd); err != nil {
		return nil, nil, fmt.Errorf("decode command: %w", err)
	}
	return cmd, payload, nil
}

// parseSendPayload reads the message metadata of a SEND payload and checks its CRC when
// present. A producer sends no broker-entry section: the broker adds it.
func parseSendPayload(payload []byte) (*pb.MessageMetadata, []byte, error) {
	if err := pb.VerifyChecksum(payload); err != nil {
		return nil, nil, err
	}
	brokerEntry, rawMeta, body, err := pb.SplitPayload(payload)
	if err != nil {
		return nil, nil, err
	}
	if brokerEntry != nil {
		return nil, nil, errors.New("broker-entry metadata in a SEND")
	}
	meta := &pb.MessageMetadata{}
	if err := proto.Unmarshal(rawMeta, meta); err != nil {
		return nil, nil, fmt.Errorf("decode metadata: %w", err)
	}
	return meta, body, nil
}
