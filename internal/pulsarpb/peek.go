package pulsarpb

import (
	"errors"

	"google.golang.org/protobuf/encoding/protowire"
)

// CommandType reads BaseCommand.type from an encoded command without decoding the rest, so
// that a frame passed through unread costs nothing and a command type missing from this
// subset of the protocol keeps its number.
func CommandType(cmd []byte) (BaseCommand_Type, error) {
	for len(cmd) > 0 {
		num, typ, n := protowire.ConsumeTag(cmd)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		cmd = cmd[n:]
		if num == 1 && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(cmd)
			if n < 0 {
				return 0, protowire.ParseError(n)
			}
			return BaseCommand_Type(v), nil
		}
		if n = protowire.ConsumeFieldValue(num, typ, cmd); n < 0 {
			return 0, protowire.ParseError(n)
		}
		cmd = cmd[n:]
	}
	return 0, errors.New("command without a type")
}
