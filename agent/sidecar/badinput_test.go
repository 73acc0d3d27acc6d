package sidecar

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"google.golang.org/protobuf/proto"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

func connectFrame() []byte {
	return encodeCommand(&pb.BaseCommand{Type: pb.BaseCommand_CONNECT.Enum(),
		Connect: &pb.CommandConnect{ClientVersion: proto.String("raw"), ProtocolVersion: proto.Int32(20)}})
}

// A client that sends garbage, an oversized frame, a broken command, something else than
// CONNECT first, or nothing at all has its connection closed; a consumer on the same sidecar
// keeps consuming throughout.
func TestBadInputClosesOnlyThatConnection(t *testing.T) {
	const maxFrame = 256 << 10
	w := newWorld(t, Options{MaxFrameSize: maxFrame, HandshakeTimeout: time.Second})
	topic := uniqueTopic(t)
	client := newClient(t, w.url)
	cons := subscribe(t, client, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s", Name: "steady"})
	sent := produce(t, client, topic, "before", 0, 10)
	if m := missing(sent, receiveN(t, cons, len(sent))); len(m) > 0 {
		t.Fatalf("missing %v", m)
	}

	oversized := binary.BigEndian.AppendUint32(connectFrame(), maxFrame+1)
	brokenCommand := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 4), 100) // a command longer than its frame
	subscribeFirst := encodeCommand(&pb.BaseCommand{Type: pb.BaseCommand_SUBSCRIBE.Enum(),
		Subscribe: &pb.CommandSubscribe{Topic: proto.String(topic), Subscription: proto.String("s"),
			SubType: pb.CommandSubscribe_Shared.Enum(), ConsumerId: proto.Uint64(1), RequestId: proto.Uint64(1)}})
	cases := map[string][]byte{
		"garbage":         []byte("GET / HTTP/1.1\r\nHost: sidecar\r\n\r\n"),
		"oversized frame": append(oversized, make([]byte, 1024)...),
		"broken command":  append(connectFrame(), brokenCommand...),
		"no CONNECT":      subscribeFirst,
		"silence":         nil,
	}
	for name, input := range cases {
		t.Run(name, func(t *testing.T) {
			nc, err := net.Dial("tcp", w.url[len("pulsar://"):])
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			if _, err := nc.Write(input); err != nil {
				t.Fatal(err)
			}
			expectClosed(t, nc)
		})
	}

	sent = produce(t, client, topic, "after", 0, 10)
	if m := missing(sent, receiveN(t, cons, len(sent))); len(m) > 0 {
		t.Fatalf("the steady consumer missed %v after the bad clients", m)
	}
}

// expectClosed reads until the sidecar closes the connection; whatever the broker answered
// first (CONNECTED) may come before.
func expectClosed(t *testing.T, nc net.Conn) {
	t.Helper()
	if !closes(nc) {
		t.Fatal("the sidecar kept the connection open")
	}
}

// closes reads until the sidecar closes the connection and tells whether it did so within
// waitFor.
func closes(nc net.Conn) bool {
	_ = nc.SetReadDeadline(time.Now().Add(waitFor))
	_, err := io.Copy(io.Discard, nc)
	return !errors.Is(err, os.ErrDeadlineExceeded)
}
