package sidecar

import (
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/subflow-dev/subflow/agent/protocol"
	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// Tests of what the fuzz targets found (their inputs are in testdata/fuzz/).

// entryWithMetadata is a MESSAGE for consumer 1, entry 1:20, whose metadata is meta.
func entryWithMetadata(meta []byte) []byte {
	payload := append(binary.BigEndian.AppendUint32(nil, uint32(len(meta))), meta...)
	cmd, _ := proto.Marshal(&pb.BaseCommand{Type: pb.BaseCommand_MESSAGE.Enum(), Message: &pb.CommandMessage{
		ConsumerId: proto.Uint64(1), MessageId: &pb.MessageIdData{LedgerId: proto.Uint64(1), EntryId: proto.Uint64(20)}}})
	return frameOf(cmd, append(payload, "body"...))
}

// A MESSAGE whose metadata the broker's decoder cannot read counts as one message (what the
// broker debits then), however many its readable fields claim: a paused consumer holds one,
// not the 48 announced before a broken field (FuzzBrokerMessage/d9e44dbefb5d537b), before a
// broken property (FuzzBrokerMessage/44467d76da134684), or beside a missing required field.
func TestUnreadableMetadataCountsAsOneMessage(t *testing.T) {
	base := &pb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(1),
		PublishTime: proto.Uint64(1), NumMessagesInBatch: proto.Int32(48)}
	valid, _ := proto.Marshal(base)
	noProducer, _ := proto.Marshal(&pb.MessageMetadata{SequenceId: proto.Uint64(1), PublishTime: proto.Uint64(1),
		NumMessagesInBatch: proto.Int32(48)})
	for name, meta := range map[string][]byte{
		"a field cut short": append(protowire.AppendTag(slices.Clone(valid), 12, protowire.Fixed64Type), 0), // 1 byte of 8
		"a broken property": protowire.AppendBytes(protowire.AppendTag(slices.Clone(valid), 4, protowire.BytesType), []byte{0x30}),
		"a property without value": protowire.AppendBytes(protowire.AppendTag(slices.Clone(valid), 4, protowire.BytesType),
			protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "k")),
		"no producer name": noProducer,
	} {
		t.Run(name, func(t *testing.T) {
			sb := startScripted(t, Options{}, 100)
			if err := sb.consumer.SetState(context.Background(), protocol.Paused, 1); err != nil {
				t.Fatal(err)
			}
			sb.send(entryWithMetadata(meta), pingFrame)
			if got := nextMessages(t, sb.fromSidecar); len(got) != 0 {
				t.Fatalf("a paused client got entries %v", got)
			}
			if held := sb.consumer.Counts().Held; held != 1 {
				t.Errorf("%d messages held for an entry whose metadata the broker cannot read, want 1", held)
			}
		})
	}
}

// A batch entry the sidecar cannot open is delivered whole: an encrypted one (encryption_keys,
// field 13 of MessageMetadata in PulsarApi.proto), and one whose metadata the broker's decoder
// refuses, which the broker counts as one message (FuzzCutBatch/a58ab8cf1e683cd5: cut, it made
// the sidecar grant back permits the broker had not debited). A batch sent to chosen clusters
// (replicate_to, field 7) is cut like any other.
func TestCutLeavesWholeWhatItCannotOpen(t *testing.T) {
	replicateTo := protowire.AppendString(protowire.AppendTag(nil, 7, protowire.BytesType), "east")
	noValue := protowire.AppendBytes(protowire.AppendTag(nil, 4, protowire.BytesType), // a property without its value
		protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "k"))
	for name, c := range map[string]struct {
		extra []byte
		cut   bool
	}{
		"encrypted":               {encryptionKeys("key", "encrypted data key"), false},
		"unreadable metadata":     {noValue, false},
		"sent to chosen clusters": {replicateTo, true},
	} {
		t.Run(name, func(t *testing.T) {
			in := batchFrame(t, 10, compressionNone, nil, c.extra)
			_, _, err := cutBatch(in, &pb.CommandMessage{}, 5, DefaultMaxFrameSize)
			if c.cut && err != nil {
				t.Errorf("not cut: %v", err)
			}
			if !c.cut && !errors.Is(err, errCannotCut) {
				t.Errorf("cut (%v); want it delivered whole", err)
			}
		})
	}
}
