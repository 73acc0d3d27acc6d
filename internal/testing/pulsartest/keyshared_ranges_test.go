package pulsartest

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// HashRangeAutoSplitStickyKeyConsumerSelector, step by step: ranges end at the listed hashes.
func TestKeyHashRangesSplitAsPulsar(t *testing.T) {
	a, b, c, d := &consumer{name: "a"}, &consumer{name: "b"}, &consumer{name: "c"}, &consumer{name: "d"}
	var r keyHashRanges
	steps := []struct {
		what      string
		consumers []*consumer
		want      string
	}{
		{"a joins: everything", []*consumer{a}, "a:65536"},
		{"b splits the only range, takes the lower half", []*consumer{a, b}, "b:32768 a:65536"},
		{"c splits the first of two equal ranges", []*consumer{a, b, c}, "c:16384 b:32768 a:65536"},
		{"b leaves: the range above takes its range", []*consumer{a, c}, "c:16384 a:65536"},
		{"b comes back: splits the biggest range, not its old one", []*consumer{a, c, b}, "c:16384 b:40960 a:65536"},
		{"a leaves the top range: the one below takes it", []*consumer{c, b}, "c:16384 b:65536"},
		{"d splits the biggest", []*consumer{c, b, d}, "c:16384 d:40960 b:65536"},
	}
	for _, st := range steps {
		r.sync(st.consumers)
		var got string
		for i, end := range r.ends {
			got += fmt.Sprintf(" %s:%d", r.owners[i].name, end)
		}
		if got[1:] != st.want {
			t.Fatalf("%s: %s, want %s", st.what, got[1:], st.want)
		}
	}
	if got := r.selectConsumer(16384); got != c {
		t.Errorf("hash 16384 (a range's end) went to %v, want c", got)
	}
	if got := r.selectConsumer(16385); got != d {
		t.Errorf("hash 16385 went to %v, want d", got)
	}
}

// With Options.KeySharedHashRanges (subscriptionKeySharedUseConsistentHashing=false), keys go
// by murmur3 mod 65536 to the consumer whose range holds the hash: a, b, c joining in that
// order serve (32768, 65536], (16384, 32768] and [1, 16384]. A consumer that leaves and comes
// back under the same name splits the biggest range again, and so serves other keys.
func TestKeySharedHashRangesRouteKeys(t *testing.T) {
	b := Start(t, Options{KeySharedHashRanges: true})
	cl := newClient(t, b)
	names := []string{"a", "b", "c"}
	consumers := map[string]pulsar.Consumer{}
	subscribe := func(name string) {
		consumers[name] = testkit.Subscribe(t, cl, pulsar.ConsumerOptions{Topic: "ranges", SubscriptionName: "sub", Type: pulsar.KeyShared, Name: name})
	}
	for _, n := range names {
		subscribe(n)
	}
	p := testkit.NewProducer(t, cl, pulsar.ProducerOptions{Topic: "ranges", DisableBatching: true})
	round := func(owner func(hash int) string) {
		t.Helper()
		testkit.Eventually(t, waitFor, "every consumer granted", func() bool {
			for _, n := range slices.Sorted(mapKeys(consumers)) {
				if consumerStats(b, "ranges", "sub", n).Permits == 0 {
					return false
				}
			}
			return true
		})
		const keys = 30
		for i := range keys {
			k := fmt.Sprintf("key-%d", i)
			if _, err := p.Send(context.Background(), &pulsar.ProducerMessage{Key: k, Payload: []byte(k)}); err != nil {
				t.Fatal(err)
			}
		}
		order := slices.Sorted(mapKeys(consumers))
		list := make([]pulsar.Consumer, len(order))
		for i, n := range order {
			list[i] = consumers[n]
		}
		got := 0
		drain(t, list, func(i int, m pulsar.Message) bool {
			got++
			h := hashRangeKeyHash([]byte(m.Key()))
			if want := owner(h); want != order[i] {
				t.Errorf("key %s (hash %d) went to %s, want %s", m.Key(), h, order[i], want)
			}
			return got == keys
		})
		testkit.Eventually(t, waitFor, "acks applied", func() bool { return b.Subscription("ranges", "sub").Backlog == 0 })
	}
	round(func(h int) string {
		switch {
		case h <= 16384:
			return "c"
		case h <= 32768:
			return "b"
		}
		return "a"
	})
	consumers["b"].Close()
	delete(consumers, "b")
	round(func(h int) string {
		if h <= 16384 {
			return "c"
		}
		return "a"
	})
	subscribe("b")
	round(func(h int) string {
		switch {
		case h <= 16384:
			return "c"
		case h <= 40960:
			return "b"
		}
		return "a"
	})
}

// The hash of the ranges selector is murmur3 mod 65536, 0 taken as 1; the ring's is mod
// 65535 plus 1 (StickyKeyConsumerSelectorUtils.makeStickyKeyHash over each selector's range).
func TestStickyKeyHashPerSelector(t *testing.T) {
	for i := range 1000 {
		k := []byte(fmt.Sprintf("k%d", i))
		m := int(murmur3(k))
		if got, want := hashRangeKeyHash(k), max(m%65536, 1); got != want {
			t.Fatalf("ranges hash of %s = %d, want %d", k, got, want)
		}
		if got, want := stickyKeyHash(k), m%65535+1; got != want {
			t.Fatalf("ring hash of %s = %d, want %d", k, got, want)
		}
	}
}
