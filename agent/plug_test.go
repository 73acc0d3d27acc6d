package agent

import (
	"slices"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// pushed returns a fresh src into which the client pushed messages seq 0..n-1 of partition p.
func pushed(n int, partition int32) chan pulsar.ConsumerMessage {
	src := newSource(false, false)
	for seq := range n {
		src <- pulsar.ConsumerMessage{Message: fakeMessage{
			id: pulsar.NewMessageID(1, int64(seq), -1, partition), seq: int64(seq),
		}}
	}
	return src
}

func drained(t *testing.T, p *plug) []int64 {
	t.Helper()
	var seqs []int64
	p.drain(func(cm pulsar.ConsumerMessage) { seqs = append(seqs, seqOf(t, cm.Message)) })
	if p.isPlugged() || p.held() != 0 || len(p.source()) != 0 {
		t.Fatalf("after drain: plugged %v, held %d, %d items left in src", p.isPlugged(), p.held(), len(p.source()))
	}
	return seqs
}

func TestPlugLeavesTheClientNoRoomAndGivesBackWhatItPushed(t *testing.T) {
	var p plug
	p.use(pushed(3, 0), false)
	p.fill()
	if !p.isPlugged() || p.held() != 3 || len(p.source()) != cap(p.source()) {
		t.Fatalf("plugged %v, held %d, src %d/%d: want plugged, 3 held, full", p.isPlugged(), p.held(), len(p.source()), cap(p.source()))
	}
	select {
	case p.source() <- pulsar.ConsumerMessage{}:
		t.Fatal("the client could push into a plugged src")
	default:
	}
	if got := drained(t, &p); !slices.Equal(got, []int64{0, 1, 2}) {
		t.Fatalf("drained %v, want 0 1 2 in order", got)
	}
}

func TestPlugDiscardsWhatASeekMadeStale(t *testing.T) {
	for _, tc := range []struct {
		name       string
		partitions partitionSet
		before     time.Duration // relative to the plug; negative: a seek before it
		counted    int
		kept       []int64
	}{
		{"every partition", nil, time.Second, 3, nil},
		{"another partition", partitionSet{1: true}, time.Second, 0, []int64{0, 1, 2}},
		{"this partition", partitionSet{0: true}, time.Second, 0, nil},
		{"a seek before the plug", nil, -time.Second, 0, []int64{0, 1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p plug
			p.use(pushed(3, 0), false)
			p.fill()
			if n := p.discardBefore(p.at.Add(tc.before), tc.partitions); n != tc.counted {
				t.Fatalf("discardBefore counted %d, want %d", n, tc.counted)
			}
			if got := drained(t, &p); !slices.Equal(got, tc.kept) {
				t.Fatalf("drained %v, want %v", got, tc.kept)
			}
		})
	}
}

func TestPlugNeverFillsAZeroQueueSource(t *testing.T) {
	var p plug
	p.use(newSource(true, false), false)
	p.fill() // would block on an unbuffered channel nobody reads, or feed the client's Receive
	if p.isPlugged() {
		t.Fatal("a zero-queue src was plugged")
	}
}

func TestFastTakeTurnedOffWakesItsLastTaker(t *testing.T) {
	var f fastTake
	if f.enter() {
		t.Fatal("a taker entered a fast take that is off")
	}
	src := make(chan pulsar.ConsumerMessage, 1)
	f.set(true, src)
	if !f.enter() || !f.busy() {
		t.Fatal("a taker could not enter a fast take that is on")
	}
	got, closing, ok := f.channels()
	if !ok || got != src {
		t.Fatalf("channels = %v, %v: want src", got, ok)
	}
	f.set(false, nil)
	select {
	case <-closing:
	default:
		t.Fatal("turning the fast take off did not close its closing channel")
	}
	if _, _, ok := f.channels(); ok {
		t.Fatal("channels still offered after the fast take was turned off")
	}
	if !f.leave() || f.busy() {
		t.Fatal("the last taker's leave did not report that a closer may be waiting")
	}
}
