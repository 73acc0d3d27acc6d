package sidecar

import (
	"encoding/binary"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
)

// A command the broker could read otherwise than the sidecar - a type given twice (the broker
// takes the last, so a FLOW could pass the gate as a SEND), a field beside its type's, a
// sub-message given twice (the broker keeps the last, Go's protobuf merges) - closes the
// client's connection: nothing of it reaches the broker, which sends the paused consumer
// nothing.
func TestAmbiguousCommandClosesTheConnection(t *testing.T) {
	typed := func(b []byte, typ pb.BaseCommand_Type) []byte {
		return protowire.AppendVarint(protowire.AppendTag(b, fieldCommandType, protowire.VarintType), uint64(typ))
	}
	field := func(b []byte, num protowire.Number, m proto.Message) []byte {
		enc, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), enc)
	}
	flow := func(id uint64, permits uint32) *pb.CommandFlow {
		return &pb.CommandFlow{ConsumerId: proto.Uint64(id), MessagePermits: proto.Uint32(permits)}
	}
	const (
		fieldSubscribe = protowire.Number(pb.BaseCommand_SUBSCRIBE)
		fieldFlow      = protowire.Number(pb.BaseCommand_FLOW)
		fieldStartID   = 9 // CommandSubscribe.start_message_id
	)
	startAt := func(entry uint64) *pb.MessageIdData {
		return &pb.MessageIdData{LedgerId: proto.Uint64(1), EntryId: proto.Uint64(entry)}
	}
	for name, command := range map[string]func(topic string) []byte{
		"FLOW typed SEND first": func(string) []byte {
			return typed(field(typed(nil, pb.BaseCommand_SEND), fieldFlow, flow(1, 500)), pb.BaseCommand_FLOW)
		},
		"SEND carrying a FLOW": func(string) []byte {
			return field(typed(nil, pb.BaseCommand_SEND), fieldFlow, flow(1, 500))
		},
		"FLOW given twice": func(string) []byte {
			return field(field(typed(nil, pb.BaseCommand_FLOW), fieldFlow, flow(2, 0)), fieldFlow, flow(1, 500))
		},
		"SUBSCRIBE typed SEND first": func(topic string) []byte {
			return typed(field(typed(nil, pb.BaseCommand_SEND), fieldSubscribe, subscribeCommand(topic, "hidden", 2)), pb.BaseCommand_SUBSCRIBE)
		},
		"SUBSCRIBE with two start positions": func(topic string) []byte {
			sub, err := proto.Marshal(subscribeCommand(topic, "second", 2))
			if err != nil {
				t.Fatal(err)
			}
			sub = field(field(sub, fieldStartID, startAt(0)), fieldStartID, startAt(5))
			return protowire.AppendBytes(protowire.AppendTag(typed(nil, pb.BaseCommand_SUBSCRIBE), fieldSubscribe, protowire.BytesType), sub)
		},
	} {
		t.Run(name, func(t *testing.T) {
			w := newWorld(t)
			topic := uniqueTopic(t)
			produce(t, newClient(t, w.brokerTU), topic, "m", 0, 5)
			pauseOnSubscribe(w.sidecar, "raw")
			c := dialRaw(t, w.url, true)
			c.subscribe(topic, "raw", 1)

			cmd := command(topic)
			frame := binary.BigEndian.AppendUint32(nil, uint32(4+len(cmd)))
			c.send(append(binary.BigEndian.AppendUint32(frame, uint32(len(cmd))), cmd...))
			closed := closes(c.nc)
			if got := w.rec.Events(wirerec.Filter{}, pb.BaseCommand_MESSAGE); len(got) > 0 {
				t.Errorf("the broker sent %d MESSAGE frames to a consumer paused from its start", len(got))
			}
			if !closed {
				t.Error("the sidecar kept the connection open")
			}
		})
	}
}
