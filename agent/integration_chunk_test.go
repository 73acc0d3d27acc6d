package agent

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
)

// Chunked messages in these tests: chunkSize bytes per chunk, chunksPerMessage chunks, so a
// message's payload is chunkSize*chunksPerMessage bytes (its sequence number, zero-padded).
const (
	chunkSize        = 200
	chunksPerMessage = 3
	chunkProducers   = 3
	// testChunkExpiry is the client's ExpireTimeOfIncompleteChunk in these tests: short, so that a
	// pause many times longer stays quick.
	testChunkExpiry = time.Second
)

// chunkPayload is message seq's payload: its number, zero-padded to the full size.
func chunkPayload(seq int) []byte {
	s := strconv.Itoa(seq)
	return []byte(strings.Repeat("0", chunkSize*chunksPerMessage-len(s)) + s)
}

// produceChunked sends messages from..from+n-1 as chunked messages, spread over
// chunkProducers producers that send at the same time, so that their chunks interleave on
// the topic (message i goes through producer i mod chunkProducers).
func (e *env) produceChunked(t testing.TB, topic string, from, n int) {
	t.Helper()
	producers := make([]pulsar.Producer, chunkProducers)
	for p := range producers {
		prod, err := e.client.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true,
			EnableChunking: true, ChunkMaxMessageSize: chunkSize, Name: fmt.Sprintf("%s-%d-p%d", sanitize(t.Name()), from, p)})
		if err != nil {
			t.Fatal(err)
		}
		defer prod.Close()
		producers[p] = prod
	}
	// All start together, so that their chunks interleave from the first message on.
	var wg sync.WaitGroup
	errs := make(chan error, chunkProducers)
	start := make(chan struct{})
	for p, prod := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs <- sendChunked(prod, from, n, p)
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func sendChunked(p pulsar.Producer, from, n, which int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var sendErr error
	for i := from; i < from+n; i++ {
		if i%chunkProducers != which {
			continue
		}
		wg.Add(1)
		p.SendAsync(ctx, &pulsar.ProducerMessage{Payload: chunkPayload(i)}, func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
			if err != nil {
				mu.Lock()
				sendErr = err
				mu.Unlock()
			}
			wg.Done()
		})
	}
	wg.Wait()
	return sendErr
}

// chunkCollector receives in the background, acking, and checks every payload whole.
type chunkCollector struct {
	*collector
	bad chan string
}

func collectChunked(t testing.TB, c pulsar.Consumer) *chunkCollector {
	col := &chunkCollector{collector: &collector{}, bad: make(chan string, 1)}
	col.stop = testkit.ReceiveInBackground(t, c, true, func(m pulsar.Message) {
		seq := seqOfMessage(t, m)
		if string(m.Payload()) != string(chunkPayload(seq)) {
			select {
			case col.bad <- fmt.Sprintf("message %d: payload of %d bytes is not the one sent", seq, len(m.Payload())):
			default:
			}
		}
		col.add(seq)
	})
	return col
}

// watchPaused watches the paused consumer for d (the pause's length in the scenario, many
// client expiries) and fails at once when the wire shows an ACK for the topic or a message
// reached the application: a paused consumer whose application acks nothing must ack nothing.
func watchPaused(t *testing.T, e *env, topic string, col *chunkCollector, before int, since wirerec.Mark, d time.Duration) {
	t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if acks := e.wire.Events(wirerec.Filter{Topic: topic, Subscription: "sub", Since: since}, pb.BaseCommand_ACK); len(acks) > 0 {
			t.Fatalf("while paused the client acknowledged %d entries the application never saw (first %+v)", len(acks), acks[0].MessageID)
		}
		if n := col.count(); n != before {
			t.Fatalf("%d messages reached the application while paused", n-before)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// chunkFlowBound is what a session may be granted while paused with chunked messages: the
// client returns one permit per non-final chunk it receives (consumer_partition.go,
// processMessageChunk), and the broker stops once the complete messages hold the queue's Q
// permits; besides those Q messages, up to chunkProducers more are partly received (the
// producers interleave), so (Q + producers) x (chunks - 1), plus the initial Q of a session
// subscribed while paused.
func chunkFlowBound(queue int, subscribedWhilePaused bool) int64 {
	b := int64(queue+chunkProducers) * (chunksPerMessage - 1)
	if subscribedWhilePaused {
		b += int64(queue)
	}
	return b
}

// grantsBySession sums the FLOW permits recorded after mark per session (SUBSCRIBE).
func grantsBySession(e *env, topic string, mark wirerec.Mark) map[wirerec.Mark]int64 {
	out := map[wirerec.Mark]int64{}
	for _, ev := range e.flows(topic, "sub", mark) {
		if ev.Consumer != nil && !ev.AfterClose {
			out[ev.Consumer.Session] += int64(ev.Permits)
		}
	}
	return out
}

// A pause many times longer than the client's incomplete-chunk expiry, with chunked messages
// from interleaved producers arriving meanwhile, loses, stalls and acknowledges nothing: after
// resume every message arrives once and whole, and the backlog drains. While paused the FLOWs
// stay within chunkFlowBound per session.
func TestIntegrationChunkedMessagesSurviveLongPause(t *testing.T) {
	for _, queue := range []int{1, 4, 0} {
		t.Run("queue="+strconv.Itoa(queue), func(t *testing.T) { chunkedLongPause(t, queue) })
	}
}

func chunkedLongPause(t *testing.T, queue int) {
	e := newEnv(t)
	topic := uniqueTopic(t)
	q := queue
	if q == 0 {
		q = 1000 // the client's default receiver queue
	}
	c := e.subscribe(t, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", ReceiverQueueSize: queue,
		ExpireTimeOfIncompleteChunk: testChunkExpiry})
	col := collectChunked(t, c)
	e.produceChunked(t, topic, 0, 6)
	poll.Eventually(t, "the first messages", func() bool { return col.count() == 6 })
	poll.Eventually(t, "acks of the first messages", func() bool { return e.backlog(t, topic, "sub") == 0 })
	c.Pause()
	atPause := e.mark()

	// Enough messages that the complete ones fill the client's queue and the broker stops in
	// the middle of others.
	total := q + 50
	e.produceChunked(t, topic, 6, total)
	watchPaused(t, e, topic, col, 6, atPause, 5*testChunkExpiry)
	e.barrier(t, c)
	grants := grantsBySession(e, topic, atPause)
	t.Logf("FLOW permits while paused by session: %v (sessions %d)", grants, e.sessionCount(topic, "sub"))
	for session, granted := range grants {
		if bound := chunkFlowBound(q, session > atPause); granted > bound {
			t.Fatalf("session %d was granted %d permits while paused, want at most %d", session, granted, bound)
		}
	}

	c.Resume()
	poll.Eventually(t, "every message after resume", func() bool { return len(col.distinct()) == 6+total })
	select {
	case bad := <-col.bad:
		t.Fatal(bad)
	default:
	}
	if n := col.count(); n != 6+total {
		t.Fatalf("%d messages delivered for %d distinct", n, 6+total)
	}
	poll.Eventually(t, "the backlog drained", func() bool { return e.backlog(t, topic, "sub") == 0 })
}
