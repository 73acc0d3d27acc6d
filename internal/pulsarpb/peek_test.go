package pulsarpb

import (
	"testing"

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
