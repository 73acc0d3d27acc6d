package agent

import (
	"context"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// strictWatch catches a message handed to a Receive that began while paused. The test calls
// paused right after each Pause returns and resuming right before each Resume, and receives
// through receive; violations counts the messages that reached the application while paused.
type strictWatch struct {
	epoch               atomic.Int64 // odd while a Pause has returned and no Resume has begun
	violations          atomic.Int64
	attemptsWhilePaused atomic.Int64
}

func (w *strictWatch) paused()   { w.epoch.Add(1) }
func (w *strictWatch) resuming() { w.epoch.Add(1) }

// awaitAttempts yields until the receivers have tried twice more since it was called (so that
// a pause has teeth), or until more returns false.
func (w *strictWatch) awaitAttempts(more func() bool) {
	attempts := w.attemptsWhilePaused.Load()
	for w.attemptsWhilePaused.Load() < attempts+2 && more() {
		runtime.Gosched()
	}
}

// receive makes one Receive of at most 2 ms and returns its message, if any.
func (w *strictWatch) receive(c pulsar.Consumer) (pulsar.Message, bool) {
	e := w.epoch.Load()
	if e%2 == 1 {
		w.attemptsWhilePaused.Add(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
	m, err := c.Receive(ctx)
	cancel()
	if err != nil {
		return nil, false
	}
	if e%2 == 1 && w.epoch.Load() == e {
		w.violations.Add(1)
	}
	return m, true
}
