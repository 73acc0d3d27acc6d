package agent

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/protocol"
	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
)

const entriesPerLedger = 7 // small, so that every topic here spans several ledgers

// consumedTopic is a topic with n messages (payload = index) already consumed and acked.
func consumedTopic(t *testing.T, e *env, n, batch int, opts pulsar.ConsumerOptions) (*Consumer, string) {
	t.Helper()
	topic := uniqueTopic(t)
	opts.Topic, opts.SubscriptionName = topic, "sub"
	c := e.subscribe(t, opts)
	e.produce(t, topic, 0, n, batch)
	testkit.ReceiveAndAck(t, c, n, receiveLimit)
	poll.Eventually(t, "acks", func() bool { return e.backlog(t, topic, "sub") == 0 })
	return c, topic
}

func probeBound(entries int) int { return int(2*math.Log2(float64(entries))) + 8 }

func TestIntegrationSeekByIndex(t *testing.T) {
	cases := []struct {
		name      string
		broker    pulsartest.Options
		batch     int
		index     int64
		wantFirst int
	}{
		{name: "inside the range", index: 40, wantFirst: 40},
		{name: "first message", index: 0, wantFirst: 0},
		{name: "last message", index: 99, wantFirst: 99},
		{name: "inside a batch", batch: 10, index: 23, wantFirst: 23},
		{name: "first of a batch", batch: 10, index: 30, wantFirst: 30},
		{name: "last of a batch", batch: 10, index: 39, wantFirst: 39},
		{name: "without PIP-415 (binary search)", broker: pulsartest.Options{DisableIndexLookup: true}, index: 57, wantFirst: 57},
		{name: "batch without PIP-415", broker: pulsartest.Options{DisableIndexLookup: true}, batch: 10, index: 77, wantFirst: 77},
		{name: "at the end is latest", index: 100, wantFirst: 100},
		{name: "above the range is latest", batch: 10, index: 1 << 40, wantFirst: 100},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.broker.EntriesPerLedger = entriesPerLedger
			e := newEnv(t, tc.broker)
			c, topic := consumedTopic(t, e, 100, tc.batch, pulsar.ConsumerOptions{})
			res, err := c.SeekByIndex(context.Background(), tc.index)
			if err != nil {
				t.Fatal(err)
			}
			entries := 100 / max(tc.batch, 1)
			if res.Probes > probeBound(entries) || res.Probes < 3 {
				t.Fatalf("%d probes for %d entries, bound %d", res.Probes, entries, probeBound(entries))
			}
			if p := res.Positions; len(p) != 1 || p[0].Index != int64(tc.wantFirst) || p[0].Partition != -1 || p[0].MessageID == "" {
				t.Fatalf("positions %+v", p)
			}
			if tc.wantFirst == 100 {
				e.produce(t, topic, 100, 1, 1)
			}
			m := testkit.ReceiveAndAck(t, c, 1, receiveLimit)[0]
			if got := seqOfMessage(t, m); got != tc.wantFirst || m.Index() == nil || *m.Index() != uint64(tc.wantFirst) {
				t.Fatalf("first message after seek: payload %d, index %v; want %d", got, m.Index(), tc.wantFirst)
			}
		})
	}
}

// A seek while paused drops the held messages (never acked), keeps the consumer paused, and
// the target comes first after resume.
func TestIntegrationSeekWhilePaused(t *testing.T) {
	e := newEnv(t, pulsartest.Options{EntriesPerLedger: entriesPerLedger})
	c, topic := consumedTopic(t, e, 30, 1, pulsar.ConsumerOptions{})
	ch := c.Chan()
	e.produce(t, topic, 30, 20, 1)
	poll.Eventually(t, "a message in the pump's hand", func() bool { return e.delivered(topic, "sub", 0) >= 31 })
	c.Pause()
	if _, err := c.SeekByIndex(context.Background(), 12); err != nil {
		t.Fatal(err)
	}
	if st := c.Status(); st.State != protocol.Paused || st.HeldMessages != 0 {
		t.Fatalf("status after seek while paused: %+v", st)
	}
	select {
	case cm := <-ch:
		t.Fatalf("message %s delivered while paused", cm.Payload())
	default:
	}
	c.Resume()
	select {
	case cm := <-ch:
		if got := seqOfMessage(t, cm.Message); got != 12 {
			t.Fatalf("first message after seek and resume: %d, want 12", got)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("nothing after resume")
	}
}

func TestIntegrationSeekStoppedConsumer(t *testing.T) {
	e := newEnv(t, pulsartest.Options{EntriesPerLedger: entriesPerLedger})
	c, _ := consumedTopic(t, e, 40, 4, pulsar.ConsumerOptions{})
	c.Stop()
	if _, err := c.SeekByIndex(context.Background(), 22); err != nil {
		t.Fatal(err)
	}
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	if got := seqOfMessage(t, testkit.ReceiveAndAck(t, c, 1, receiveLimit)[0]); got != 22 {
		t.Fatalf("first message after seek and run: %d, want 22", got)
	}
}

func TestIntegrationSeekPartitionedTopic(t *testing.T) {
	e := newEnv(t, pulsartest.Options{EntriesPerLedger: entriesPerLedger})
	topic := uniqueTopic(t)
	e.createPartitioned(t, topic, 2)
	c := e.subscribe(t, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub"})
	// Partition p holds payloads 1000p + index, in batches of 5.
	for p := range 2 {
		e.produce(t, fmt.Sprintf("%s-partition-%d", topic, p), 1000*p, 30, 5)
	}
	testkit.ReceiveAndAck(t, c, 60, receiveLimit)
	poll.Eventually(t, "acks", func() bool {
		st, ok := e.stats(t, topic, "sub", true)
		return ok && st.MsgBacklog == 0
	})

	res, err := c.SeekPartitionsByIndex(context.Background(), []protocol.PartitionIndex{{Partition: 0, Index: 12}, {Partition: 1, Index: 25}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Positions) != 2 || res.Positions[0].Index != 12 || res.Positions[1].Index != 25 {
		t.Fatalf("positions %+v", res.Positions)
	}
	if res.Probes > 2*probeBound(6) {
		t.Fatalf("%d probes for two partitions of 6 entries", res.Probes)
	}
	var got []int
	for _, m := range testkit.ReceiveAndAck(t, c, 18+5, receiveLimit) {
		got = append(got, seqOfMessage(t, m))
	}
	slices.Sort(got)
	want := append(seqRange(12, 30), seqRange(1025, 1030)...)
	if !slices.Equal(got, want) {
		t.Fatalf("after seek got %v, want %v", got, want)
	}
	if _, err := c.SeekByIndex(context.Background(), 3); err == nil {
		t.Fatal("a single index was accepted for a partitioned topic")
	}
}

func seqRange(from, to int) []int {
	var out []int
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

// Without index metadata the seek fails with the typed error and no cursor moves.
func TestIntegrationSeekWithoutIndexMetadata(t *testing.T) {
	for _, broker := range []pulsartest.Options{
		{DisableIndexMetadata: true},
		{DisableIndexMetadata: true, DisableIndexLookup: true},
	} {
		t.Run(fmt.Sprintf("lookup=%v", !broker.DisableIndexLookup), func(t *testing.T) {
			e := newEnv(t, broker)
			c, topic := consumedTopic(t, e, 10, 1, pulsar.ConsumerOptions{})
			e.produce(t, topic, 10, 10, 1)
			b := e.pulsartest(t, "a broker without index metadata")
			before := b.Subscription(topic, "sub").Cursors
			_, err := c.SeekByIndex(context.Background(), 3)
			if !errors.Is(err, ErrIndexMetadataDisabled) {
				t.Fatalf("err = %v, want ErrIndexMetadataDisabled", err)
			}
			if after := b.Subscription(topic, "sub").Cursors; !slices.Equal(before, after) {
				t.Fatalf("cursor moved: %+v -> %+v", before, after)
			}
			if got := seqOfMessage(t, testkit.ReceiveAndAck(t, c, 1, receiveLimit)[0]); got != 10 {
				t.Fatalf("next message %d, want 10", got)
			}
		})
	}
}

func TestIntegrationSeekRefusesMultiTopic(t *testing.T) {
	e := newEnv(t)
	c := e.subscribe(t, pulsar.ConsumerOptions{Topics: []string{uniqueTopic(t) + "-a", uniqueTopic(t) + "-b"}, SubscriptionName: "sub"})
	if _, err := c.SeekByIndex(context.Background(), 1); !errors.Is(err, ErrSeekUnsupported) {
		t.Fatalf("err = %v, want ErrSeekUnsupported", err)
	}
}

// Seek to latest moves the cursor past the last entry: nothing already consumed is pending
// again, so no Shared sibling gets the last entry a second time.
func TestIntegrationSeekLatestRedeliversNothingToSiblings(t *testing.T) {
	for _, batch := range []int{1, 5} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			e := newEnv(t, pulsartest.Options{EntriesPerLedger: entriesPerLedger})
			opts := pulsar.ConsumerOptions{Type: pulsar.Shared}
			c, topic := consumedTopic(t, e, 20, batch, opts)
			opts.Topic, opts.SubscriptionName = topic, "sub"
			sibling := e.subscribeRaw(t, opts)
			sibCol := collect(t, sibling)
			col := collect(t, c)
			dispatched := e.delivered(topic, "sub", 0)
			res, err := c.SeekByIndex(context.Background(), 1<<40)
			if err != nil {
				t.Fatal(err)
			}
			if p := res.Positions; len(p) != 1 || p[0].Index != 20 {
				t.Fatalf("positions %+v, want index 20 next", p)
			}
			if b, d := e.backlog(t, topic, "sub"), e.delivered(topic, "sub", 0); b != 0 || d != dispatched {
				t.Fatalf("after seek to latest: backlog %d (want 0), %d dispatched again", b, d-dispatched)
			}
			e.produce(t, topic, 20, 1, 1)
			poll.Eventually(t, "the new message", func() bool { return col.count()+sibCol.count() == 1 })
			if got := append(col.seqsCopy(), sibCol.seqsCopy()...); !slices.Equal(got, []int{20}) {
				t.Fatalf("after seek to latest the consumers got %v, want only [20]", got)
			}
			if d := e.delivered(topic, "sub", 0) - dispatched; d != 1 {
				t.Fatalf("%d messages dispatched after the seek, want 1", d)
			}
		})
	}
}

// A standby Failover consumer executes a seek. No client keeps a pending seek: when it later
// becomes active and the cursor is reset back to the start by someone else, it receives every
// message (a client that sought keeps discarding, and acking, everything up to its seek id).
func TestIntegrationSeekByFailoverStandbyLeavesNoPendingSeek(t *testing.T) {
	e := newEnv(t, pulsartest.Options{EntriesPerLedger: entriesPerLedger})
	topic := uniqueTopic(t)
	opts := pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Type: pulsar.Failover}
	consumers := map[string]*Consumer{}
	for _, name := range []string{"one", "two"} {
		opts.Name = name
		consumers[name] = e.subscribe(t, opts)
	}
	// The broker picks the active consumer (a hash ring of the names probed with the topic
	// name); ask it through the wire.
	activeName := e.activeConsumer(t, topic, "sub", 2)
	standbyName := map[string]string{"one": "two", "two": "one"}[activeName]
	active, standby := consumers[activeName], consumers[standbyName]
	e.produce(t, topic, 0, 40, 1)
	testkit.ReceiveAndAck(t, active, 40, receiveLimit)
	poll.Eventually(t, "acks", func() bool { return e.backlog(t, topic, "sub") == 0 })

	beforeSeek := e.wire.Mark()
	e.logWireOnFailure(t, topic, beforeSeek)
	if _, err := standby.SeekByIndex(context.Background(), 20); err != nil {
		t.Fatal(err)
	}
	// The reset reconnects both consumers, and the broker may pick either as active again (on a
	// non-partitioned topic, by the order they subscribe): whichever it is gets 20..39. A
	// re-subscribe the broker refuses while the reset runs backs off (100 ms, doubling), and the
	// new active consumer waits for the failover delay: longer than poll's deadline on a loaded
	// machine (CI failed here at 10 s once).
	afterReset := testkit.Poll{Within: 3 * waitLimit, Every: time.Millisecond}
	fromActive, fromStandby := collect(t, active), collect(t, standby)
	logGatesOnFailure(t, consumers)
	replayed := func() bool { return len(fromActive.distinct())+len(fromStandby.distinct()) >= 20 }
	// Seen 1 in 3 runs under load on Pulsar 4.0.7 with pulsar-client-go v0.21: the broker sent
	// 20..39 to the consumer it made active, yet its client never pushed them into the gate's
	// channel (both gates open, channels empty, a taker waiting, no ack sent): the client's
	// handler race (testkit.ClientLog).
	e.untilPastClientRace(t, afterReset, "20..39 after the seek", replayed)
	afterReset.Eventually(t, "acks after the seek", func() bool { return e.backlog(t, topic, "sub") == 0 })
	fromActive.stop()
	fromStandby.stop()
	for _, seqs := range [][]int{fromActive.seqsCopy(), fromStandby.seqsCopy()} {
		for i, seq := range seqs {
			if seq < 20 || (i > 0 && seq < seqs[i-1]) {
				t.Fatalf("after the seek to 20 a consumer got %v: something before the target, or out of order", seqs)
			}
		}
	}
	beforeDrop := e.wire.Mark()
	e.dropConnections() // a later reconnect of every client
	active.Close()
	awaitResubscribed(t, e, standbyName, beforeDrop)
	first := resetToStart(t, e, topic)
	// The standby becomes active after the broker's failover delay. The reset closed it, and a
	// CI run on Pulsar 4.0.7 saw the client's handler race here too (0 of 40 within 15 s, while
	// the wire showed the broker send all 40); on Pulsar 4.2.4 the variant no reconnect reaches
	// (untilPastClientRace), twice in two runs.
	replay := collect(t, standby)
	e.untilPastClientRace(t, afterReset, "0..39 after the reset to the start", func() bool { return len(replay.distinct()) >= 40 }, standby)
	replay.stop()
	if seqs := replay.seqsCopy(); seqs[0] != 0 {
		t.Fatalf("after the reset to %+v the former standby got %v, want 0 first", first, seqs)
	}
}

// awaitResubscribed waits until the named consumer of subscription "sub" subscribed again
// after the mark and sent its first FLOW. pulsar-client-go v0.19 registers a consumer for the
// broker's notifications only after its SUBSCRIBE succeeded (partitionConsumer.grabConn), so
// a CLOSE_CONSUMER that follows the success within that window is dropped and the consumer
// waits forever; the first FLOW is sent after the registration. A reset racing a re-subscribe
// is the client's bug, not what the test is about. Fixed in v0.20 (apache/pulsar-client-go#1476);
// kept while CI runs the suite on v0.19 (hack/client-versions.sh), where the race is real.
func awaitResubscribed(t *testing.T, e *env, name string, since wirerec.Mark) {
	t.Helper()
	poll.Eventually(t, name+" subscribed again", func() bool {
		sessions := e.wire.Consumers(wirerec.Filter{Subscription: "sub", ConsumerName: name, Since: since})
		if len(sessions) == 0 {
			return false
		}
		last := sessions[len(sessions)-1]
		return len(e.wire.Flows(wirerec.Filter{Consumer: &last.ConsumerKey, Since: last.Session})) > 0
	})
}

// resetToStart resets subscription "sub" to the topic's first entry through the admin API, as
// an operator or another agent would, and returns that entry.
func resetToStart(t *testing.T, e *env, topic string) position {
	t.Helper()
	path, err := topicPath(topic)
	if err != nil {
		t.Fatal(err)
	}
	var stats struct {
		Ledgers []struct {
			LedgerID int64 `json:"ledgerId"`
		} `json:"ledgers"`
	}
	e.adminJSON(t, http.MethodGet, path+"/internalStats", "", &stats)
	if len(stats.Ledgers) == 0 {
		t.Fatalf("ledgers of %s: none", topic)
	}
	first := position{ledger: stats.Ledgers[0].LedgerID}
	// The broker reads "excluded" (ResetCursorData), not "isExcluded".
	body := fmt.Sprintf(`{"ledgerId":%d,"entryId":0,"partitionIndex":-1,"excluded":false}`, first.ledger)
	e.adminJSON(t, http.MethodPost, path+"/subscription/sub/resetcursor", body, nil)
	return first
}
