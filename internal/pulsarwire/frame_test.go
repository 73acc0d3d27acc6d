package pulsarwire

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

func TestCommandType(t *testing.T) {
	flow, err := proto.Marshal(&BaseCommand{Type: BaseCommand_FLOW.Enum(), Flow: &CommandFlow{ConsumerId: proto.Uint64(1), MessagePermits: proto.Uint32(5)}})
	if err != nil {
		t.Fatal(err)
	}
	// A command type this subset does not know, after a field it must skip.
	unknown := protowire.AppendTag(nil, 99, protowire.BytesType)
	unknown = protowire.AppendBytes(unknown, []byte("skipped"))
	unknown = protowire.AppendVarint(protowire.AppendTag(unknown, 1, protowire.VarintType), 250)
	for _, tc := range []struct {
		name string
		cmd  []byte
		want BaseCommand_Type
		ok   bool
	}{
		{"flow", flow, BaseCommand_FLOW, true},
		{"unknown type keeps its number", unknown, BaseCommand_Type(250), true},
		{"no type", protowire.AppendVarint(protowire.AppendTag(nil, 2, protowire.VarintType), 1), 0, false},
		{"garbage", []byte{0xff, 0xff, 0xff}, 0, false},
		{"empty", nil, 0, false},
	} {
		got, err := CommandType(tc.cmd)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("%s: CommandType = %v, %v; want %v, ok %v", tc.name, got, err, tc.want, tc.ok)
		}
	}
}

// A frame written by AppendFrame or AppendMessage reads back whole, splits into its command
// and payload, and the payload into its sections, with a checksum that holds.
func TestFrameRoundTrip(t *testing.T) {
	flow := &BaseCommand{Type: BaseCommand_FLOW.Enum(), Flow: &CommandFlow{ConsumerId: proto.Uint64(1), MessagePermits: proto.Uint32(5)}}
	msg, err := proto.Marshal(&BaseCommand{Type: BaseCommand_MESSAGE.Enum(), Message: &CommandMessage{ConsumerId: proto.Uint64(1),
		MessageId: &MessageIdData{LedgerId: proto.Uint64(3), EntryId: proto.Uint64(4)}}})
	if err != nil {
		t.Fatal(err)
	}
	brokerEntry := AppendBrokerEntry(nil, &BrokerEntryMetadata{Index: proto.Uint64(9)})
	meta, body := []byte("metadata"), []byte("a body")
	for _, tc := range []struct {
		name              string
		frame             []byte
		typ               BaseCommand_Type
		brokerEntry, meta []byte
	}{
		{"command", AppendFrame(nil, flow), BaseCommand_FLOW, nil, nil},
		{"message", AppendMessage(nil, msg, brokerEntry, meta, body), BaseCommand_MESSAGE, brokerEntry, meta},
		{"message without broker entry", AppendMessage(nil, msg, nil, meta, body), BaseCommand_MESSAGE, nil, meta},
		{"command and payload parts", AppendFrame(nil, flow, brokerEntry, AppendPayload(nil, meta, body)), BaseCommand_FLOW, brokerEntry, meta},
	} {
		// One byte per read, twice: the reader assembles each frame and reuses buf.
		r := bufio.NewReaderSize(iotest.OneByteReader(bytes.NewReader(append(bytes.Clone(tc.frame), tc.frame...))), 16)
		var buf []byte
		for range 2 {
			got, err := ReadFrame(r, buf, 1<<20)
			if err != nil || !bytes.Equal(got, tc.frame) {
				t.Fatalf("%s: ReadFrame = %d bytes, %v; want %d", tc.name, len(got), err, len(tc.frame))
			}
			buf = got
		}
		if _, err := ReadFrame(r, buf, 1<<20); !errors.Is(err, io.EOF) {
			t.Errorf("%s: after the last frame: %v", tc.name, err)
		}
		cmd, payload, err := SplitFrame(tc.frame)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if typ, err := CommandType(cmd); err != nil || typ != tc.typ {
			t.Errorf("%s: CommandType = %v, %v", tc.name, typ, err)
		}
		if tc.meta == nil {
			if len(payload) != 0 {
				t.Errorf("%s: payload of %d bytes", tc.name, len(payload))
			}
			continue
		}
		gotEntry, gotMeta, gotBody, err := SplitPayload(payload)
		if err != nil || !bytes.Equal(gotEntry, tc.brokerEntry) || !bytes.Equal(gotMeta, tc.meta) || !bytes.Equal(gotBody, body) {
			t.Errorf("%s: SplitPayload = %q, %q, %q, %v", tc.name, gotEntry, gotMeta, gotBody, err)
		}
		if err := VerifyChecksum(payload); err != nil {
			t.Errorf("%s: VerifyChecksum: %v", tc.name, err)
		}
		payload[len(payload)-1] ^= 1
		if err := VerifyChecksum(payload); err == nil || err.Error() != "checksum mismatch" {
			t.Errorf("%s: VerifyChecksum of a changed body: %v", tc.name, err)
		}
	}
}

func TestFrameSize(t *testing.T) {
	for _, tc := range []struct {
		field uint32
		max   int
		want  int
		err   string
	}{
		{4, 100, 8, ""},
		{100, 100, 104, ""},
		{101, 100, 0, "size 101 (allowed 4..100)"},
		{3, 100, 0, "size 3 (allowed 4..100)"},
		{1<<32 - 1, 1 << 30, 0, "size 4294967295 (allowed 4..1073741824)"},
	} {
		got, err := FrameSize(binary.BigEndian.AppendUint32(nil, tc.field), tc.max)
		if got != tc.want || (err == nil) != (tc.err == "") || (err != nil && err.Error() != tc.err) {
			t.Errorf("FrameSize(%d, %d) = %d, %v; want %d, %q", tc.field, tc.max, got, err, tc.want, tc.err)
		}
	}
}

// ReadFrame returns what it read of a frame it cannot read whole, so that the recorder passes
// it on as it came, and says why.
func TestReadFrameCutShort(t *testing.T) {
	frame := AppendFrame(nil, &BaseCommand{Type: BaseCommand_PING.Enum(), Ping: &CommandPing{}})
	for _, tc := range []struct {
		name   string
		stream []byte
		want   error
		text   string
	}{
		{"nothing", nil, io.EOF, "EOF"},
		{"in the size field", frame[:2], io.ErrUnexpectedEOF, "unexpected EOF"},
		{"after the size field", frame[:4], io.EOF, "EOF"},
		{"in the command", frame[:len(frame)-1], io.ErrUnexpectedEOF, "unexpected EOF"},
		{"size field too large", []byte{0, 0, 0, 101, 1}, ErrFrameSize, "frame size out of range: size 101 (allowed 4..100)"},
		{"size field too small", []byte{0, 0, 0, 3, 1}, ErrFrameSize, "frame size out of range: size 3 (allowed 4..100)"},
	} {
		got, err := ReadFrame(bufio.NewReader(bytes.NewReader(tc.stream)), make([]byte, 0, 64), 100)
		if !errors.Is(err, tc.want) || err.Error() != tc.text {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.text)
		}
		read := tc.stream
		if tc.want == ErrFrameSize {
			read = tc.stream[:4] // the size field, not what follows it
		}
		if !bytes.Equal(got, read) {
			t.Errorf("%s: returned %v, want %v", tc.name, got, read)
		}
	}
}

// What SplitFrame and SplitPayload say of frames and payloads that do not hold what their sizes
// claim; SplitPayload still returns a whole broker-entry section.
func TestSplitRefusals(t *testing.T) {
	if _, _, err := SplitFrame([]byte{0, 0, 0, 7, 0, 0, 0, 9, 1, 2, 3}); err == nil || err.Error() != "command of 9 bytes in a frame of 11" {
		t.Errorf("SplitFrame: %v", err)
	}
	brokerEntry := AppendBrokerEntry(nil, &BrokerEntryMetadata{Index: proto.Uint64(9)})
	for _, tc := range []struct {
		name        string
		payload     []byte
		brokerEntry []byte
		err         string
	}{
		{"broker entry cut", brokerEntry[:len(brokerEntry)-1], nil, "broker-entry metadata exceeds the payload"},
		{"no metadata size", append(bytes.Clone(brokerEntry), 0, 0), brokerEntry, "short message metadata"},
		{"metadata cut", append(bytes.Clone(brokerEntry), 0, 0, 0, 9, 1), brokerEntry, "message metadata exceeds the payload"},
		{"checksum, metadata cut", AppendPayload(nil, []byte("meta"), nil)[:12], nil, "message metadata exceeds the payload"},
		// A magic in fewer than 6 bytes opens no section: they are read as the metadata's size.
		{"magic alone", []byte{0x0e, 0x01, 0, 0}, nil, "message metadata exceeds the payload"},
		{"short", []byte{0x0e, 0x02}, nil, "short message metadata"},
	} {
		gotEntry, _, _, err := SplitPayload(tc.payload)
		if err == nil || err.Error() != tc.err || !bytes.Equal(gotEntry, tc.brokerEntry) {
			t.Errorf("%s: SplitPayload = broker entry %v, %v; want %v, %q", tc.name, gotEntry, err, tc.brokerEntry, tc.err)
		}
	}
}

// AppendFrame encodes a command that misses required fields, as a peer sent it, and keeps the
// fields this subset of the protocol does not know.
func TestAppendFrameKeepsWhatPeersSent(t *testing.T) {
	partial := &BaseCommand{Type: BaseCommand_FLOW.Enum(), Flow: &CommandFlow{MessagePermits: proto.Uint32(1)}} // no consumer_id
	unknown := protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 7)
	partial.ProtoReflect().SetUnknown(unknown)
	cmd, _, err := SplitFrame(AppendFrame(nil, partial))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(cmd), string(unknown)) {
		t.Errorf("unknown field lost: %x", cmd)
	}
	var back BaseCommand
	if err := (proto.UnmarshalOptions{AllowPartial: true}).Unmarshal(cmd, &back); err != nil || !proto.Equal(&back, partial) {
		t.Errorf("decoded %v, %v; want %v", &back, err, partial)
	}
}
