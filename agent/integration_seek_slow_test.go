package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/protocol"
	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
)

// holdingAdmin is a reverse proxy in front of a broker's admin API that holds every cursor
// reset until the test releases it (or the caller gives up), as a slow broker would.
type holdingAdmin struct {
	*httptest.Server
	arrived   chan struct{} // one send per reset that reached the proxy
	abandoned chan struct{} // one send per reset whose caller gave up while held
	release   chan struct{} // closed: held and later resets go through
	once      sync.Once
}

func newHoldingAdmin(t *testing.T, adminURL string) *holdingAdmin {
	t.Helper()
	target, err := url.Parse(adminURL)
	if err != nil {
		t.Fatal(err)
	}
	h := &holdingAdmin{arrived: make(chan struct{}, 16), abandoned: make(chan struct{}, 16), release: make(chan struct{})}
	forward := httputil.NewSingleHostReverseProxy(target)
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/resetcursor") {
			// Read the body first: only then does the server watch the connection and end
			// r.Context() when the caller gives up.
			body, err := io.ReadAll(r.Body)
			if err != nil {
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			h.arrived <- struct{}{}
			select {
			case <-h.release:
			case <-r.Context().Done():
				h.abandoned <- struct{}{}
				return
			}
		}
		forward.ServeHTTP(w, r)
	}))
	// Released before the server closes, so that no held request outlives the test.
	t.Cleanup(h.Close)
	t.Cleanup(h.releaseAll)
	return h
}

func (h *holdingAdmin) releaseAll() { h.once.Do(func() { close(h.release) }) }

// await waits for a signal on ch, failing after a deadline.
func await(t *testing.T, ch <-chan struct{}, what string, within time.Duration) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(within):
		t.Fatalf("%s: not within %v", what, within)
	}
}

// returnsWithin runs f and fails the test unless it returns within d (f goes on then).
func returnsWithin(t *testing.T, what string, d time.Duration, f func()) time.Duration {
	t.Helper()
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		f()
	}()
	await(t, done, what, d)
	return time.Since(start)
}

// slowSeekEnv is a consumed topic of 20 plain messages whose consumer's agent resets cursors
// through a holdingAdmin, and a seek to index 5 held at the reset.
type slowSeekEnv struct {
	*env
	admin  *holdingAdmin
	c      *Consumer
	topic  string
	seek   chan error // the seek's result
	marked wirerec.Mark
}

// propagation bounds a Pause; Close's bound is the 1 s.
const propagation, closeBound = time.Second, time.Second

func startSlowSeek(t *testing.T) *slowSeekEnv {
	t.Helper()
	e := newEnv(t, pulsartest.Options{EntriesPerLedger: entriesPerLedger})
	s := &slowSeekEnv{env: e, admin: newHoldingAdmin(t, e.adminURL), topic: uniqueTopic(t), seek: make(chan error, 1)}
	a := newTestAgent(t, Options{Name: "slow-admin", AdminURL: s.admin.URL})
	c := e.subscribeThrough(t, a, pulsar.ConsumerOptions{Topic: s.topic, SubscriptionName: "sub"})
	// Cleanups run last first: the held resets go through before the consumer closes, so that
	// a Close that waits for the seek (the bug) cannot hang the test.
	t.Cleanup(s.admin.releaseAll)
	s.c = c
	e.produce(t, s.topic, 0, 20, 1)
	testkit.ReceiveAndAck(t, c, 20, receiveLimit)
	poll.Eventually(t, "acks", func() bool { return e.backlog(t, s.topic, "sub") == 0 })
	go func() {
		_, err := c.SeekByIndex(context.Background(), 5)
		s.seek <- err
	}()
	await(t, s.admin.arrived, "the seek's cursor reset at the admin API", 15*time.Second)
	s.marked = e.mark()
	return s
}

// blockedReceive starts a Receive, which the seek's closed gate blocks.
func (s *slowSeekEnv) blockedReceive() chan error {
	got := make(chan error, 1)
	go func() {
		m, err := s.c.Receive(context.Background())
		if err == nil {
			err = errors.New("received " + string(m.Payload()))
		}
		got <- err
	}()
	return got
}

// subscribesSince counts the consumer's SUBSCRIBEs on the wire since the mark.
func (s *slowSeekEnv) subscribesSince(m wirerec.Mark) int {
	return len(s.wire.Events(wirerec.Filter{Topic: s.topic, Subscription: "sub", Since: m}, pb.BaseCommand_SUBSCRIBE))
}

// A cursor reset that hangs holds up neither Close nor Pause: Close returns within 1 s, a
// Receive blocked in the gate returns ErrConsumerClosed, the seek is abandoned (its admin call
// cancelled) and the closed consumer never subscribes again.
func TestIntegrationSlowSeekHoldsUpNoClose(t *testing.T) {
	s := startSlowSeek(t)
	receiving := s.blockedReceive()
	took := returnsWithin(t, "Close during a hanging cursor reset", closeBound, s.c.Close)
	select {
	case err := <-receiving:
		if !errors.Is(err, ErrConsumerClosed) {
			t.Fatalf("a Receive blocked during the seek returned %v, want ErrConsumerClosed", err)
		}
	case <-time.After(closeBound):
		t.Fatal("a Receive blocked during the seek still blocks after Close")
	}
	await(t, s.admin.abandoned, "the seek's cursor reset cancelled by Close", 5*time.Second)
	select {
	case err := <-s.seek:
		if !errors.Is(err, ErrConsumerClosed) {
			t.Fatalf("the seek returned %v after Close, want ErrConsumerClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the seek still runs after Close")
	}
	if n := s.subscribesSince(s.marked); n != 0 {
		t.Fatalf("%d SUBSCRIBEs on the wire after Close", n)
	}
	if st := s.c.Status(); st.State != protocol.Stopped || st.Connected {
		t.Fatalf("status after Close: %+v", st)
	}
	t.Logf("Close took %v during a hanging reset", took)
}

// A Pause during a hanging cursor reset closes the gate at once; once the reset goes through,
// the consumer subscribes again still paused (nothing reaches the application) and the target
// comes first after Resume.
func TestIntegrationSlowSeekHoldsUpNoPause(t *testing.T) {
	s := startSlowSeek(t)
	receiving := s.blockedReceive()
	took := returnsWithin(t, "Pause during a hanging cursor reset", propagation, s.c.Pause)
	if st := s.c.Status(); st.State != protocol.Paused {
		t.Fatalf("state after Pause during the seek: %s", st.State)
	}
	s.admin.releaseAll()
	await(t, errDone(t, s.seek), "the seek after the reset went through", 15*time.Second)
	poll.Eventually(t, "the consumer subscribed again after the seek", func() bool { return s.subscribesSince(s.marked) > 0 })
	poll.Eventually(t, "the broker sending from the target on", func() bool { return s.delivered(s.topic, "sub", s.marked) >= 15 })
	select {
	case err := <-receiving:
		t.Fatalf("the application got something while paused after the seek: %v", err)
	default:
	}
	if st := s.c.Status(); st.State != protocol.Paused || !st.Connected {
		t.Fatalf("status after the seek while paused: %+v (want paused and connected)", st)
	}
	s.c.Resume()
	select {
	case err := <-receiving:
		if err == nil || err.Error() != "received 5" {
			t.Fatalf("first after Resume: %v, want the seek's target 5", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("nothing after Resume")
	}
	t.Logf("Pause took %v during a hanging reset", took)
}

// A Stop during a hanging cursor reset returns at once; the seek then completes without
// subscribing the stopped consumer, and Run delivers the target first.
func TestIntegrationSlowSeekHoldsUpNoStop(t *testing.T) {
	s := startSlowSeek(t)
	returnsWithin(t, "Stop during a hanging cursor reset", propagation, s.c.Stop)
	if st := s.c.Status(); st.State != protocol.Stopped || st.Connected {
		t.Fatalf("status after Stop during the seek: %+v", st)
	}
	s.admin.releaseAll()
	await(t, errDone(t, s.seek), "the seek after the reset went through", 15*time.Second)
	if n := s.subscribesSince(s.marked); n != 0 {
		t.Fatalf("%d SUBSCRIBEs on the wire for a consumer stopped during the seek", n)
	}
	if err := s.c.Run(); err != nil {
		t.Fatal(err)
	}
	if got := seqOfMessage(t, testkit.ReceiveAndAck(t, s.c, 1, receiveLimit)[0]); got != 5 {
		t.Fatalf("first message after the seek and Run: %d, want 5", got)
	}
}

// errDone turns a seek result into a signal, failing the test on an error.
func errDone(t *testing.T, results <-chan error) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		if err := <-results; err != nil {
			t.Errorf("seek: %v", err)
		}
		close(done)
	}()
	return done
}
