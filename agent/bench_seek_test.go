package agent

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/internal/pulsartest"
)

// seekBatch is the number of messages per entry in the seek benchmarks (indexes run over
// entries*seekBatch messages).
const seekBatch = 4

// benchmarkWholeSeek times SeekByIndex end to end against pulsartest holding `entries` batch
// entries with broker-entry indexes: index resolution through the admin API, the consumer's
// close, the cursor reset, the new subscribe and the first message at the target reaching the
// application through Receive. Each iteration seeks to another index, spread over the topic.
func benchmarkWholeSeek(b *testing.B, entries int64, lookup bool) {
	broker := pulsartest.Start(b, pulsartest.Options{DisableIndexLookup: !lookup})
	topic := uniqueTopic(b)
	client := newClient(b, broker.ServiceURL())
	a := newTestAgent(b, Options{Name: "bench", AdminURL: broker.AdminURL()})
	c, err := a.Subscribe(client, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub"})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	filled := time.Now()
	if err := broker.AppendEntries(topic, int(entries), seekBatch); err != nil {
		b.Fatal(err)
	}
	b.Logf("%d entries of %d messages stored in %s", entries, seekBatch, time.Since(filled).Round(time.Millisecond))
	ctx := context.Background()
	probes := 0
	b.ResetTimer()
	start := time.Now()
	for i := 0; b.Loop(); i++ {
		x := (int64(i)*7_919_993 + 12_345) % (entries * seekBatch)
		res, err := c.SeekByIndex(ctx, x)
		if err != nil {
			b.Fatal(err)
		}
		probes += res.Probes
		m, err := c.Receive(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if m.Index() == nil || int64(*m.Index()) != x {
			b.Fatalf("seek to %d: the application got index %v first", x, m.Index())
		}
	}
	took := time.Since(start)
	b.ReportMetric(float64(took.Microseconds())/1000/float64(b.N), "ms/seek")
	b.ReportMetric(float64(probes)/float64(b.N), "probes/op")
	b.ReportMetric(2*math.Log2(float64(entries))+8, "probeBound")
}
