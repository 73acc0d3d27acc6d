// Package testclock has the two clocks tests and simulations inject where the code takes a
// clock: Shifted runs with the wall clock from a point a test moves, Manual stands still
// until a test moves it. Both are safe for concurrent use.
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

// Manual reads the time it was last set to.
type Manual struct {
	mu  sync.Mutex
	now time.Time
}

// NewManual returns a Manual clock that reads t.
func NewManual(t time.Time) *Manual { return &Manual{now: t} }

func (c *Manual) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set makes the clock read t.
func (c *Manual) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// Advance moves the clock forward by d.
func (c *Manual) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
