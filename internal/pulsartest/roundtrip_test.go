package pulsartest

import (
	"fmt"
	"slices"
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"
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
			cons := subscribe(t, c, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", Type: kind})
			p := newProducer(t, c, pulsar.ProducerOptions{Topic: "persistent://public/default/" + topic})
			produce(t, p, "m", 20)
			got := payloads(receive(t, cons, 20, true))
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
			eventually(t, "backlog drained", func() bool { return b.Subscription(topic, "sub").Backlog == 0 })
			st := b.Subscription(topic, "sub")
			if st.Acked != 20 || st.Dispatched != 20 || len(st.Consumers) != 1 {
				t.Fatalf("stats %+v", st)
			}
			checkInvariant(t, b)
		})
	}
}
