package agent

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// A paused consumer of chunked messages is subscribed afresh every half expiry, however often
// the controller repeats the pause; it is not while running, nor when it receives no chunked
// messages.
func TestChunkRenewalWhilePausedIsNotPostponedByPushes(t *testing.T) {
	fc := &fakeClient{}
	a := newTestAgent(t, Options{})
	c := subscribeFake(t, a, fc, pulsar.ConsumerOptions{ExpireTimeOfIncompleteChunk: 200 * time.Millisecond})
	if err := controlled(c).SetState(context.Background(), protocol.Paused, 1); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, "two fresh subscriptions while paused", func() bool {
		// The controller repeats its push far more often than the renewal period.
		if err := controlled(c).SetState(context.Background(), protocol.Paused, 1); err != nil {
			t.Fatal(err)
		}
		return fc.count() >= 3
	})
	if st := c.Status(); st.State != protocol.Paused {
		t.Fatalf("status %+v after renewals", st)
	}
	if err := controlled(c).SetState(context.Background(), protocol.Running, 2); err != nil {
		t.Fatal(err)
	}
	running := fc.count()
	plain := subscribeFake(t, a, fc, pulsar.ConsumerOptions{Topic: "persistent://public/default/plain"})
	plain.Pause()
	_ = c.transitions.lock(context.Background())
	armed := c.session.renewal != nil
	c.transitions.unlock()
	_ = plain.transitions.lock(context.Background())
	plainArmed := plain.session.renewal != nil
	plain.transitions.unlock()
	if armed || plainArmed || fc.count() != running+1 {
		t.Fatalf("renewal armed while running (%v) or for a consumer without chunked messages (%v); %d subscribes, want %d",
			armed, plainArmed, fc.count(), running+1)
	}
}

func TestSubscribeRefusesNegativeChunkExpiry(t *testing.T) {
	_, err := newTestAgent(t, Options{}).Subscribe(&fakeClient{}, pulsar.ConsumerOptions{Topic: "t", SubscriptionName: "s",
		ExpireTimeOfIncompleteChunk: -time.Second})
	if !errors.Is(err, ErrNegativeChunkExpiry) {
		t.Fatalf("Subscribe = %v, want ErrNegativeChunkExpiry", err)
	}
}

// chunkMessageID is named as the client's id of a reassembled chunked message, which
// isChunkedID recognises by its name.
type chunkMessageID struct{ pulsar.MessageID }

type plainMessageID struct{ pulsar.MessageID }

func TestIsChunkedIDAnswersAlikeWhateverItSawBefore(t *testing.T) {
	chunked, plain := &chunkMessageID{}, &plainMessageID{}
	for i, c := range []struct {
		id   pulsar.MessageID
		want bool
	}{{plain, false}, {plain, false}, {chunked, true}, {plain, false}, {chunked, true}, {nil, false}, {chunked, true}} {
		if got := isChunkedID(c.id); got != c.want {
			t.Fatalf("call %d: isChunkedID(%T) = %v, want %v", i, c.id, got, c.want)
		}
	}
}
