package sidecar

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sync/semaphore"
	"google.golang.org/protobuf/proto"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// Clients that announce frames of the largest size and send one byte of them cost what they
// sent, not what they announced; a connection beyond MaxConnections is closed before it gets
// an answer.
func TestAnnouncedFramesCostWhatArrives(t *testing.T) {
	const clients = 250
	w := newWorld(t, Options{MaxConnections: clients, FrameTimeout: waitFor})
	conns := make([]*rawClient, clients)
	for i := range conns {
		conns[i] = dialRaw(t, w.url, true)
	}
	before := heapInUse()
	// The PING's answer shows that the sidecar has read up to the frame after it.
	for _, c := range conns {
		c.send(append(binary.BigEndian.AppendUint32(pingFrame, DefaultMaxFrameSize), 0))
	}
	for _, c := range conns {
		c.await(pb.BaseCommand_PONG)
	}
	grown := int64(heapInUse()) - int64(before)
	t.Logf("%d clients announcing %d bytes each: the heap grew by %d bytes", clients, DefaultMaxFrameSize, grown)
	if grown > 64<<20 {
		t.Errorf("%d clients announcing %d bytes each grew the heap by %d MiB", clients, DefaultMaxFrameSize, grown>>20)
	}

	extra, err := net.Dial("tcp", w.url[len("pulsar://"):])
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	_, _ = extra.Write(connectFrame()) // may find the connection closed already
	_ = extra.SetReadDeadline(time.Now().Add(waitFor))
	n, err := io.Copy(io.Discard, extra)
	if n > 0 || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("connection %d of at most %d: %d bytes answered, then %v; want it closed unanswered", clients+1, clients, n, err)
	}
}

// heapInUse is the heap in use after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// A client that begins a frame and does not complete it within FrameTimeout has its
// connection closed; one that stays idle between frames longer than that keeps it.
func TestBegunFrameMustComplete(t *testing.T) {
	w := newWorld(t, Options{FrameTimeout: 500 * time.Millisecond})
	idle := dialRaw(t, w.url, true)
	stalled := dialRaw(t, w.url, true)
	stalled.send(append(binary.BigEndian.AppendUint32(nil, 1024), 0))
	expectClosed(t, stalled.nc)
	idle.send(pingFrame)
	idle.await(pb.BaseCommand_PONG)
}

// Client frames being read share FrameMemory: one that does not fit beside those in
// progress waits for them, and no longer than its deadline.
func TestFramesInProgressShareTheMemory(t *testing.T) {
	const payload = 1 << 20
	cmd, err := proto.Marshal(&pb.BaseCommand{Type: pb.BaseCommand_SEND.Enum(),
		Send: &pb.CommandSend{ProducerId: proto.Uint64(1), SequenceId: proto.Uint64(1)}})
	if err != nil {
		t.Fatal(err)
	}
	raw := binary.BigEndian.AppendUint32(nil, uint32(4+len(cmd)+payload))
	raw = append(append(binary.BigEndian.AppendUint32(raw, uint32(len(cmd))), cmd...), make([]byte, payload)...)
	budget := semaphore.NewWeighted(int64(len(raw)) + 100) // one frame
	reader := func(r io.Reader) frameReader {
		return frameReader{r: bufio.NewReaderSize(r, bufferSize), max: 2 * payload, budget: budget, life: context.Background()}
	}

	// The first frame arrives in parts: once its second part has been taken, it holds its size.
	pr, pw := io.Pipe()
	type result struct {
		f       frame
		release func()
		err     error
	}
	first := make(chan result, 1)
	go func() {
		f, release, err := reader(pr).read(time.Time{})
		first <- result{f, release, err}
	}()
	write := func(b []byte) {
		if _, err := pw.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	write(raw[:100])
	write(raw[100:200])

	second := reader(bytes.NewReader(raw))
	if _, _, err := second.read(time.Now().Add(100 * time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a frame read beside one in progress, with no memory left for it: %v", err)
	}
	write(raw[200:])
	r := <-first
	if r.err != nil || !bytes.Equal(r.f.raw, raw) {
		t.Fatalf("the first frame: %v", r.err)
	}
	r.release()
	f, release, err := second.read(time.Now().Add(waitFor))
	if err != nil || !bytes.Equal(f.raw, raw) {
		t.Fatalf("the second frame, once the first was handled: %v", err)
	}
	release()
}
