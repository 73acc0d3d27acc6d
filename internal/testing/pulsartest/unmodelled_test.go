package pulsartest

import (
	"context"
	"encoding/binary"
	"maps"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// ServerCnx.handleGetLastMessageId always sets consumer_mark_delete_position, and
// pulsar-client-go's reader reads it in HasNext after a seek by time: without it the client
// dereferences nil and the whole test binary crashes.
func TestReaderHasNextAfterASeekByTime(t *testing.T) {
	b := Start(t)
	c := newClient(t, b)
	testkit.Produce(t, testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "by-time"}), "m", 3)
	reader, err := c.CreateReader(pulsar.ReaderOptions{Topic: "by-time", StartMessageID: pulsar.EarliestMessageID()})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	for range 3 {
		if _, err := reader.Next(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := reader.SeekByTime(time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if !reader.HasNext() {
		t.Fatal("after a seek by time to before every message, the reader has no next message")
	}
	m, err := reader.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(m.Payload()); got != "m-0" {
		t.Fatalf("the first message after the seek by time is %q, want m-0", got)
	}
}

// A request this broker does not model is answered at once, as Pulsar would refuse or answer
// it, never left to the client's operation timeout; it is counted.
func TestUnmodelledRequestsAreAnswered(t *testing.T) {
	b := Start(t)
	rc := dialRaw(t, b)

	rc.send(&pb.BaseCommand{Type: pb.BaseCommand_GET_SCHEMA.Enum(),
		GetSchema: &pb.CommandGetSchema{RequestId: proto.Uint64(11), Topic: proto.String("persistent://public/default/s")}})
	got := rc.await("the GET_SCHEMA answer", func(c *pb.BaseCommand) bool {
		return c.GetType() == pb.BaseCommand_GET_SCHEMA_RESPONSE && c.GetGetSchemaResponse().GetRequestId() == 11
	}).GetGetSchemaResponse()
	if got.GetErrorCode() != pb.ServerError_TopicNotFound {
		t.Errorf("GET_SCHEMA answered %v %q, want TopicNotFound (a topic without a schema)", got.GetErrorCode(), got.GetErrorMessage())
	}

	// CONSUMER_STATS: a type wire.proto names, with a command it does not define (request_id 1).
	stats := &pb.BaseCommand{Type: pb.BaseCommand_CONSUMER_STATS.Enum()}
	stats.ProtoReflect().SetUnknown(subCommand(25, 12))
	rc.send(stats)
	// NEW_TXN (50): a type wire.proto does not name at all.
	rc.sendRaw(append(protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 50), subCommand(50, 13)...))
	for _, id := range []uint64{12, 13} {
		errFrame := rc.await("the ERROR answering the unmodelled request", func(c *pb.BaseCommand) bool {
			return c.GetType() == pb.BaseCommand_ERROR && c.GetError().GetRequestId() == id
		}).GetError()
		if errFrame.GetError() != pb.ServerError_NotAllowedError {
			t.Errorf("request %d answered %v %q, want NotAllowedError", id, errFrame.GetError(), errFrame.GetMessage())
		}
	}
	if got, want := b.Unmodelled(), map[string]int{"CONSUMER_STATS": 1, "command type 50": 1}; !maps.Equal(got, want) {
		t.Errorf("Unmodelled() = %v, want %v", got, want)
	}
}

// subCommand encodes a BaseCommand field carrying a command whose request_id (field 1) is id.
func subCommand(field protowire.Number, id uint64) []byte {
	inner := protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), id)
	return protowire.AppendBytes(protowire.AppendTag(nil, field, protowire.BytesType), inner)
}

// sendRaw writes a frame around an encoded command.
func (rc *rawClient) sendRaw(cmd []byte) {
	rc.t.Helper()
	frame := binary.BigEndian.AppendUint32(nil, uint32(4+len(cmd)))
	frame = binary.BigEndian.AppendUint32(frame, uint32(len(cmd)))
	if _, err := rc.nc.Write(append(frame, cmd...)); err != nil {
		rc.t.Fatal(err)
	}
}
