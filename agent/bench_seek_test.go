package agent

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// seekBatch is the number of messages per entry in the seek benchmarks (indexes run over
// entries*seekBatch messages).
const seekBatch = 4

// BenchmarkSeekProbes measures seeks by index on topics of 10^6 and 10^7 entries, side by
// side: wholeSeek-pip415 and wholeSeek-binarySearch time the whole seek through pulsartest
// holding every entry (benchmarkWholeSeek). The index resolution alone, on computed topics, is
// agent/internal/pulsaradmin's BenchmarkSeekProbes (pip415 and binarySearch).
func BenchmarkSeekProbes(b *testing.B) {
	for _, entries := range []int64{1_000_000, 10_000_000} {
		for _, mode := range []string{"pip415", "binarySearch"} {
			b.Run(fmt.Sprintf("entries=%d/wholeSeek-%s", entries, mode), func(b *testing.B) {
				benchmarkWholeSeek(b, entries, mode == "pip415")
			})
		}
	}
}

// benchmarkWholeSeek times SeekByIndex end to end against pulsartest holding `entries` batch
// entries with broker-entry indexes: index resolution through the admin API, the consumer's
// close, the cursor reset, the new subscribe and the first message at the target reaching the
// application through Receive. Each iteration seeks to another index, spread over the topic.
func benchmarkWholeSeek(b *testing.B, entries int64, lookup bool) {
	broker := pulsartest.Start(b, pulsartest.Options{DisableIndexLookup: !lookup})
	topic := uniqueTopic(b)
	client := testkit.Client(b, pulsar.ClientOptions{URL: broker.ServiceURL()})
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
	seekAround(b, c, entries)
}

// BenchmarkWholeSeekPulsar is benchmarkWholeSeek against the real broker named by PULSAR_URL
// and PULSAR_ADMIN_URL (make bench runs one): 10^6 entries of seekBatch messages, produced by a
// batching producer, then seeks to indexes spread over the topic. Whether it takes the PIP-415
// path depends on the broker's release (4.1 and later have it).
func BenchmarkWholeSeekPulsar(b *testing.B) {
	serviceURL, adminURL, ok := remoteBroker(b)
	if !ok {
		b.Skip("needs a real broker: set PULSAR_URL and PULSAR_ADMIN_URL (make bench starts one)")
	}
	const entries int64 = 1_000_000
	caps := probeRemote(b, serviceURL, adminURL)
	topic := uniqueTopic(b)
	client := testkit.Client(b, pulsar.ClientOptions{URL: serviceURL})
	a := newTestAgent(b, Options{Name: "bench", AdminURL: adminURL})
	c, err := a.Subscribe(client, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub"})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	c.Pause() // the fill is not consumed
	filled := time.Now()
	fillBatches(b, client, topic, int(entries), seekBatch)
	b.Logf("%v; %d entries of %d messages produced in %s", caps, entries, seekBatch, time.Since(filled).Round(time.Millisecond))
	c.Resume()
	seekAround(b, c, entries)
}

// seekAround seeks c to indexes spread over entries*seekBatch messages, each until the first
// message at the target reaches the application, and reports the time and admin calls a seek took.
func seekAround(b *testing.B, c *Consumer, entries int64) {
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

// fillBatches produces entries batch entries of batch messages each (payloads "0", "1", ...).
func fillBatches(b *testing.B, client pulsar.Client, topic string, entries, batch int) {
	b.Helper()
	p, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic, BatchingMaxMessages: uint(batch),
		BatchingMaxPublishDelay: time.Hour, MaxPendingMessages: 10_000})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	var failed atomic.Pointer[error]
	for i := range entries * batch {
		p.SendAsync(context.Background(), &pulsar.ProducerMessage{Payload: []byte(strconv.Itoa(i))},
			func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
				if err != nil {
					failed.CompareAndSwap(nil, &err)
				}
			})
	}
	if err := p.FlushWithCtx(context.Background()); err != nil {
		b.Fatal(err)
	}
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
}
