package wirerec

import (
	"encoding/binary"
	"hash/crc32"
	"io"
	"net"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"google.golang.org/protobuf/proto"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
)

const waitFor = 20 * time.Second

// startPair starts a test broker that advertises the address of a recorder
// in front of it: every byte passes unchanged.
func startPair(t testing.TB) (*pulsartest.Broker, *Proxy) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := pulsartest.Start(t, pulsartest.Options{AdvertisedURL: "pulsar://" + ln.Addr().String()})
	return b, StartT(t, b.ServiceURL(), Options{Listener: ln})
}

// startRewritingPair starts a test broker that advertises its own address
// and a recorder that rewrites lookup answers to stay in the path.
func startRewritingPair(t testing.TB) (*pulsartest.Broker, *Proxy) {
	t.Helper()
	return startRewritingPairKeeping(t)
}

func barrier(t testing.TB, p *Proxy, c pulsar.Consumer) {
	t.Helper()
	if err := p.Barrier(c); err != nil {
		t.Fatal(err)
	}
}

// encodeFrame builds a frame the way a Pulsar peer does.
func encodeFrame(t testing.TB, cmd *pb.BaseCommand, payload []byte) []byte {
	t.Helper()
	body, err := proto.Marshal(cmd)
	if err != nil {
		t.Fatalf("encode %v: %v", cmd.GetType(), err)
	}
	frame := binary.BigEndian.AppendUint32(nil, uint32(4+len(body)+len(payload)))
	frame = binary.BigEndian.AppendUint32(frame, uint32(len(body)))
	frame = append(frame, body...)
	return append(frame, payload...)
}

func connectFrame(t testing.TB) []byte {
	return encodeFrame(t, &pb.BaseCommand{
		Type:    pb.BaseCommand_CONNECT.Enum(),
		Connect: &pb.CommandConnect{ClientVersion: proto.String("raw"), ProtocolVersion: proto.Int32(20)},
	}, nil)
}

// entryPayload builds a MESSAGE payload: broker-entry metadata with the given
// index (omitted when index < 0), checksum, metadata and a body.
func entryPayload(t testing.TB, index int64, messages int32, body []byte) []byte {
	t.Helper()
	var out []byte
	if index >= 0 {
		bem, _ := proto.Marshal(&pb.BrokerEntryMetadata{Index: proto.Uint64(uint64(index))})
		out = binary.BigEndian.AppendUint16(out, pb.MagicBrokerEntry)
		out = binary.BigEndian.AppendUint32(out, uint32(len(bem)))
		out = append(out, bem...)
	}
	meta, err := proto.Marshal(&pb.MessageMetadata{
		ProducerName: proto.String("p"), SequenceId: proto.Uint64(1), PublishTime: proto.Uint64(1),
		NumMessagesInBatch: proto.Int32(messages),
	})
	if err != nil {
		t.Fatal(err)
	}
	covered := binary.BigEndian.AppendUint32(nil, uint32(len(meta)))
	covered = append(covered, meta...)
	covered = append(covered, body...)
	out = binary.BigEndian.AppendUint16(out, pb.MagicChecksum)
	out = binary.BigEndian.AppendUint32(out, crc32.Checksum(covered, crc32.MakeTable(crc32.Castagnoli)))
	return append(out, covered...)
}

// fakeBroker accepts connections and hands each to serve.
type fakeBroker struct {
	ln    net.Listener
	conns chan net.Conn
}

func startFakeBroker(t testing.TB) *fakeBroker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeBroker{ln: ln, conns: make(chan net.Conn, 100)}
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				close(f.conns)
				return
			}
			f.conns <- nc
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })
	return f
}

// accept returns the next connection the proxy opened to the fake broker.
func (f *fakeBroker) accept(t testing.TB) net.Conn {
	t.Helper()
	select {
	case nc := <-f.conns:
		t.Cleanup(func() { _ = nc.Close() })
		return nc
	case <-time.After(waitFor):
		t.Fatal("no connection reached the broker")
		return nil
	}
}

func dial(t testing.TB, addr string) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	return nc
}

// readExactly reads n bytes with a deadline.
func readExactly(t testing.TB, nc net.Conn, n int) []byte {
	t.Helper()
	_ = nc.SetReadDeadline(time.Now().Add(waitFor))
	buf := make([]byte, n)
	if _, err := io.ReadFull(nc, buf); err != nil {
		t.Fatalf("read %d bytes: %v", n, err)
	}
	return buf
}

// writeInPieces writes data in small pieces, so the reader sees a frame
// arrive over many reads.
func writeInPieces(t testing.TB, nc net.Conn, data []byte, piece int) {
	t.Helper()
	for len(data) > 0 {
		n := min(piece, len(data))
		if _, err := nc.Write(data[:n]); err != nil {
			t.Errorf("write: %v", err)
			return
		}
		data = data[n:]
	}
}

// startRewritingPairKeeping is startRewritingPair with a record that keeps only these types
// (every type when none is named).
func startRewritingPairKeeping(t testing.TB, keep ...pb.BaseCommand_Type) (*pulsartest.Broker, *Proxy) {
	t.Helper()
	b := pulsartest.Start(t)
	return b, StartT(t, b.ServiceURL(), Options{RewriteLookups: true, Keep: keep})
}

// startUnchecked starts a proxy closed when the test ends, for tests that expect Check to
// report problems (StartT would fail them).
func startUnchecked(t testing.TB, upstream string, opts ...Options) *Proxy {
	t.Helper()
	p, err := Start(upstream, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}
