package pausewhen

import (
	"context"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
)

// Readings shares readings between the flows that ask the same thing (the same query, the same
// object's condition, the same probe): a source is read at most once per the asker's interval,
// however many flows ask, and concurrent askers wait for one read.
type Readings struct {
	// Now is the clock (time.Now when nil).
	Now func() time.Time

	mu      sync.Mutex
	latest  map[string]Reading
	flights singleflight.Group
}

// forget is how long a reading nobody asked for again is kept: the map holds only what flows
// still ask.
const forget = 10 * time.Minute

// Get returns the latest reading of key if it is younger than maxAge, and otherwise reads it
// (once, for every concurrent asker) with read.
func (rs *Readings) Get(ctx context.Context, key string, maxAge time.Duration, read func(context.Context) Reading) Reading {
	if r, ok := rs.fresh(key, maxAge); ok {
		return r
	}
	v, _, _ := rs.flights.Do(key, func() (any, error) {
		if r, ok := rs.fresh(key, maxAge); ok { // another flight just ended
			return r, nil
		}
		// Shared: one asker going away does not fail the others, but the read keeps its
		// deadline (a hanging source must not hold every asker).
		shared := context.WithoutCancel(ctx)
		if deadline, ok := ctx.Deadline(); ok {
			var cancel context.CancelFunc
			shared, cancel = context.WithDeadline(shared, deadline)
			defer cancel()
		}
		r := read(shared)
		rs.keep(key, r)
		return r, nil
	})
	return v.(Reading)
}

func (rs *Readings) now() time.Time {
	if rs.Now != nil {
		return rs.Now()
	}
	return time.Now()
}

func (rs *Readings) fresh(key string, maxAge time.Duration) (Reading, bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r, ok := rs.latest[key]
	return r, ok && rs.now().Sub(r.At) < maxAge
}

func (rs *Readings) keep(key string, r Reading) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.latest == nil {
		rs.latest = map[string]Reading{}
	}
	now := rs.now()
	for k, old := range rs.latest {
		if now.Sub(old.At) > forget {
			delete(rs.latest, k)
		}
	}
	rs.latest[key] = r
}
