package pulsartest

import (
	"fmt"
	"slices"
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

func TestRoundTripPerSubscriptionType(t *testing.T) {
	b := Start(t)
	c := newClient(t, b)
	types := map[string]pulsar.SubscriptionType{
		"exclusive": pulsar.Exclusive, "shared": pulsar.Shared,
		"failover": pulsar.Failover, "key-shared": pulsar.KeyShared,
	}
	for name, kind := range types {
		t.Run(name, func(t *testing.T) {
			topic := "round-trip-" + name
			cons := testkit.Subscribe(t, c, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Type: kind})
			p := testkit.NewProducer(t, c, pulsar.ProducerOptions{Topic: "persistent://public/default/" + topic})
			testkit.Produce(t, p, "m", 20)
			got := payloads(testkit.ReceiveAndAck(t, cons, 20, waitFor))
			want := make([]string, 20)
			for i := range want {
				want[i] = fmt.Sprintf("m-%d", i)
			}
			if kind != pulsar.Shared && !slices.Equal(got, want) {
				t.Fatalf("got %v, want %v in order", got, want)
			}
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("got %v, want %v", got, want)
			}
			testkit.Eventually(t, waitFor, "backlog drained", func() bool { return b.Subscription(topic, "sub").Backlog == 0 })
			st := b.Subscription(topic, "sub")
			if st.Acked != 20 || st.Dispatched != 20 || len(st.Consumers) != 1 {
				t.Fatalf("stats %+v", st)
			}
			checkInvariant(t, b)
		})
	}
}
