package pausewhen

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// Backlog is another subscription's backlog on the flow's topics, in messages, as one agent of
// the flow's pods last read it from the broker's admin API (protocol.FlowRequest.BacklogOf).
// The controller has no admin API access of its own: the agents have the address and the
// credentials, so the figures come with their answers and lag by the agent's refresh.
type Backlog struct {
	Subscription string
	Thresholds   Thresholds
}

// BacklogFigures is what the flow's watching agent last answered, for Backlog.Judge.
type BacklogFigures struct {
	// Pod is the agent that answered.
	Pod string
	// Entries are its answer's backlog entries, of every subscription it reads.
	Entries []protocol.BacklogStatus
	// Missing says why no agent could be asked (none speaks protocol 3, or none answered).
	Missing string
}

// Judge sums the subscription's backlog over the entries and judges it by the thresholds.
// Figures that are not there (no agent asked yet, a topic the agent could not read) or older
// than staleAfter are Unknown: OnError decides, since a missing backlog is not an empty one.
func (b Backlog) Judge(f BacklogFigures, staleAfter time.Duration, now time.Time) Reading {
	if f.Missing != "" {
		return unknown(fmt.Errorf("backlog of %s: %s", b.Subscription, f.Missing), now)
	}
	var total int64
	var oldest time.Time
	var unread []string
	seen := 0
	for _, e := range f.Entries {
		if e.Subscription != b.Subscription {
			continue
		}
		seen++
		if e.Unknown != "" {
			unread = append(unread, e.Topic+": "+e.Unknown)
			continue
		}
		total += e.Messages
		if oldest.IsZero() || e.ReadAt.Before(oldest) {
			oldest = e.ReadAt
		}
	}
	switch {
	case seen == 0:
		return unknown(fmt.Errorf("backlog of %s: pod %s has not read it yet", b.Subscription, f.Pod), now)
	case len(unread) > 0:
		return unknown(fmt.Errorf("backlog of %s: pod %s could not read %s", b.Subscription, f.Pod, strings.Join(unread, "; ")), now)
	case now.Sub(oldest) > staleAfter:
		return unknown(fmt.Errorf("backlog of %s: pod %s read it %s ago, more than %s", b.Subscription, f.Pod,
			now.Sub(oldest).Round(time.Second), staleAfter), now)
	}
	r := Reading{Verdict: b.Thresholds.Judge(float64(total)), Seen: fmt.Sprintf("%d messages wait", total), Value: float64(total), At: now}
	if r.Verdict == Unknown {
		r.Err = errors.New("backlog thresholds are not set")
	}
	return r
}
