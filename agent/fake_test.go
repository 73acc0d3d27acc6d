package agent

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// fakeClient hands out fakeConsumers that expose the MessageChannel the gate gave them, so a
// test can play the client's dispatcher: a send that succeeds is a permit returned.
type fakeClient struct {
	pulsar.Client
	mu        sync.Mutex
	consumers []*fakeConsumer
	fail      error
	native    bool
}

func (f *fakeClient) Subscribe(opts pulsar.ConsumerOptions) (pulsar.Consumer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return nil, f.fail
	}
	fc := &fakeConsumer{opts: opts, ch: opts.MessageChannel, closed: make(chan struct{})}
	f.consumers = append(f.consumers, fc)
	if f.native {
		return &nativeFake{fakeConsumer: fc}, nil
	}
	return fc, nil
}

func (f *fakeClient) last() *fakeConsumer {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.consumers[len(f.consumers)-1]
}

func (f *fakeClient) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.consumers)
}

type fakeConsumer struct {
	pulsar.Consumer
	opts      pulsar.ConsumerOptions
	ch        chan pulsar.ConsumerMessage
	closed    chan struct{}
	closeOnce sync.Once
	mu        sync.Mutex
	acked     []pulsar.MessageID
	seeks     []pulsar.MessageID
	receives  atomic.Int64 // zero-queue Receive calls: one permit each
}

func (fc *fakeConsumer) Name() string { return fc.opts.Name }
func (fc *fakeConsumer) Close()       { fc.closeOnce.Do(func() { close(fc.closed) }) }

func (fc *fakeConsumer) AckID(id pulsar.MessageID) error {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	fc.acked = append(fc.acked, id)
	return nil
}

func (fc *fakeConsumer) Seek(id pulsar.MessageID) error {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	fc.seeks = append(fc.seeks, id)
	return nil
}

// Receive is the zero-queue path: it counts a permit and waits for the test to push.
func (fc *fakeConsumer) Receive(ctx context.Context) (pulsar.Message, error) {
	fc.receives.Add(1)
	select {
	case cm := <-fc.ch:
		return cm.Message, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-fc.closed:
		return nil, errors.New("consumer closed")
	}
}

// push plays the dispatcher: it blocks until the gate takes the message, the consumer closes
// (as it does when the test ends) or waitLimit passes, and reports whether the gate took it.
func (fc *fakeConsumer) push(n int64) bool {
	timer := time.NewTimer(waitLimit)
	defer timer.Stop()
	select {
	case fc.ch <- pulsar.ConsumerMessage{Message: fakeMessage{id: pulsar.NewMessageID(1, n, -1, 0), seq: n}}:
		return true
	case <-fc.closed:
		return false
	case <-timer.C:
		return false
	}
}

// mustPush pushes from the test's goroutine and fails the test when the gate does not take the
// message in time.
func (fc *fakeConsumer) mustPush(t testing.TB, n int64) {
	t.Helper()
	if !fc.push(n) {
		t.Fatalf("the gate did not take message %d within %s", n, waitLimit)
	}
}

// tryPush reports whether anything is taking from the channel right now.
func (fc *fakeConsumer) tryPush(n int64) bool {
	select {
	case fc.ch <- pulsar.ConsumerMessage{Message: fakeMessage{id: pulsar.NewMessageID(1, n, -1, 0), seq: n}}:
		return true
	default:
		return false
	}
}

type nativeFake struct {
	*fakeConsumer
	pauses, resumes atomic.Int64
}

func (n *nativeFake) Pause()  { n.pauses.Add(1) }
func (n *nativeFake) Resume() { n.resumes.Add(1) }

type fakeMessage struct {
	pulsar.Message
	id  pulsar.MessageID
	seq int64
}

func (m fakeMessage) ID() pulsar.MessageID { return m.id }

func seqOf(t testing.TB, m pulsar.Message) int64 {
	t.Helper()
	fm, ok := m.(fakeMessage)
	if !ok {
		t.Fatalf("unexpected message type %T", m)
	}
	return fm.seq
}

// waitLimit bounds every wait of a test: a test that fails never hangs.
const waitLimit = 10 * time.Second

// poll is how the tests wait for a condition: asked every millisecond, for up to waitLimit.
var poll = testkit.Poll{Within: waitLimit, Every: time.Millisecond}

// recvWithin returns the next value from ch, failing the test after waitLimit.
func recvWithin[T any](t testing.TB, what string, ch <-chan T) T {
	t.Helper()
	timer := time.NewTimer(waitLimit)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// receiveInBackground receives from c until the test ends and sends each message's sequence
// number on the returned channel. The test's cleanup stops the goroutine and waits for it.
func receiveInBackground(t testing.TB, c pulsar.Consumer, buffer int) <-chan int64 {
	got := make(chan int64, buffer)
	ending := make(chan struct{}) // unblocks a send nobody will take
	stop := testkit.ReceiveInBackground(t, c, false, func(m pulsar.Message) {
		fm, ok := m.(fakeMessage)
		if !ok {
			t.Errorf("unexpected message type %T", m)
			return
		}
		select {
		case got <- fm.seq:
		case <-ending:
		}
	})
	t.Cleanup(func() {
		close(ending)
		stop()
	})
	return got
}

func newTestAgent(t testing.TB, opts Options) *Agent {
	t.Helper()
	a, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a
}

func subscribeFake(t testing.TB, a *Agent, fc *fakeClient, opts pulsar.ConsumerOptions) *Consumer {
	t.Helper()
	if opts.Topic == "" && len(opts.Topics) == 0 {
		opts.Topic = "persistent://public/default/t"
	}
	if opts.SubscriptionName == "" {
		opts.SubscriptionName = "sub"
	}
	c, err := a.Subscribe(fc, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}
