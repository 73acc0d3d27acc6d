package wirerec

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// BenchmarkProxyOverhead runs the same produce-and-consume round straight to
// a broker and through the recorder, alternating, and reports both
// throughputs and their ratio (1 = no overhead).
func BenchmarkProxyOverhead(b *testing.B) {
	for _, batching := range []bool{true, false} {
		b.Run(fmt.Sprintf("batching=%v", batching), func(b *testing.B) {
			direct := pulsartest.Start(b)
			_, p := startPair(b)
			paths := []*benchPath{
				newBenchPath(b, direct.ServiceURL(), batching),
				newBenchPath(b, p.ServiceURL(), batching),
			}
			const perRound = 2000
			payload := make([]byte, 512)
			round := 0
			for b.Loop() {
				for i := range paths {
					path := paths[(i+round)%2] // alternate which goes first
					path.run(b, perRound, payload)
				}
				round++
			}
			directRate := paths[0].rate()
			proxyRate := paths[1].rate()
			b.ReportMetric(directRate, "direct-msgs/s")
			b.ReportMetric(proxyRate, "proxy-msgs/s")
			b.ReportMetric(proxyRate/directRate, "proxy/direct")
		})
	}
}

type benchPath struct {
	cons     pulsar.Consumer
	prod     pulsar.Producer
	elapsed  time.Duration
	messages int
}

func newBenchPath(b *testing.B, url string, batching bool) *benchPath {
	c := testkit.NewClient(b, url)
	return &benchPath{
		cons: testkit.Subscribe(b, c, pulsar.ConsumerOptions{Topic: "bench", SubscriptionName: "sub"}),
		prod: testkit.NewProducer(b, c, pulsar.ProducerOptions{Topic: "bench", DisableBatching: !batching}),
	}
}

// run sends n messages asynchronously while receiving and acking them.
func (bp *benchPath) run(b *testing.B, n int, payload []byte) {
	start := time.Now()
	go func() {
		for range n {
			bp.prod.SendAsync(context.Background(), &pulsar.ProducerMessage{Payload: payload}, func(pulsar.MessageID, *pulsar.ProducerMessage, error) {})
		}
		_ = bp.prod.Flush()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for i := range n {
		m, err := bp.cons.Receive(ctx)
		if err != nil {
			b.Fatalf("received %d of %d: %v", i, n, err)
		}
		bp.cons.AckID(m.ID())
	}
	bp.elapsed += time.Since(start)
	bp.messages += n
}

func (bp *benchPath) rate() float64 { return float64(bp.messages) / bp.elapsed.Seconds() }
