package sidecar

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// rawClient speaks the protocol frame by frame, to send what no client library sends.
type rawClient struct {
	t  *testing.T
	nc net.Conn
	r  *bufio.Reader
}

// dialRaw connects to a sidecar and, when connect is set, sends CONNECT and waits for
// CONNECTED.
func dialRaw(t *testing.T, url string, connect bool) *rawClient {
	t.Helper()
	nc, err := net.Dial("tcp", strings.TrimPrefix(url, "pulsar://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	c := &rawClient{t: t, nc: nc, r: bufio.NewReader(nc)}
	if connect {
		c.send(connectFrame())
		c.await(pb.BaseCommand_CONNECTED)
	}
	return c
}

func (c *rawClient) send(frames ...[]byte) {
	c.t.Helper()
	for _, f := range frames {
		if _, err := c.nc.Write(f); err != nil {
			c.t.Fatal(err)
		}
	}
}

// await reads frames until a command of type typ, answering PINGs, and returns it with its
// frame.
func (c *rawClient) await(typ pb.BaseCommand_Type) (*pb.BaseCommand, frame) {
	c.t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(waitFor))
	defer func() { _ = c.nc.SetReadDeadline(time.Time{}) }()
	for {
		var header [4]byte
		if _, err := io.ReadFull(c.r, header[:]); err != nil {
			c.t.Fatalf("waiting for %v: %v", typ, err)
		}
		raw := make([]byte, 4+binary.BigEndian.Uint32(header[:]))
		copy(raw, header[:])
		if _, err := io.ReadFull(c.r, raw[4:]); err != nil {
			c.t.Fatalf("waiting for %v: %v", typ, err)
		}
		f, err := parseFrame(raw)
		if err != nil {
			c.t.Fatal(err)
		}
		cmd, err := f.decode()
		if err != nil {
			c.t.Fatal(err)
		}
		switch cmd.GetType() {
		case typ:
			return cmd, f
		case pb.BaseCommand_PING:
			c.send(encodeCommand(&pb.BaseCommand{Type: pb.BaseCommand_PONG.Enum(), Pong: &pb.CommandPong{}}))
		case pb.BaseCommand_ERROR:
			c.t.Fatalf("waiting for %v: %v", typ, cmd.GetError())
		}
	}
}

// subscribe subscribes consumer id to topic's subscription "s" (Shared, from the earliest
// message) and waits for the answer.
func (c *rawClient) subscribe(topic, name string, id uint64) {
	c.t.Helper()
	c.send(subscribeFrame(topic, name, id))
	c.await(pb.BaseCommand_SUCCESS)
}

func subscribeFrame(topic, name string, id uint64) []byte {
	return encodeCommand(&pb.BaseCommand{Type: pb.BaseCommand_SUBSCRIBE.Enum(), Subscribe: subscribeCommand(topic, name, id)})
}

func subscribeCommand(topic, name string, id uint64) *pb.CommandSubscribe {
	return &pb.CommandSubscribe{Topic: proto.String(topic), Subscription: proto.String("s"),
		SubType: pb.CommandSubscribe_Shared.Enum(), ConsumerId: proto.Uint64(id), RequestId: proto.Uint64(id),
		ConsumerName: proto.String(name), InitialPosition: pb.CommandSubscribe_Earliest.Enum()}
}
