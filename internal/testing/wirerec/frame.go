package wirerec

import (
	"bufio"
	"fmt"

	"google.golang.org/protobuf/proto"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// maxFrameSize bounds what is decoded. Pulsar frames are at most the broker's maxMessageSize
// (5 MiB by default, configurable) plus headroom; anything larger is still forwarded,
// undecoded (see pump).
const maxFrameSize = 64 << 20

// readFrame reads one whole frame, length prefix included, into buf (reused when large
// enough). On error it returns the bytes read so far, so that a truncated frame is still
// forwarded as it came; pb.ErrFrameSize means the stream does not look like Pulsar frames.
func readFrame(r *bufio.Reader, buf []byte) ([]byte, error) {
	return pb.ReadFrame(r, buf, maxFrameSize)
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
	brokerEntry, rawMeta, _, err := pb.SplitPayload(payload)
	if brokerEntry != nil { // read whole even when what follows it is not
		var meta pb.BrokerEntryMetadata
		if err := decodeOptions.Unmarshal(brokerEntry[6:], &meta); err != nil {
			return info, fmt.Errorf("broker-entry metadata: %w", err)
		}
		if meta.Index != nil {
			index := meta.GetIndex()
			info.index = &index
		}
	}
	if err != nil {
		return info, err
	}
	var meta pb.MessageMetadata
	if err := decodeOptions.Unmarshal(rawMeta, &meta); err != nil {
		return info, fmt.Errorf("message metadata: %w", err)
	}
	info.messages = int(meta.GetNumMessagesInBatch())
	return info, nil
}

// routeThroughProxy rewrites a LOOKUP_RESPONSE that sends the client to a
// broker so that it sets proxy_through_service_url: the client then keeps
// dialing its service URL (this proxy) and names the broker in
// CONNECT.proxy_to_broker_url. It returns nil when the frame needs no change.
func routeThroughProxy(cmd *pb.BaseCommand) []byte {
	resp := cmd.GetLookupTopicResponse()
	switch resp.GetResponse() {
	case pb.CommandLookupTopicResponse_Connect, pb.CommandLookupTopicResponse_Redirect:
	default:
		return nil
	}
	if resp.GetProxyThroughServiceUrl() {
		return nil
	}
	resp.ProxyThroughServiceUrl = proto.Bool(true)
	return pb.AppendFrame(nil, cmd)
}
