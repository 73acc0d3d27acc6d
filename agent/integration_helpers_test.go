package agent

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"

	"github.com/subflow-dev/subflow/internal/pulsartest"
)

// env is a test broker, a real client and an agent pointed at the broker's admin API.
type env struct {
	broker *pulsartest.Broker
	client pulsar.Client
	agent  *Agent
}

func newEnv(t testing.TB, opts ...pulsartest.Options) *env {
	t.Helper()
	b := pulsartest.Start(t, opts...)
	client, err := pulsar.NewClient(pulsar.ClientOptions{URL: b.ServiceURL(), Logger: log.DefaultNopLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	return &env{broker: b, client: client, agent: newTestAgent(t, Options{Name: "test", AdminURL: b.AdminURL()})}
}

func (e *env) subscribe(t testing.TB, opts pulsar.ConsumerOptions) *Consumer {
	t.Helper()
	c, err := e.agent.Subscribe(e.client, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// produce sends messages whose payloads are the numbers from..from+n-1; batch > 1 groups them
// into batch entries of that many messages.
func (e *env) produce(t testing.TB, topic string, from, n, batch int) {
	t.Helper()
	opts := pulsar.ProducerOptions{Topic: topic, DisableBatching: batch <= 1}
	if batch > 1 {
		opts.BatchingMaxMessages = uint(batch)
		opts.BatchingMaxPublishDelay = time.Hour // flushed explicitly
	}
	p, err := e.client.CreateProducer(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var sendErr error
	for i := from; i < from+n; i++ {
		wg.Add(1)
		p.SendAsync(context.Background(), &pulsar.ProducerMessage{Payload: []byte(strconv.Itoa(i))},
			func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
				if err != nil {
					mu.Lock()
					sendErr = err
					mu.Unlock()
				}
				wg.Done()
			})
		if batch > 1 && (i-from+1)%batch == 0 {
			if err := p.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if sendErr != nil {
		t.Fatal(sendErr)
	}
}

func seqOfMessage(t testing.TB, m pulsar.Message) int {
	t.Helper()
	n, err := strconv.Atoi(string(m.Payload()))
	if err != nil {
		t.Fatalf("payload %q: %v", m.Payload(), err)
	}
	return n
}

// receiveN receives and acks n messages, failing after a deadline.
func receiveN(t testing.TB, c pulsar.Consumer, n int) []pulsar.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	out := make([]pulsar.Message, 0, n)
	for len(out) < n {
		m, err := c.Receive(ctx)
		if err != nil {
			t.Fatalf("received %d of %d messages: %v", len(out), n, err)
		}
		if err := c.Ack(m); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// collector receives in the background, acking, and records what reached the application.
type collector struct {
	t      testing.TB
	mu     sync.Mutex
	seqs   []int
	cancel context.CancelFunc
	done   chan struct{}
}

func collect(t testing.TB, c pulsar.Consumer) *collector { return collectAcking(t, c, true) }

// collectAcking collects like collect; without ack it avoids a data race inside pulsar-client-go
// v0.19 between Ack and the discovery of new partitions (consumer_impl.go reads the partition
// list in AckID while partition discovery replaces it).
func collectAcking(t testing.TB, c pulsar.Consumer, ack bool) *collector {
	ctx, cancel := context.WithCancel(context.Background())
	col := &collector{t: t, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(col.done)
		for {
			m, err := c.Receive(ctx)
			if err != nil {
				return
			}
			if ack {
				_ = c.Ack(m)
			}
			col.mu.Lock()
			col.seqs = append(col.seqs, seqOfMessage(t, m))
			col.mu.Unlock()
		}
	}()
	t.Cleanup(col.stop)
	return col
}

func (col *collector) stop() {
	col.cancel()
	<-col.done
}

func (col *collector) count() int {
	col.mu.Lock()
	defer col.mu.Unlock()
	return len(col.seqs)
}

func (col *collector) seqsCopy() []int {
	col.mu.Lock()
	defer col.mu.Unlock()
	return slices.Clone(col.seqs)
}

func (col *collector) distinct() map[int]bool {
	col.mu.Lock()
	defer col.mu.Unlock()
	seen := map[int]bool{}
	for _, s := range col.seqs {
		seen[s] = true
	}
	return seen
}

// flowPermits sums the permits of FLOWs recorded from index `from` on.
func flowPermits(flows []pulsartest.Flow, from int) (sum int64) {
	for _, f := range flows[from:] {
		sum += int64(f.Permits)
	}
	return sum
}

func uniqueTopic(t testing.TB) string {
	return fmt.Sprintf("persistent://public/default/%s-%d", sanitize(t.Name()), time.Now().UnixNano())
}

func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			b[i] = '-'
		}
	}
	return string(b)
}
