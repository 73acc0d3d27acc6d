package chaos

import (
	"slices"
	"sync"
	"time"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// interval is a stretch during which a consumer reported one state (from its Since on).
type interval struct {
	state    protocol.State
	from, to time.Time // to is zero while it lasts
}

// consumerLife is the state history of one consumer (one name: one process's consumer).
type consumerLife struct {
	tc        *trackedConsumer
	intervals []interval
	ended     time.Time
}

// monitor samples every consumer's reported state to keep its history, for the FLOW check:
// a state that lasted less than a sample period may be missed, never invented.
type monitor struct {
	w     *world
	mu    sync.Mutex
	lives map[string]*consumerLife // by consumer name
	procs map[*agentProcess]bool
	stopc chan struct{}
	done  chan struct{}
}

const samplePeriod = 50 * time.Millisecond

func newMonitor(w *world) *monitor {
	return &monitor{w: w, lives: map[string]*consumerLife{}, procs: map[*agentProcess]bool{}}
}

func (m *monitor) run() {
	m.stopc, m.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(m.done)
		tick := time.NewTicker(samplePeriod)
		defer tick.Stop()
		for {
			select {
			case <-m.stopc:
				return
			case <-tick.C:
				m.sample()
			}
		}
	}()
}

func (m *monitor) stop() {
	if m.stopc != nil {
		close(m.stopc)
		<-m.done
	}
}

func (m *monitor) watch(proc *agentProcess) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.procs[proc] = true
	for _, tc := range proc.consumers {
		m.lives[tc.name] = &consumerLife{tc: tc}
	}
}

// forget stops sampling a process that is about to end; its consumers' last states end now.
func (m *monitor) forget(proc *agentProcess) {
	m.sample()
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.procs, proc)
	now := time.Now()
	for _, tc := range proc.consumers {
		if life := m.lives[tc.name]; life != nil {
			life.ended = now
			if n := len(life.intervals); n > 0 && life.intervals[n-1].to.IsZero() {
				life.intervals[n-1].to = now
			}
		}
	}
}

func (m *monitor) sample() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for proc := range m.procs {
		for _, tc := range proc.consumers {
			life := m.lives[tc.name]
			if life == nil || !life.ended.IsZero() {
				continue
			}
			st := tc.c.Status()
			n := len(life.intervals)
			if n > 0 && life.intervals[n-1].state == st.State && life.intervals[n-1].from.Equal(st.Since) {
				continue
			}
			if n > 0 {
				life.intervals[n-1].to = st.Since
			}
			life.intervals = append(life.intervals, interval{state: st.State, from: st.Since})
		}
	}
}

// stateAt returns the interval of the named consumer that contains t, if one was observed.
func (m *monitor) stateAt(name string, t time.Time) (interval, *trackedConsumer, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	life := m.lives[name]
	if life == nil {
		return interval{}, nil, false
	}
	i, found := slices.BinarySearchFunc(life.intervals, t, func(iv interval, t time.Time) int { return iv.from.Compare(t) })
	if !found {
		i--
	}
	if i < 0 {
		return interval{}, life.tc, false
	}
	iv := life.intervals[i]
	if !iv.to.IsZero() && !t.Before(iv.to) {
		return interval{}, life.tc, false
	}
	return iv, life.tc, true
}
