package wirerec

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

func subscribeFrame(t testing.TB, id uint64) []byte {
	return encodeFrame(t, &pb.BaseCommand{Type: pb.BaseCommand_SUBSCRIBE.Enum(), Subscribe: &pb.CommandSubscribe{
		Topic: proto.String("persistent://public/default/raw"), Subscription: proto.String("sub"),
		SubType: pb.CommandSubscribe_Failover.Enum(), ConsumerId: proto.Uint64(id), RequestId: proto.Uint64(1),
		ConsumerName: proto.String("raw-consumer"),
	}}, nil)
}

func flowFrame(t testing.TB, id uint64, permits uint32) []byte {
	return encodeFrame(t, &pb.BaseCommand{Type: pb.BaseCommand_FLOW.Enum(), Flow: &pb.CommandFlow{
		ConsumerId: proto.Uint64(id), MessagePermits: proto.Uint32(permits),
	}}, nil)
}

func messageFrame(t testing.TB, id uint64, entry uint64, payload []byte) []byte {
	return encodeFrame(t, &pb.BaseCommand{Type: pb.BaseCommand_MESSAGE.Enum(), Message: &pb.CommandMessage{
		ConsumerId: proto.Uint64(id), MessageId: &pb.MessageIdData{LedgerId: proto.Uint64(7), EntryId: proto.Uint64(entry)},
	}}, payload)
}

// Frames arriving a few bytes at a time, and frames far larger than a read
// buffer, come out byte for byte and are decoded.
func TestFramesSplitAcrossReadsPassUnchanged(t *testing.T) {
	f := startFakeBroker(t)
	p := StartT(t, f.ln.Addr().String())
	client := dial(t, p.Addr())

	send := encodeFrame(t, &pb.BaseCommand{Type: pb.BaseCommand_SEND.Enum(), Send: &pb.CommandSend{
		ProducerId: proto.Uint64(1), SequenceId: proto.Uint64(1),
	}}, entryPayload(t, -1, 1, bytes.Repeat([]byte{0xab}, 3<<20)))
	upstream := slices3(connectFrame(t), subscribeFrame(t, 4), flowFrame(t, 4, 500), send)
	go writeInPieces(t, client, upstream, 1000)
	broker := f.accept(t)
	if got := readExactly(t, broker, len(upstream)); !bytes.Equal(got, upstream) {
		t.Fatal("the broker received different bytes than the client sent")
	}

	downstream := slices3(
		messageFrame(t, 4, 0, entryPayload(t, 41, 5, []byte("batch of five"))),
		messageFrame(t, 4, 1, entryPayload(t, -1, 3, []byte("no entry metadata"))),
		messageFrame(t, 4, 2, entryPayload(t, 50, 1, bytes.Repeat([]byte{1}, 1<<20))),
	)
	go writeInPieces(t, broker, downstream, 7)
	if got := readExactly(t, client, len(downstream)); !bytes.Equal(got, downstream) {
		t.Fatal("the client received different bytes than the broker sent")
	}

	if got := p.Permits(Filter{ConsumerName: "raw-consumer"}); got != 500 {
		t.Fatalf("permits %d, want 500", got)
	}
	msgs := p.Messages(Filter{Subscription: "sub"})
	if len(msgs) != 3 {
		t.Fatalf("recorded %+v", msgs)
	}
	want := []struct {
		messages int
		index    int64
	}{{5, 41}, {3, -1}, {1, 50}}
	for i, w := range want {
		e := msgs[i]
		gotIndex := int64(-1)
		if e.EntryIndex != nil {
			gotIndex = int64(*e.EntryIndex)
		}
		if e.Messages != w.messages || gotIndex != w.index || e.MessageID.Entry != uint64(i) || e.Err != "" {
			t.Fatalf("entry %d recorded as %+v, want %d messages, index %d", i, e, w.messages, w.index)
		}
	}
	if sends := p.Events(Filter{}, pb.BaseCommand_SEND); len(sends) != 1 || sends[0].Size != len(send) {
		t.Fatalf("SEND recorded as %+v", sends)
	}
}

func slices3(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// readFrame assembles a frame delivered one byte per read.
func TestReadFrameOneByteAtATime(t *testing.T) {
	frame := messageFrame(t, 1, 2, entryPayload(t, 9, 2, bytes.Repeat([]byte("x"), 100<<10)))
	r := bufio.NewReaderSize(iotest.OneByteReader(bytes.NewReader(slices3(frame, frame))), 16)
	var buf []byte
	for i := range 2 {
		got, err := readFrame(r, buf)
		if err != nil || !bytes.Equal(got, frame) {
			t.Fatalf("frame %d: %d bytes, err %v", i, len(got), err)
		}
		buf = got
	}
	if _, err := readFrame(r, buf); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last frame: %v", err)
	}
}

// A broker that dies in the middle of a frame: the client gets the bytes
// that were sent and then the end of the stream, the proxy ends the pair and
// says what happened.
func TestBrokerClosesMidFrame(t *testing.T) {
	f := startFakeBroker(t)
	p := startUnchecked(t, f.ln.Addr().String())
	client := dial(t, p.Addr())
	writeAll(t, client, connectFrame(t))
	broker := f.accept(t)
	readExactly(t, broker, len(connectFrame(t)))

	frame := messageFrame(t, 1, 0, entryPayload(t, 3, 1, []byte("cut short")))
	half := frame[:len(frame)/2]
	writeAll(t, broker, half)
	_ = broker.Close()

	if got := readExactly(t, client, len(half)); !bytes.Equal(got, half) {
		t.Fatal("partial frame altered")
	}
	expectEOF(t, client)
	conn := waitClosed(t, p)
	if conn.ClosedFrom != FromBroker {
		t.Fatalf("connection %+v", conn)
	}
	if err := p.Check(); err == nil || !strings.Contains(err.Error(), "ended inside a frame") {
		t.Fatalf("Check() = %v", err)
	}
}

// A client that goes away in the middle of a frame: same, the other way.
func TestClientClosesMidFrame(t *testing.T) {
	f := startFakeBroker(t)
	p := startUnchecked(t, f.ln.Addr().String())
	client := dial(t, p.Addr())
	sent := slices3(connectFrame(t), flowFrame(t, 1, 10)[:5])
	writeAll(t, client, sent)
	_ = client.Close()

	broker := f.accept(t)
	if got := readExactly(t, broker, len(sent)); !bytes.Equal(got, sent) {
		t.Fatal("partial frame altered")
	}
	expectEOF(t, broker)
	if conn := waitClosed(t, p); conn.ClosedFrom != FromClient {
		t.Fatalf("connection %+v", conn)
	}
}

// A stream that is not Pulsar framing is still forwarded, undecoded, and
// reported; a frame whose command does not decode is forwarded and reported.
func TestGarbageIsForwardedAndReported(t *testing.T) {
	f := startFakeBroker(t)
	p := startUnchecked(t, f.ln.Addr().String())
	client := dial(t, p.Addr())

	badCommand := []byte{0, 0, 0, 7, 0, 0, 0, 3, 0xff, 0xff, 0xff}
	garbage := slices3([]byte{0xff, 0xff, 0xff, 0xff}, bytes.Repeat([]byte("not a frame"), 1000))
	sent := slices3(connectFrame(t), badCommand, garbage)
	go writeInPieces(t, client, sent, 333)
	broker := f.accept(t)
	if got := readExactly(t, broker, len(sent)); !bytes.Equal(got, sent) {
		t.Fatal("garbage altered")
	}
	err := p.Check()
	if err == nil || !strings.Contains(err.Error(), "undecodable frame of 11 bytes") || !strings.Contains(err.Error(), "frame size out of range") {
		t.Fatalf("Check() = %v", err)
	}
}

// A CONNECT naming a broker no lookup named is refused: the proxy does not
// dial hosts of the client's choosing.
func TestUnknownProxyTargetRefused(t *testing.T) {
	f := startFakeBroker(t)
	p := startUnchecked(t, f.ln.Addr().String())
	client := dial(t, p.Addr())
	writeAll(t, client, proxiedConnectFrame(t, "10.255.255.1:6650"))
	expectEOF(t, client)
	conn := waitClosed(t, p)
	if conn.Broker != "" || conn.ProxiedTo != "10.255.255.1:6650" {
		t.Fatalf("connection %+v", conn)
	}
	if err := p.Check(); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("Check() = %v", err)
	}
}

func proxiedConnectFrame(t testing.TB, broker string) []byte {
	connect := &pb.CommandConnect{ClientVersion: proto.String("raw"), ProtocolVersion: proto.Int32(20), ProxyToBrokerUrl: proto.String(broker)}
	return encodeFrame(t, &pb.BaseCommand{Type: pb.BaseCommand_CONNECT.Enum(), Connect: connect}, nil)
}

// With RewriteLookups, a lookup answer naming another broker changes only in
// proxy_through_service_url, and the client's CONNECT naming that broker is
// routed to it: several brokers behind one recorder.
func TestLookupRewriteRoutesToTheNamedBroker(t *testing.T) {
	first, second := startFakeBroker(t), startFakeBroker(t)
	p := StartT(t, first.ln.Addr().String(), Options{RewriteLookups: true})
	client := dial(t, p.Addr())
	writeAll(t, client, connectFrame(t))
	broker := first.accept(t)
	readExactly(t, broker, len(connectFrame(t)))

	answer := &pb.BaseCommand{Type: pb.BaseCommand_LOOKUP_RESPONSE.Enum(), LookupTopicResponse: &pb.CommandLookupTopicResponse{
		BrokerServiceUrl: proto.String("pulsar://" + second.ln.Addr().String()), Response: pb.CommandLookupTopicResponse_Redirect.Enum(),
		RequestId: proto.Uint64(9), Authoritative: proto.Bool(true), ProxyThroughServiceUrl: proto.Bool(false),
	}}
	writeAll(t, broker, encodeFrame(t, answer, nil))
	got := readOneFrame(t, client)
	answer.LookupTopicResponse.ProxyThroughServiceUrl = proto.Bool(true)
	if !proto.Equal(got, answer) {
		t.Fatalf("rewritten answer %v, want %v", got, answer)
	}

	other := dial(t, p.Addr())
	connect := proxiedConnectFrame(t, second.ln.Addr().String())
	writeAll(t, other, connect)
	if got := readExactly(t, second.accept(t), len(connect)); !bytes.Equal(got, connect) {
		t.Fatal("CONNECT altered")
	}
	if rewritten := p.Events(Filter{}, pb.BaseCommand_LOOKUP_RESPONSE); len(rewritten) != 1 || !rewritten[0].Rewritten {
		t.Fatalf("lookup answers %+v", rewritten)
	}
}

func readOneFrame(t testing.TB, nc net.Conn) *pb.BaseCommand {
	t.Helper()
	size := binary.BigEndian.Uint32(readExactly(t, nc, 4))
	rest := readExactly(t, nc, int(size))
	cmdSize := binary.BigEndian.Uint32(rest)
	var cmd pb.BaseCommand
	if err := proto.Unmarshal(rest[4:4+cmdSize], &cmd); err != nil {
		t.Fatal(err)
	}
	return &cmd
}

// Close ends every connection, including one that never sent CONNECT, and
// leaves no goroutine behind.
func TestCloseLeavesNothingRunning(t *testing.T) {
	f := startFakeBroker(t)
	base := runtime.NumGoroutine()
	p, err := Start(f.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	silent := dial(t, p.Addr())
	active := dial(t, p.Addr())
	writeAll(t, active, connectFrame(t))
	f.accept(t)
	testkit.Eventually(t, waitFor, "both connections accepted", func() bool { return len(p.Connections()) == 2 })

	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	select {
	case <-closed:
	case <-time.After(waitFor):
		t.Fatal("Close did not return")
	}
	expectEOF(t, silent)
	expectEOF(t, active)
	testkit.Eventually(t, waitFor, "proxy goroutines gone", func() bool { return runtime.NumGoroutine() <= base })
	for _, c := range p.Connections() {
		if c.Closed.IsZero() {
			t.Fatalf("connection still open after Close: %+v", c)
		}
	}
}

func writeAll(t testing.TB, nc net.Conn, data []byte) {
	t.Helper()
	if _, err := nc.Write(data); err != nil {
		t.Fatalf("write: %v", err)
	}
}

func expectEOF(t testing.TB, nc net.Conn) {
	t.Helper()
	_ = nc.SetReadDeadline(time.Now().Add(waitFor))
	var one [1]byte
	if n, err := nc.Read(one[:]); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read %d bytes, err %v: want the end of the stream", n, err)
	}
}

// waitClosed waits until the proxy has ended the only connection, both
// pumps included, and returns its record.
func waitClosed(t testing.TB, p *Proxy) Connection {
	t.Helper()
	testkit.Eventually(t, waitFor, "connection ended", func() bool {
		conns := p.Connections()
		return len(conns) == 1 && !conns[0].Closed.IsZero()
	})
	return p.Connections()[0]
}

// A broker that is gone: the client's connection is closed at once, and the
// recorder says why.
func TestUnreachableBrokerClosesTheClient(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := ln.Addr().String()
	_ = ln.Close()
	p, err := Start("pulsar://" + gone)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	client := dial(t, p.Addr())
	writeAll(t, client, connectFrame(t))
	expectEOF(t, client)
	waitClosed(t, p)
	if err := p.Check(); err == nil || !strings.Contains(err.Error(), "dial broker "+gone) {
		t.Fatalf("Check() = %v", err)
	}
}

func TestStartRejectsBadUpstreams(t *testing.T) {
	for _, upstream := range []string{"", "no-port", "pulsar+ssl://broker:6651", "http://broker:8080", "pulsar://%zz"} {
		if p, err := Start(upstream); err == nil {
			_ = p.Close()
			t.Errorf("Start(%q) accepted", upstream)
		}
	}
}

// A full record stops growing and says so; traffic still flows.
func TestFullRecordIsReported(t *testing.T) {
	f := startFakeBroker(t)
	p := startUnchecked(t, f.ln.Addr().String(), Options{MaxEvents: 2})
	client := dial(t, p.Addr())
	sent := slices3(connectFrame(t), flowFrame(t, 1, 1), flowFrame(t, 1, 2), flowFrame(t, 1, 3))
	writeAll(t, client, sent)
	if got := readExactly(t, f.accept(t), len(sent)); !bytes.Equal(got, sent) {
		t.Fatal("frames altered")
	}
	if n := len(p.Events(Filter{})); n != 2 {
		t.Fatalf("kept %d events, want 2", n)
	}
	if err := p.Check(); err == nil || !strings.Contains(err.Error(), "2 events not kept") {
		t.Fatalf("Check() = %v", err)
	}
}

// A command for a subscription that a CLOSE_CONSUMER already ended is
// recorded, and marked: a broker ignores it.
func TestCommandAfterCloseIsMarked(t *testing.T) {
	f := startFakeBroker(t)
	p := StartT(t, f.ln.Addr().String())
	client := dial(t, p.Addr())
	sent := slices3(connectFrame(t), subscribeFrame(t, 3), flowFrame(t, 3, 10))
	writeAll(t, client, sent)
	broker := f.accept(t)
	readExactly(t, broker, len(sent))
	closeFrame := encodeFrame(t, &pb.BaseCommand{Type: pb.BaseCommand_CLOSE_CONSUMER.Enum(), CloseConsumer: &pb.CommandCloseConsumer{
		ConsumerId: proto.Uint64(3), RequestId: proto.Uint64(1<<64 - 1),
	}}, nil)
	writeAll(t, broker, closeFrame)
	readExactly(t, client, len(closeFrame))
	late := flowFrame(t, 3, 5)
	writeAll(t, client, late)
	readExactly(t, broker, len(late))

	flows := p.Flows(Filter{ConsumerName: "raw-consumer"})
	if len(flows) != 2 || flows[0].AfterClose || !flows[1].AfterClose || flows[1].Permits != 5 {
		t.Fatalf("flows %+v", flows)
	}
	closes := p.Events(Filter{ConsumerName: "raw-consumer"}, pb.BaseCommand_CLOSE_CONSUMER)
	if len(closes) != 1 || closes[0].Dir != FromBroker || closes[0].AfterClose {
		t.Fatalf("closes %+v", closes)
	}
	writeAll(t, client, subscribeFrame(t, 3))
	writeAll(t, client, flowFrame(t, 3, 7))
	readExactly(t, broker, len(subscribeFrame(t, 3))+len(late))
	if flows := p.Flows(Filter{ConsumerName: "raw-consumer"}); len(flows) != 3 || flows[2].AfterClose || flows[2].Consumer.Session == flows[0].Consumer.Session {
		t.Fatalf("after a new SUBSCRIBE: %+v", flows)
	}
}
