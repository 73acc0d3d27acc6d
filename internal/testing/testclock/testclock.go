// Package testclock has the clock simulations inject where the code takes one: Shifted runs
// with the wall clock from a point a test moves (the demo and chaos runs need time to pass).
// A clock that stands still until a test moves it is k8s.io/utils/clock/testing's FakeClock.
// Shifted is a k8s.io/utils/clock PassiveClock and safe for concurrent use.
package testclock

import (
	"sync"
	"time"
)

// Shifted is the wall clock moved by an offset: time passes as usual, and jumps when moved.
type Shifted struct {
	mu     sync.Mutex
	offset time.Duration
}

// ShiftedFrom returns a Shifted clock that reads t now.
func ShiftedFrom(t time.Time) *Shifted { return &Shifted{offset: time.Until(t)} }

func (c *Shifted) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

// Since is the time elapsed since t on this clock.
func (c *Shifted) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// Advance moves the clock forward by d.
func (c *Shifted) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
}

// Set makes the clock read t now.
func (c *Shifted) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset = time.Until(t)
}
