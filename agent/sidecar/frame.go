package sidecar

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"golang.org/x/sync/semaphore"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// DefaultMaxFrameSize is what a broker accepts by default: maxMessageSize (5 MiB) plus the
// padding the Java broker's frame decoder allows for the command and metadata
// (Commands.DEFAULT_MAX_MESSAGE_SIZE, MESSAGE_SIZE_FRAME_PADDING). Clients take frames of the
// broker's maxMessageSize plus the same padding.
const DefaultMaxFrameSize = pb.DefaultMaxMessageSize + pb.FramePadding

// errBadFrame marks input that is not Pulsar framing: the connection is closed.
var errBadFrame = errors.New("not a Pulsar frame")

// frame is one whole frame as read, length prefix included, with its command type. cmd and
// payload alias raw.
type frame struct {
	raw     []byte
	typ     pb.BaseCommand_Type
	cmd     []byte
	payload []byte
}

// firstChunk is the most a frame's buffer starts with before its bytes have arrived; it grows
// as they do, so a peer announcing a large frame costs what it sends.
const firstChunk = bufferSize

// frameReader reads one peer's frames, whose size field (the length after the prefix) is at
// most max. Every frame gets its own buffer: a held MESSAGE keeps it.
type frameReader struct {
	r   *bufio.Reader
	max int
	// budget, for clients, bounds the memory of their frames in progress: a frame larger than
	// firstChunk takes its size from it before being read, waiting until the deadline or until
	// life ends. nil: no bound (brokers).
	budget *semaphore.Weighted
	life   context.Context
}

// read reads one frame; release gives back what it took of the budget, once the frame is
// handled.
func (fr frameReader) read(deadline time.Time) (f frame, release func(), err error) {
	header, err := fr.r.Peek(4)
	if err != nil {
		return frame{}, nil, err
	}
	size, err := pb.FrameSize(header, fr.max)
	if err != nil {
		return frame{}, nil, fmt.Errorf("%w: %w", errBadFrame, err)
	}
	release = func() {}
	if fr.budget != nil && size > firstChunk {
		ctx, cancel := fr.life, context.CancelFunc(func() {})
		if !deadline.IsZero() {
			ctx, cancel = context.WithDeadline(fr.life, deadline)
		}
		err := fr.budget.Acquire(ctx, int64(size))
		cancel()
		if err != nil {
			return frame{}, nil, fmt.Errorf("waiting for memory for a frame of %d bytes: %w", size-4, err)
		}
		release = func() { fr.budget.Release(int64(size)) }
	}
	raw, err := readGrowing(fr.r, size)
	if err == nil {
		f, err = parseFrame(raw)
	}
	if err != nil {
		release()
		return frame{}, nil, err
	}
	return f, release, nil
}

// readFrame reads one frame of a peer whose frames in progress are not bounded together.
func readFrame(r *bufio.Reader, max int) (frame, error) {
	f, _, err := frameReader{r: r, max: max}.read(time.Time{})
	return f, err
}

// readGrowing reads size bytes into a buffer that starts with what has arrived, or firstChunk,
// and doubles as more does.
func readGrowing(r *bufio.Reader, size int) ([]byte, error) {
	buf := make([]byte, min(size, max(r.Buffered(), firstChunk)))
	n, err := io.ReadFull(r, buf)
	for err == nil && n < size {
		grown := make([]byte, min(size, 2*len(buf)))
		copy(grown, buf)
		buf = grown
		var more int
		more, err = io.ReadFull(r, buf[n:])
		n += more
	}
	if err != nil {
		return nil, fmt.Errorf("frame of %d bytes cut short: %w", size-4, err)
	}
	return buf, nil
}

func parseFrame(raw []byte) (frame, error) {
	cmd, payload, err := pb.SplitFrame(raw)
	if err != nil {
		return frame{}, fmt.Errorf("%w: %v", errBadFrame, err)
	}
	typ, err := commandType(cmd)
	if err != nil {
		return frame{}, fmt.Errorf("%w: %v", errBadFrame, err)
	}
	return frame{raw: raw, typ: typ, cmd: cmd, payload: payload}, nil
}

// The gate must read every command as the broker does, or a client could pass it a FLOW or a
// SUBSCRIBE it reads as something else. The broker's decoder (LightProto) takes the last of a
// field given twice and replaces a sub-message given twice, where Go's protobuf merges it;
// no client encodes a field twice. So the sidecar refuses what the two could read apart: a
// type given twice, another command's field beside the type's own (Pulsar numbers each
// command's field as its type) and, in the commands it decodes, a sub-message given twice.
// Fields the protocol does not define pass: the broker skips them.
//
// commandType reads BaseCommand.type of a command that names one command.
func commandType(cmd []byte) (pb.BaseCommand_Type, error) {
	var typ pb.BaseCommand_Type
	typed, own := false, protowire.Number(0)
	for len(cmd) > 0 {
		num, wt, value, rest, err := pb.ConsumeField(cmd)
		if err != nil {
			return 0, err
		}
		cmd = rest
		switch {
		case num == fieldCommandType && (typed || wt != protowire.VarintType):
			return 0, errors.New("command type given twice")
		case num == fieldCommandType:
			v, _ := protowire.ConsumeVarint(value)
			typ, typed = pb.BaseCommand_Type(v), true // the low 32 bits, as the broker reads an enum
		case num > maxCommandField:
		case own != 0:
			return 0, fmt.Errorf("command with fields %d and %d", own, num)
		default:
			own = num
		}
	}
	if !typed {
		return 0, errors.New("command without a type")
	}
	if own != 0 && own != protowire.Number(typ) {
		return 0, fmt.Errorf("%v command carrying field %d", typ, own)
	}
	return typ, nil
}

// maxCommandField is the highest field number of BaseCommand in PulsarApi.proto
// (topicMigrated, as TOPIC_MIGRATED).
const maxCommandField = 68

const fieldCommandType = 1

var baseCommand = (*pb.BaseCommand)(nil).ProtoReflect().Descriptor()

// maxNesting bounds how deep checkSubMessagesOnce follows sub-messages; Pulsar's commands
// nest three deep.
const maxNesting = 16

// checkSubMessagesOnce refuses an encoded message of type md in which a singular sub-message
// is given twice, at any depth.
func checkSubMessagesOnce(b []byte, md protoreflect.MessageDescriptor, depth int) error {
	if depth > maxNesting {
		return errors.New("command nested too deep")
	}
	var seen uint64 // by field number below 64, which is every sub-message field of the protocol
	for len(b) > 0 {
		num, wt, value, rest, err := pb.ConsumeField(b)
		if err != nil {
			return err
		}
		b = rest
		fd := md.Fields().ByNumber(num)
		if fd == nil || fd.Message() == nil || wt != protowire.BytesType {
			continue
		}
		if fd.Cardinality() != protoreflect.Repeated {
			if num >= 64 {
				return fmt.Errorf("%s: field number %d not expected", fd.FullName(), num)
			}
			if seen&(1<<num) != 0 {
				return fmt.Errorf("%s given twice", fd.FullName())
			}
			seen |= 1 << num
		}
		inner, _ := protowire.ConsumeBytes(value)
		if err := checkSubMessagesOnce(inner, fd.Message(), depth+1); err != nil {
			return err
		}
	}
	return nil
}

// decodeOptions accept commands that miss required fields: the broker judges them, the
// sidecar only reads what it needs. Unknown fields are kept, so a command re-encoded after a
// change keeps every field the client set (pb.AppendFrame encodes so too).
var (
	decodeOptions = proto.UnmarshalOptions{AllowPartial: true}
	encodeOptions = proto.MarshalOptions{AllowPartial: true}
)

func (f frame) decode() (*pb.BaseCommand, error) {
	if err := checkSubMessagesOnce(f.cmd, baseCommand, 0); err != nil {
		return nil, fmt.Errorf("%w: %v command: %v", errBadFrame, f.typ, err)
	}
	var cmd pb.BaseCommand
	if err := decodeOptions.Unmarshal(f.cmd, &cmd); err != nil {
		return nil, fmt.Errorf("%w: %v command: %v", errBadFrame, f.typ, err)
	}
	return &cmd, nil
}

// encodeCommand frames a command without payload.
func encodeCommand(cmd *pb.BaseCommand) []byte { return pb.AppendFrame(nil, cmd) }

func flowCommand(consumerID uint64, permits uint32) []byte {
	return encodeCommand(&pb.BaseCommand{Type: pb.BaseCommand_FLOW.Enum(),
		Flow: &pb.CommandFlow{ConsumerId: proto.Uint64(consumerID), MessagePermits: proto.Uint32(permits)}})
}

func closeConsumerCommand(consumerID, requestID uint64) []byte {
	return encodeCommand(&pb.BaseCommand{Type: pb.BaseCommand_CLOSE_CONSUMER.Enum(),
		CloseConsumer: &pb.CommandCloseConsumer{ConsumerId: proto.Uint64(consumerID), RequestId: proto.Uint64(requestID)}})
}

func redeliverAllCommand(consumerID uint64) []byte {
	return encodeCommand(&pb.BaseCommand{Type: pb.BaseCommand_REDELIVER_UNACKNOWLEDGED_MESSAGES.Enum(),
		RedeliverUnacknowledgedMessages: &pb.CommandRedeliverUnacknowledgedMessages{ConsumerId: proto.Uint64(consumerID)}})
}

func successCommand(requestID uint64) []byte {
	return encodeCommand(&pb.BaseCommand{Type: pb.BaseCommand_SUCCESS.Enum(),
		Success: &pb.CommandSuccess{RequestId: proto.Uint64(requestID)}})
}

var pingFrame = encodeCommand(&pb.BaseCommand{Type: pb.BaseCommand_PING.Enum(), Ping: &pb.CommandPing{}})

// Fields of MessageMetadata read by hand (PulsarApi.proto numbers): every MESSAGE goes through
// readEntry, which skips the rest of the metadata instead of unmarshalling all of it.
const (
	fieldMetadataNumMessages    = 11
	fieldMetadataEncryptionKeys = 13
	fieldMetadataUUID           = 26
	fieldMetadataNumChunks      = 27
	fieldMetadataChunkID        = 29
)

// decodeRules are what the broker's decoder (LightProto) checks of a message beyond its wire
// format: its required fields, each with its wire type, and the rules of its sub-messages.
// It cannot skip a group either. It counts an entry whose MessageMetadata fails them as one
// message, whatever num_messages_in_batch says.
type decodeRules struct {
	required []fieldKey
	nested   map[protowire.Number]*decodeRules
}

type fieldKey struct {
	num protowire.Number
	wt  protowire.Type
}

// The rules of MessageMetadata (PulsarApi.proto): producer_name, sequence_id, publish_time;
// properties (KeyValue: key, value) and encryption_keys (EncryptionKeys: key, value, and its
// metadata, KeyValue).
var (
	keyValueRules = &decodeRules{required: []fieldKey{{1, protowire.BytesType}, {2, protowire.BytesType}}}
	metadataRules = &decodeRules{
		required: []fieldKey{{1, protowire.BytesType}, {2, protowire.VarintType}, {3, protowire.VarintType}},
		nested: map[protowire.Number]*decodeRules{4: keyValueRules, fieldMetadataEncryptionKeys: {
			required: []fieldKey{{1, protowire.BytesType}, {2, protowire.BytesType}},
			nested:   map[protowire.Number]*decodeRules{3: keyValueRules}}},
	}
)

// check refuses an encoded message the broker's decoder refuses.
func (r *decodeRules) check(msg []byte) error {
	var given uint64 // bit i: required[i]
	for len(msg) > 0 {
		num, wt, value, rest, err := pb.ConsumeField(msg)
		if err != nil {
			return err
		}
		msg = rest
		if wt == protowire.StartGroupType {
			return fmt.Errorf("group field %d", num)
		}
		for i, f := range r.required {
			if f == (fieldKey{num, wt}) {
				given |= 1 << i
			}
		}
		if sub := r.nested[num]; sub != nil && wt == protowire.BytesType {
			inner, _ := protowire.ConsumeBytes(value)
			if err := sub.check(inner); err != nil {
				return fmt.Errorf("field %d: %w", num, err)
			}
		}
	}
	for i, f := range r.required {
		if given&(1<<i) == 0 {
			return fmt.Errorf("required field %d missing", f.num)
		}
	}
	return nil
}

// entry is what the sidecar reads of a MESSAGE payload.
type entry struct {
	messages  int64  // num_messages_in_batch, 1 when unbatched: what the broker debits
	uuid      string // of a chunked message, with its chunk id and count
	chunkID   int32
	numChunks int32
}

// chunked tells whether the entry is one chunk of a message sent in several.
func (e entry) chunked() bool { return e.numChunks > 1 }

// lastChunk tells whether the entry completes its chunked message.
func (e entry) lastChunk() bool { return e.chunkID == e.numChunks-1 }

// readEntry reads a MESSAGE payload's metadata, after the optional broker-entry metadata and
// checksum sections. Metadata the broker's decoder refuses (metadataRules) counts, as the
// broker counts it, as one unchunked message, whatever its fields say.
func readEntry(payload []byte) (entry, error) {
	_, meta, _, err := pb.SplitPayload(payload)
	if err == nil {
		err = metadataRules.check(meta)
	}
	var e entry
	if err == nil {
		e, err = scanEntry(meta)
	}
	if err != nil {
		return entry{messages: 1}, err
	}
	return e, nil
}

// scanEntry reads the fields of a MessageMetadata the gate uses.
func scanEntry(meta []byte) (entry, error) {
	e := entry{messages: 1}
	for len(meta) > 0 {
		num, typ, n := protowire.ConsumeTag(meta)
		if n < 0 {
			return e, protowire.ParseError(n)
		}
		meta = meta[n:]
		switch {
		case typ == protowire.VarintType && (num == fieldMetadataNumMessages || num == fieldMetadataNumChunks || num == fieldMetadataChunkID):
			v, n := protowire.ConsumeVarint(meta)
			if n < 0 {
				return e, protowire.ParseError(n)
			}
			meta = meta[n:]
			switch num {
			case fieldMetadataNumMessages:
				e.messages = int64(int32(v))
			case fieldMetadataNumChunks:
				e.numChunks = int32(v)
			case fieldMetadataChunkID:
				e.chunkID = int32(v)
			}
		case typ == protowire.BytesType && num == fieldMetadataUUID:
			v, n := protowire.ConsumeBytes(meta)
			if n < 0 {
				return e, protowire.ParseError(n)
			}
			e.uuid, meta = string(v), meta[n:]
		default:
			if n = protowire.ConsumeFieldValue(num, typ, meta); n < 0 {
				return e, protowire.ParseError(n)
			}
			meta = meta[n:]
		}
	}
	return e, nil
}
