package agent

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/protocol"
)

func TestSubscribeRefusesApplicationMessageChannel(t *testing.T) {
	a := newTestAgent(t, Options{})
	_, err := a.Subscribe(&fakeClient{}, pulsar.ConsumerOptions{
		Topic: "t", SubscriptionName: "s", MessageChannel: make(chan pulsar.ConsumerMessage, 10),
	})
	if !errors.Is(err, ErrMessageChannelOwned) {
		t.Fatalf("err = %v, want ErrMessageChannelOwned", err)
	}
}

// The gate gives the client its own channel, of the client's default size, and a consumer
// that subscribes while paused gets it full: the client cannot push (return a permit) at all.
func TestGateOwnsChannelPluggedWhilePaused(t *testing.T) {
	fc := &fakeClient{}
	a := newTestAgent(t, Options{StartGated: true, SyncTimeout: time.Hour})
	c := subscribeFake(t, a, fc, pulsar.ConsumerOptions{})
	inner := fc.last()
	if ch := inner.ch; ch == nil || cap(ch) != channelCapacity {
		t.Fatalf("client got channel %v with capacity %d, want %d", ch, cap(ch), channelCapacity)
	}
	if inner.tryPush(1) {
		t.Fatal("the client pushed into the channel of a consumer subscribed while paused")
	}
	a.markSynced()
	for i := range int64(channelCapacity) {
		if !inner.tryPush(i) {
			t.Fatalf("push %d refused while running", i)
		}
	}
	c.Pause()
	if st := c.Status(); st.HeldMessages != channelCapacity {
		t.Fatalf("held %d after Pause, want the %d pushed before it", st.HeldMessages, channelCapacity)
	}
	if inner.tryPush(99) {
		t.Fatal("the client pushed into the channel after Pause returned")
	}
	c.Resume()
	for i := range int64(channelCapacity) {
		m, err := c.Receive(context.Background())
		if err != nil || seqOf(t, m) != i {
			t.Fatalf("after resume got %v %v, want %d", m, err, i)
		}
	}
}

// While paused nothing takes from the client's channel (no permit can be returned) and
// nothing reaches the application; after resume every message arrives in order.
func TestPauseTakesNothingAndResumeDeliversInOrder(t *testing.T) {
	fc := &fakeClient{}
	c := subscribeFake(t, newTestAgent(t, Options{}), fc, pulsar.ConsumerOptions{})
	inner := fc.last()

	got := receiveInBackground(t, c, 100)
	for i := int64(0); i < 10; i++ {
		inner.mustPush(t, i)
	}
	for i := int64(0); i < 10; i++ {
		if s := recvWithin(t, "a message", got); s != i {
			t.Fatalf("got %d, want %d", s, i)
		}
	}

	c.Pause()
	if !c.IsPaused() || c.State() != protocol.Paused {
		t.Fatalf("state = %s after Pause", c.State())
	}
	if inner.tryPush(99) {
		t.Fatal("the gate took a message from the client after Pause returned")
	}
	pushed := make(chan struct{})
	go func() {
		defer close(pushed)
		for i := int64(10); i < 20 && inner.push(i); i++ {
		}
	}()
	select {
	case s := <-got:
		t.Fatalf("message %d reached the application while paused", s)
	case <-pushed:
		t.Fatal("the client could hand over messages while paused")
	default:
	}

	c.Resume()
	for i := int64(10); i < 20; i++ {
		if s := recvWithin(t, "a message after resume", got); s != i {
			t.Fatalf("after resume got %d, want %d", s, i)
		}
	}
	recvWithin(t, "the pushes to end", pushed)
}

// A message the gate has in hand when Pause comes is held, reported, and delivered first.
func TestHeldMessageDeliveredFirstAfterResume(t *testing.T) {
	fc := &fakeClient{}
	c := subscribeFake(t, newTestAgent(t, Options{}), fc, pulsar.ConsumerOptions{})
	inner := fc.last()
	ch := c.Chan()
	inner.mustPush(t, 1) // the pump takes it and offers it to an application that is not reading
	c.Pause()
	if st := c.Status(); st.HeldMessages != 1 || st.State != protocol.Paused {
		t.Fatalf("status = %+v, want one held message, Paused", st)
	}
	go inner.push(2) // ends when taken, or when the test's cleanup closes the consumer
	c.Resume()
	for want := int64(1); want <= 2; want++ {
		cm := recvWithin(t, "a message through Chan()", ch)
		if s := seqOf(t, cm.Message); s != want {
			t.Fatalf("got %d, want %d", s, want)
		}
		if cm.Consumer != c {
			t.Fatal("ConsumerMessage.Consumer is not the gated consumer")
		}
	}
}

// Receive blocks while paused until its context ends, and returns once resumed.
func TestReceiveBlocksWhilePaused(t *testing.T) {
	fc := &fakeClient{}
	c := subscribeFake(t, newTestAgent(t, Options{}), fc, pulsar.ConsumerOptions{})
	c.Pause()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { _, err := c.Receive(ctx); errc <- err }()
	cancel()
	if err := recvWithin(t, "Receive to return", errc); !errors.Is(err, context.Canceled) {
		t.Fatalf("Receive returned %v, want context.Canceled", err)
	}
	got := receiveInBackground(t, c, 1)
	go fc.last().push(7)
	c.Resume()
	if s := recvWithin(t, "a message after resume", got); s != 7 {
		t.Fatalf("got %d, want 7", s)
	}
}

func TestCloseUnblocksReceive(t *testing.T) {
	fc := &fakeClient{}
	c := subscribeFake(t, newTestAgent(t, Options{}), fc, pulsar.ConsumerOptions{})
	c.Pause()
	errc := make(chan error, 1)
	go func() { _, err := c.Receive(context.Background()); errc <- err }()
	c.Close()
	if err := recvWithin(t, "Receive to return", errc); !errors.Is(err, ErrConsumerClosed) {
		t.Fatalf("Receive returned %v, want ErrConsumerClosed", err)
	}
}

// Seek drops held messages without acknowledging them, and keeps the gate closed meanwhile.
func TestSeekDropsHeldMessagesUnacked(t *testing.T) {
	fc := &fakeClient{}
	c := subscribeFake(t, newTestAgent(t, Options{}), fc, pulsar.ConsumerOptions{})
	inner := fc.last()
	c.Chan()
	inner.mustPush(t, 1)
	c.Pause()
	if err := c.Seek(pulsar.NewMessageID(1, 0, -1, 0)); err != nil {
		t.Fatal(err)
	}
	if st := c.Status(); st.HeldMessages != 0 || st.State != protocol.Paused {
		t.Fatalf("status = %+v after seek, want nothing held and still Paused", st)
	}
	if len(inner.acked) != 0 || len(inner.seeks) != 1 {
		t.Fatalf("acked %v, seeks %v: want no ack and one seek", inner.acked, inner.seeks)
	}
}

func TestDropHeldBefore(t *testing.T) {
	fc := &fakeClient{}
	c := subscribeFake(t, newTestAgent(t, Options{}), fc, pulsar.ConsumerOptions{})
	c.Chan()
	fc.last().mustPush(t, 1)
	c.Pause()
	if n := controlled(c).DropHeldOf(time.Now().Add(-time.Hour), nil); n != 0 {
		t.Fatalf("dropped %d messages taken after the cut-off", n)
	}
	if n := controlled(c).DropHeldOf(time.Now(), nil); n != 1 {
		t.Fatalf("dropped %d, want 1", n)
	}
}

// Stop closes the underlying consumer; Run subscribes again with the same options and name.
func TestStopAndRun(t *testing.T) {
	fc := &fakeClient{}
	c := subscribeFake(t, newTestAgent(t, Options{}), fc, pulsar.ConsumerOptions{})
	first := fc.last()
	got := receiveInBackground(t, c, 1)
	c.Stop()
	select {
	case <-first.closed:
	default:
		t.Fatal("Stop did not close the underlying consumer")
	}
	if st := c.Status(); st.State != protocol.Stopped || st.Connected {
		t.Fatalf("status = %+v, want Stopped and disconnected", st)
	}
	if err := c.Ack(fakeMessage{id: pulsar.NewMessageID(1, 1, -1, 0)}); !errors.Is(err, ErrConsumerStopped) {
		t.Fatalf("Ack while stopped = %v", err)
	}
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	second := fc.last()
	if second == first || second.opts.Name != first.opts.Name || second.opts.Name == "" {
		t.Fatalf("Run did not re-subscribe under the same name: %q vs %q", second.opts.Name, first.opts.Name)
	}
	if second.ch == first.ch {
		t.Fatal("Run reused the channel of the closed consumer")
	}
	second.mustPush(t, 5)
	if s := recvWithin(t, "a message after Run", got); s != 5 {
		t.Fatalf("got %d, want 5", s)
	}
}

func TestRunReportsSubscribeErrorAndRetries(t *testing.T) {
	fc := &fakeClient{}
	c := subscribeFake(t, newTestAgent(t, Options{}), fc, pulsar.ConsumerOptions{})
	c.Stop()
	fc.mu.Lock()
	fc.fail = errors.New("broker down")
	fc.mu.Unlock()
	if err := c.Run(); err == nil || c.State() != protocol.Stopped {
		t.Fatalf("Run = %v, state %s: want an error and Stopped", err, c.State())
	}
	fc.mu.Lock()
	fc.fail = nil
	fc.mu.Unlock()
	if err := c.Run(); err != nil || c.State() != protocol.Running {
		t.Fatalf("retry Run = %v, state %s", err, c.State())
	}
}

func TestSetStateGenerations(t *testing.T) {
	fc := &fakeClient{}
	c := subscribeFake(t, newTestAgent(t, Options{}), fc, pulsar.ConsumerOptions{})
	ctx := context.Background()
	steps := []struct {
		state protocol.State
		gen   int64
		stale bool
		want  protocol.State
	}{
		{protocol.Paused, 2, false, protocol.Paused},
		{protocol.Running, 1, true, protocol.Paused}, // a late retry of an older request
		{protocol.Running, 2, true, protocol.Paused}, // same generation, other state
		{protocol.Paused, 2, false, protocol.Paused}, // idempotent repeat
		{protocol.Stopped, 3, false, protocol.Stopped},
		{protocol.Running, 4, false, protocol.Running},
	}
	for i, s := range steps {
		err := controlled(c).SetState(ctx, s.state, s.gen)
		var stale *StaleGenerationError
		if errors.As(err, &stale) != s.stale {
			t.Fatalf("step %d: SetState(%s, %d) = %v, stale want %v", i, s.state, s.gen, err, s.stale)
		}
		if got := c.State(); got != s.want {
			t.Fatalf("step %d: state %s, want %s", i, got, s.want)
		}
	}
	if err := controlled(c).SetState(ctx, "Sleeping", 9); err == nil {
		t.Fatal("an invalid state was accepted")
	}
}

// The application's wish and the controller's combine: the most restrictive wins.
func TestWishesCombineMostRestrictive(t *testing.T) {
	fc := &fakeClient{}
	c := subscribeFake(t, newTestAgent(t, Options{}), fc, pulsar.ConsumerOptions{})
	ctx := context.Background()
	c.Pause()
	if err := controlled(c).SetState(ctx, protocol.Running, 1); err != nil || c.State() != protocol.Paused {
		t.Fatalf("controller Running overrode the application's Pause: %v %s", err, c.State())
	}
	c.Resume()
	if c.State() != protocol.Running {
		t.Fatalf("state %s after Resume", c.State())
	}
	if err := controlled(c).SetState(ctx, protocol.Paused, 2); err != nil {
		t.Fatal(err)
	}
	c.Resume()
	if c.State() != protocol.Paused {
		t.Fatal("the application's Resume overrode the controller's Pause")
	}
}

func TestStartGatedUntilSynced(t *testing.T) {
	fc := &fakeClient{}
	a := newTestAgent(t, Options{StartGated: true, SyncTimeout: time.Hour})
	c := subscribeFake(t, a, fc, pulsar.ConsumerOptions{})
	if c.State() != protocol.Paused || a.synced() {
		t.Fatalf("state %s, synced %v: want Paused before the first sync", c.State(), a.synced())
	}
	if fc.last().tryPush(1) {
		t.Fatal("a start-gated consumer took a message")
	}
	a.markSynced()
	if c.State() != protocol.Running {
		t.Fatalf("state %s after MarkSynced", c.State())
	}
}

func TestStartGatedFallbackAfterTimeout(t *testing.T) {
	for _, fallback := range []protocol.State{protocol.Running, protocol.Stopped} {
		t.Run(string(fallback), func(t *testing.T) {
			fc := &fakeClient{}
			a := newTestAgent(t, Options{StartGated: true, SyncTimeout: 20 * time.Millisecond, FallbackState: fallback})
			c := subscribeFake(t, a, fc, pulsar.ConsumerOptions{})
			poll.Eventually(t, "fallback state", func() bool { return c.State() == fallback })
			a.markSynced()
			if c.State() != protocol.Running {
				t.Fatalf("state %s after a late MarkSynced", c.State())
			}
		})
	}
}

// A hook registered with OnSubscribe runs before the first subscribe: a Stopped rule means
// the consumer never joins the subscription.
func TestOnSubscribeHookAppliesBeforeFirstSubscribe(t *testing.T) {
	fc := &fakeClient{}
	a := newTestAgent(t, Options{})
	a.onSubscribe(func(c *Consumer) {
		if err := controlled(c).SetState(context.Background(), protocol.Stopped, 1); err != nil {
			t.Error(err)
		}
	})
	c := subscribeFake(t, a, fc, pulsar.ConsumerOptions{})
	if fc.count() != 0 || c.State() != protocol.Stopped {
		t.Fatalf("subscribed %d times, state %s: want no subscribe and Stopped", fc.count(), c.State())
	}
	if got := a.consumersNow(); len(got) != 1 || got[0] != c {
		t.Fatalf("Consumers() = %v", got)
	}
	c.Close()
	if len(a.consumersNow()) != 0 {
		t.Fatal("a closed consumer is still listed")
	}
}

func TestNativePauseUsedWhenOffered(t *testing.T) {
	fc := &fakeClient{native: true}
	c := subscribeFake(t, newTestAgent(t, Options{}), fc, pulsar.ConsumerOptions{})
	c.Pause()
	c.Resume()
	_ = c.transitions.lock(context.Background())
	n := c.session.inner.(*nativeFake)
	c.transitions.unlock()
	if n.pauses.Load() < 1 || n.resumes.Load() < 1 {
		t.Fatalf("native Pause/Resume called %d/%d times", n.pauses.Load(), n.resumes.Load())
	}
}

// Zero-queue: the underlying Receive (one permit each) starts only on demand while the gate
// is open. Pause does not abandon the one in flight (its permit is granted already): its
// message is held, and no new underlying Receive starts while paused.
func TestZeroQueueGrantsNoPermitWhilePaused(t *testing.T) {
	fc := &fakeClient{}
	c := subscribeFake(t, newTestAgent(t, Options{}), fc, pulsar.ConsumerOptions{EnableZeroQueueConsumer: true})
	inner := fc.last()
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Chan on a zero-queue consumer did not panic")
			}
		}()
		c.Chan()
	}()
	got := receiveInBackground(t, c, 10)
	poll.Eventually(t, "an underlying Receive", func() bool { return inner.receives.Load() == 1 })
	c.Pause()
	inner.mustPush(t, 1) // the permit granted before the pause brings its message: held
	poll.Eventually(t, "the message held", func() bool { return c.Status().HeldMessages == 1 })
	if inner.tryPush(2) {
		t.Fatal("a paused zero-queue consumer took a second message")
	}
	if n := inner.receives.Load(); n != 1 {
		t.Fatalf("%d underlying receives while paused, want 1", n)
	}
	select {
	case s := <-got:
		t.Fatalf("message %d reached the application while paused", s)
	default:
	}
	c.Resume()
	if s := recvWithin(t, "the held message", got); s != 1 {
		t.Fatalf("got %d, want the held 1", s)
	}
	inner.mustPush(t, 2)
	if s := recvWithin(t, "the next message", got); s != 2 {
		t.Fatalf("got %d, want 2", s)
	}
}

// Pauses, resumes, controller requests and receives run at once: no message is handed over to a Receive
// that started after a Pause returned and ended before the next Resume began; none is lost.
func TestConcurrentPauseResumeIsStrict(t *testing.T) {
	fc := &fakeClient{}
	c := subscribeFake(t, newTestAgent(t, Options{}), fc, pulsar.ConsumerOptions{})
	inner := fc.last()
	const total = 2000
	var w strictWatch
	seen := make([]atomic.Bool, total)
	var received atomic.Int64
	// Every goroutine ends by the deadline even if messages go missing; the test then fails.
	deadline := time.Now().Add(3 * waitLimit)
	running := func() bool { return received.Load() < total && time.Now().Before(deadline) }
	var wg sync.WaitGroup
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for running() {
				m, ok := w.receive(c)
				if !ok {
					continue
				}
				if seq := m.(fakeMessage).seq; seen[seq].Swap(true) {
					t.Errorf("message %d delivered twice", seq)
				}
				received.Add(1)
			}
		}()
	}
	// One toggler owns the epoch and feeds a batch of messages after each resume; other goroutines hammer SetState and Status concurrently.
	var togglers sync.WaitGroup
	togglers.Add(2)
	go func() {
		defer togglers.Done()
		const batch = 50
		next := int64(0)
		for running() {
			c.Pause()
			w.paused()
			w.awaitAttempts(running) // stay paused until receivers have tried
			w.resuming()
			c.Resume()
			for i := 0; i < batch && next < total && running(); i++ {
				if !inner.push(next) {
					t.Errorf("the gate did not take message %d", next)
					return
				}
				next++
			}
		}
	}()
	go func() {
		defer togglers.Done()
		for gen := int64(1); running(); gen++ {
			if err := controlled(c).SetState(context.Background(), protocol.Running, gen); err != nil {
				t.Error(err)
			}
			_ = c.Status()
		}
	}()
	wg.Wait()
	togglers.Wait()
	if n := received.Load(); n != total {
		t.Fatalf("%d of %d messages received by the deadline", n, total)
	}
	if w.attemptsWhilePaused.Load() == 0 {
		t.Fatal("no Receive ran while paused")
	}
	if v := w.violations.Load(); v != 0 {
		t.Fatalf("%d messages reached the application while paused", v)
	}
}

func TestGatePhaseString(t *testing.T) {
	for phase, want := range map[gatePhase]string{gateClosed: "closed", gateOpen: "open", gateClosing: "closing", 7: "gatePhase(7)"} {
		if got := phase.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int(phase), got, want)
		}
	}
}

// A reconnect while paused makes the broker send the held messages again. Every such copy is
// dropped: one the gate's channel caught while plugged as well as one taken from it, however
// many reconnects sent them.
func TestCopiesOfAHeldMessageAreDropped(t *testing.T) {
	fc := &fakeClient{}
	c := subscribeFake(t, newTestAgent(t, Options{}), fc, pulsar.ConsumerOptions{})
	inner := fc.last()
	inner.mustPush(t, 1)
	c.Pause() // message 1 is held; the connection drops and the broker sends it again
	c.Resume()
	if !inner.tryPush(1) { // the first copy, not yet taken when the application pauses again
		t.Fatal("the gate did not take the copy")
	}
	c.Pause()
	c.Resume()
	if !inner.tryPush(1) { // the copy a second reconnect sent
		t.Fatal("the gate did not take the second copy")
	}
	if m, err := c.Receive(context.Background()); err != nil || seqOf(t, m) != 1 {
		t.Fatalf("Receive = %v, %v: want message 1", m, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if m, err := c.Receive(ctx); err == nil {
		t.Fatalf("message %d delivered again", seqOf(t, m))
	}
}

// The Chan pump counts as a taker for as long as it has a message in hand, so Pause returns
// only once that message is held again, and Stop drops it with the rest.
func TestPumpMessageInHandIsHeldByPause(t *testing.T) {
	fc := &fakeClient{}
	c := subscribeFake(t, newTestAgent(t, Options{}), fc, pulsar.ConsumerOptions{})
	ch := c.Chan()
	for i := int64(0); i < 1000; i++ {
		fc.last().mustPush(t, i) // the pump takes it and offers it to an application that is not reading
		c.Pause()
		if held := c.Status().HeldMessages; held != 1 {
			t.Fatalf("round %d: %d messages held after Pause, want the one the pump had", i, held)
		}
		c.Stop()
		if held := c.Status().HeldMessages; held != 0 {
			t.Fatalf("round %d: %d messages held after Stop", i, held)
		}
		c.Resume()
		if err := c.Run(); err != nil {
			t.Fatal(err)
		}
		select {
		case cm := <-ch:
			t.Fatalf("round %d: message %d from before Stop delivered after Run", i, seqOf(t, cm.Message))
		default:
		}
	}
}
