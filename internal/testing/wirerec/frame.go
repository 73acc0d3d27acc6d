package wirerec

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/proto"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

const (
	// maxFrameSize bounds what is decoded. Pulsar frames are at most the
	// broker's maxMessageSize (5 MiB by default, configurable) plus headroom;
	// anything larger is still forwarded, undecoded (see pump).
	maxFrameSize = 64 << 20

	magicChecksum    = 0x0e01
	magicBrokerEntry = 0x0e02
)

// errFrameSize means the stream does not look like Pulsar frames any more.
var errFrameSize = errors.New("frame size out of range")

// readFrame reads one whole frame, length prefix included, into buf (reused
// when large enough). On error it returns the bytes read so far, so that a
// truncated frame is still forwarded as it came.
func readFrame(r *bufio.Reader, buf []byte) ([]byte, error) {
	buf = buf[:0]
	var header [4]byte
	n, err := io.ReadFull(r, header[:])
	buf = append(buf, header[:n]...)
	if err != nil {
		return buf, err
	}
	total := binary.BigEndian.Uint32(header[:])
	if total < 4 || total > maxFrameSize {
		return buf, fmt.Errorf("%w: %d bytes", errFrameSize, total)
	}
	size := 4 + int(total)
	if cap(buf) < size {
		grown := make([]byte, 4, size)
		copy(grown, buf)
		buf = grown
	}
	buf = buf[:size]
	n, err = io.ReadFull(r, buf[4:])
	return buf[:4+n], err
}

// splitFrame returns the command and payload of a whole frame.
func splitFrame(frame []byte) (cmd, payload []byte, err error) {
	cmdSize := binary.BigEndian.Uint32(frame[4:])
	if uint64(cmdSize)+8 > uint64(len(frame)) {
		return nil, nil, fmt.Errorf("command size %d exceeds frame of %d bytes", cmdSize, len(frame))
	}
	return frame[8 : 8+cmdSize], frame[8+cmdSize:], nil
}

// decodeOptions accept commands that miss required fields: a recorder
// reports what it saw rather than judging it.
var decodeOptions = proto.UnmarshalOptions{AllowPartial: true}

// entryInfo is what a MESSAGE payload says about its entry.
type entryInfo struct {
	messages int     // num_messages_in_batch; 1 for a message sent unbatched
	index    *uint64 // broker-entry index, nil when the broker sent none
}

// parseEntry reads a MESSAGE payload: the optional broker-entry section, the
// optional checksum and the message metadata.
func parseEntry(payload []byte) (entryInfo, error) {
	info := entryInfo{messages: 1}
	p := payload
	if len(p) >= 2 && binary.BigEndian.Uint16(p) == magicBrokerEntry {
		if len(p) < 6 {
			return info, errors.New("short broker-entry header")
		}
		size := binary.BigEndian.Uint32(p[2:])
		if uint64(size)+6 > uint64(len(p)) {
			return info, errors.New("broker-entry metadata exceeds payload")
		}
		var meta pb.BrokerEntryMetadata
		if err := decodeOptions.Unmarshal(p[6:6+size], &meta); err != nil {
			return info, fmt.Errorf("broker-entry metadata: %w", err)
		}
		if meta.Index != nil {
			index := meta.GetIndex()
			info.index = &index
		}
		p = p[6+size:]
	}
	if len(p) >= 2 && binary.BigEndian.Uint16(p) == magicChecksum {
		if len(p) < 6 {
			return info, errors.New("short checksum header")
		}
		p = p[6:]
	}
	if len(p) < 4 {
		return info, errors.New("short metadata header")
	}
	size := binary.BigEndian.Uint32(p)
	if uint64(size)+4 > uint64(len(p)) {
		return info, errors.New("message metadata exceeds payload")
	}
	var meta pb.MessageMetadata
	if err := decodeOptions.Unmarshal(p[4:4+size], &meta); err != nil {
		return info, fmt.Errorf("message metadata: %w", err)
	}
	info.messages = int(meta.GetNumMessagesInBatch())
	return info, nil
}

// routeThroughProxy rewrites a LOOKUP_RESPONSE that sends the client to a
// broker so that it sets proxy_through_service_url: the client then keeps
// dialing its service URL (this proxy) and names the broker in
// CONNECT.proxy_to_broker_url. It returns nil when the frame needs no change.
func routeThroughProxy(cmd *pb.BaseCommand) ([]byte, error) {
	resp := cmd.GetLookupTopicResponse()
	switch resp.GetResponse() {
	case pb.CommandLookupTopicResponse_Connect, pb.CommandLookupTopicResponse_Redirect:
	default:
		return nil, nil
	}
	if resp.GetProxyThroughServiceUrl() {
		return nil, nil
	}
	resp.ProxyThroughServiceUrl = proto.Bool(true)
	body, err := proto.MarshalOptions{AllowPartial: true}.Marshal(cmd)
	if err != nil {
		return nil, err
	}
	frame := binary.BigEndian.AppendUint32(nil, uint32(4+len(body)))
	frame = binary.BigEndian.AppendUint32(frame, uint32(len(body)))
	return append(frame, body...), nil
}
