package agent

import (
	"context"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// subscriberFor returns the raw client's Subscribe or the agent's; "agentSlow" is the agent
// without its lock-free fast take.
func subscriberFor(e *env, name string) func(pulsar.ConsumerOptions) (pulsar.Consumer, error) {
	switch name {
	case "agentSlow":
		return func(o pulsar.ConsumerOptions) (pulsar.Consumer, error) {
			c, err := e.agent.Subscribe(e.client, o)
			if err == nil {
				c.gate.disableFastTake()
			}
			return c, err
		}
	case "raw":
		return e.client.Subscribe
	case "rawUnbuffered": // the raw client on the unbuffered channel the gate needs
		return func(o pulsar.ConsumerOptions) (pulsar.Consumer, error) {
			o.MessageChannel = make(chan pulsar.ConsumerMessage)
			return e.client.Subscribe(o)
		}
	}
	return func(o pulsar.ConsumerOptions) (pulsar.Consumer, error) { return e.agent.Subscribe(e.client, o) }
}

// consumeAll receives and acks n messages and returns how long it took.
func consumeAll(b *testing.B, c pulsar.Consumer, n int) time.Duration {
	ctx := context.Background()
	start := time.Now()
	for range n {
		m, err := c.Receive(ctx)
		if err != nil {
			b.Fatal(err)
		}
		_ = c.Ack(m)
	}
	return time.Since(start)
}

// BenchmarkConsume compares the raw client consumer with the agent's gated consumer: receive
// and ack b.N messages published beforehand, each run on a fresh broker.
func BenchmarkConsume(b *testing.B) {
	for _, name := range []string{"raw", "agent", "agentSlow"} {
		b.Run(name, func(b *testing.B) {
			e := newDirectEnv(b)
			topic := uniqueTopic(b)
			c, err := subscriberFor(e, name)(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub"})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			e.produce(b, topic, 0, b.N, 100)
			runtime.GC()
			b.ResetTimer()
			took := consumeAll(b, c, b.N)
			b.ReportMetric(float64(b.N)/took.Seconds(), "msgs/s")
		})
	}
}

// BenchmarkConsumeInterleaved alternates raw, raw-on-an-unbuffered-channel, agent and
// agent-without-fast-take rounds of the same size on one broker, so that machine noise hits all alike, and reports the agent's
// throughput relative to each: the median of the rounds' ratios (a round that a neighbour's
// burst slowed does not decide it), and the ratio of the totals for context.
func BenchmarkConsumeInterleaved(b *testing.B) {
	const perRound = 20_000
	e := newDirectEnv(b)
	names := [...]string{"raw", "rawUnbuffered", "agent", "agentSlow"}
	var took [len(names)]time.Duration
	var overRaw, overUnbuffered, overSlow []float64
	rounds := max(b.N, 60) // fewer rounds leave the median to noise on a shared machine
	b.ResetTimer()
	for round := range rounds {
		b.StopTimer()
		var consumers [len(names)]pulsar.Consumer
		for i, name := range names {
			topic := uniqueTopic(b)
			c, err := subscriberFor(e, name)(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub"})
			if err != nil {
				b.Fatal(err)
			}
			consumers[i] = c
			e.produce(b, topic, 0, perRound, 100)
		}
		runtime.GC()
		b.StartTimer()
		var this [len(names)]time.Duration
		for j := range names {
			i := (round + j) % len(names) // rotate who goes first
			this[i] = consumeAll(b, consumers[i], perRound)
			took[i] += this[i]
		}
		b.StopTimer()
		overRaw = append(overRaw, this[0].Seconds()/this[2].Seconds())
		overUnbuffered = append(overUnbuffered, this[1].Seconds()/this[2].Seconds())
		overSlow = append(overSlow, this[3].Seconds()/this[2].Seconds())
		for _, c := range consumers {
			c.Close()
		}
		b.StartTimer()
	}
	b.ReportMetric(median(overRaw), "agent/raw")
	b.ReportMetric(median(overUnbuffered), "agent/rawUnbuffered")
	b.ReportMetric(median(overSlow), "agent/agentSlow") // what the fast take pays
	b.ReportMetric(took[0].Seconds()/took[2].Seconds(), "agent/raw-total")
	b.ReportMetric(float64(rounds), "rounds")
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkResumeToFirstMessage measures, with messages buffered in the client, the time from
// calling Resume to a blocked Receive returning a message.
func BenchmarkResumeToFirstMessage(b *testing.B) {
	e := newDirectEnv(b)
	topic := uniqueTopic(b)
	c := e.subscribe(b, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub", ReceiverQueueSize: 100})
	c.Pause()
	e.produce(b, topic, 0, b.N+200, 100)
	poll.Eventually(b, "a full client queue", func() bool { return e.local.Subscription(topic, "sub").Dispatched >= 100 })

	stamps := make(chan time.Time)
	go func() {
		for {
			m, err := c.Receive(context.Background())
			if err != nil {
				return
			}
			stamps <- time.Now()
			_ = c.Ack(m)
		}
	}()
	latencies := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		c.Resume()
		latencies = append(latencies, (<-stamps).Sub(start))
		c.Pause()
	}
	b.StopTimer()
	slices.Sort(latencies)
	b.ReportMetric(float64(latencies[len(latencies)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(latencies[len(latencies)*99/100].Microseconds()), "p99-µs")
}
