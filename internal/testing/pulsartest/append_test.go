package pulsartest

import (
	"context"
	"runtime"
	"strconv"
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// Appended entries are stored like produced ones: a consumer gets every message of every batch
// with its broker-entry index, and the admin API finds them by index across ledgers.
func TestAppendEntriesAreConsumedLikeProducedOnes(t *testing.T) {
	b := Start(t, Options{EntriesPerLedger: 10})
	c := newClient(t, b)
	cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: "filled", SubscriptionName: "sub",
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
	if err := b.AppendEntries("filled", 25, 4); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	for i := range 100 {
		m, err := cons.Receive(ctx)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if m.Index() == nil || *m.Index() != uint64(i) || string(m.Payload()) != strconv.Itoa(i%4) {
			t.Fatalf("message %d: index %v payload %q", i, m.Index(), m.Payload())
		}
		cons.Ack(m)
	}
	var id messageIDJSON
	testkit.GetJSON(t, b.AdminURL()+topicPath("filled")+"/getMessageIdByIndex?index=61", &id)
	var st internalStatsJSON
	testkit.GetJSON(t, b.AdminURL()+topicPath("filled")+"/internalStats", &st)
	if len(st.Ledgers) != 3 || id.LedgerID != int64(st.Ledgers[1].LedgerID) || id.EntryID != 5 {
		t.Fatalf("index 61 at %+v; ledgers %+v", id, st.Ledgers)
	}
	if err := b.AppendEntries("filled", 1, 0); err == nil {
		t.Fatal("an entry of 0 messages was accepted")
	}
}

// The footprint AppendEntries documents: about 200 bytes per entry.
func TestAppendEntriesFootprint(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates 10^6 entries")
	}
	b := Start(t)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if err := b.AppendEntries("big", 1_000_000, 1); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	perEntry := float64(after.HeapAlloc-before.HeapAlloc) / 1e6
	t.Logf("%.0f bytes per entry", perEntry)
	if perEntry > 250 {
		t.Fatalf("%.0f bytes per entry, documented as about 200", perEntry)
	}
	runtime.KeepAlive(b)
}
