package pulsartest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// BenchmarkProduceConsume measures messages per second through the broker:
// one producer sending asynchronously while one consumer receives and acks.
func BenchmarkProduceConsume(b *testing.B) {
	for _, batching := range []bool{true, false} {
		b.Run(fmt.Sprintf("batching=%v", batching), func(b *testing.B) {
			broker := Start(b)
			c := newClient(b, broker)
			cons := testkit.Subscribe(b, c, pulsar.ConsumerOptions{Topic: "bench", SubscriptionName: "sub"})
			p := testkit.NewProducer(b, c, pulsar.ProducerOptions{Topic: "bench", DisableBatching: !batching})
			payload := make([]byte, 100)
			b.ResetTimer()
			start := time.Now()
			go func() {
				for i := 0; i < b.N; i++ {
					p.SendAsync(context.Background(), &pulsar.ProducerMessage{Payload: payload}, func(pulsar.MessageID, *pulsar.ProducerMessage, error) {})
				}
				_ = p.Flush()
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			for i := 0; i < b.N; i++ {
				m, err := cons.Receive(ctx)
				if err != nil {
					b.Fatalf("received %d of %d: %v", i, b.N, err)
				}
				cons.AckID(m.ID())
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}
