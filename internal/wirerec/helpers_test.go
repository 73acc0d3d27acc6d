package wirerec

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"
	"google.golang.org/protobuf/proto"

	pb "github.com/subflow-dev/subflow/internal/pulsarpb"
	"github.com/subflow-dev/subflow/internal/pulsartest"
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

func newClient(t testing.TB, url string) pulsar.Client {
	t.Helper()
	c, err := pulsar.NewClient(pulsar.ClientOptions{
		URL:               url,
		OperationTimeout:  15 * time.Second,
		ConnectionTimeout: 5 * time.Second,
		Logger:            log.DefaultNopLogger(),
	})
	if err != nil {
		t.Fatalf("new client: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

func subscribe(t testing.TB, c pulsar.Client, opts pulsar.ConsumerOptions) pulsar.Consumer {
	t.Helper()
	cons, err := c.Subscribe(opts)
	if err != nil {
		t.Fatalf("subscribe %s/%s: %v", opts.Topic, opts.SubscriptionName, err)
	}
	t.Cleanup(cons.Close)
	return cons
}

func newProducer(t testing.TB, c pulsar.Client, opts pulsar.ProducerOptions) pulsar.Producer {
	t.Helper()
	p, err := c.CreateProducer(opts)
	if err != nil {
		t.Fatalf("create producer on %s: %v", opts.Topic, err)
	}
	t.Cleanup(p.Close)
	return p
}

// produce sends n messages "<prefix>-<i>" with SendAsync, so that a batching
// producer groups them, then flushes and waits for every receipt.
func produce(t testing.TB, p pulsar.Producer, prefix string, n int) {
	t.Helper()
	errs := make(chan error, n)
	for i := range n {
		msg := &pulsar.ProducerMessage{Payload: fmt.Appendf(nil, "%s-%d", prefix, i)}
		p.SendAsync(context.Background(), msg, func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) { errs <- err })
	}
	if err := p.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatalf("send: %v", err)
		}
	}
}

// receive takes n messages, acking each.
func receive(t testing.TB, c pulsar.Consumer, n int) []pulsar.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	out := make([]pulsar.Message, 0, n)
	for len(out) < n {
		m, err := c.Receive(ctx)
		if err != nil {
			t.Fatalf("received %d of %d: %v", len(out), n, err)
		}
		if err := c.Ack(m); err != nil {
			t.Fatalf("ack: %v", err)
		}
		out = append(out, m)
	}
	return out
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
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
		out = binary.BigEndian.AppendUint16(out, magicBrokerEntry)
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
	out = binary.BigEndian.AppendUint16(out, magicChecksum)
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
