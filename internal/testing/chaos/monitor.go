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

// consumerLife is the state history of one consumer (one name: one process's consumer). A
// sidecar reports each partition or topic of a consumer on its own: one life each.
type consumerLife struct {
	group     *group
	sidecar   bool
	proc      *agentProcess
	intervals []interval
	ended     time.Time
}

// sidecarLifeKey names the life of a sidecar consumer's partition or topic.
func sidecarLifeKey(name, topic string) string { return name + "\x00" + topic }

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
		m.lives[tc.name] = &consumerLife{group: tc.group, proc: proc}
	}
}

// forget stops sampling a process that is about to end; its consumers' last states end now.
func (m *monitor) forget(proc *agentProcess) {
	m.sample()
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.procs, proc)
	now := time.Now()
	for _, life := range m.lives {
		if life.proc == proc && life.ended.IsZero() {
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
			if life := m.lives[tc.name]; life != nil && life.ended.IsZero() {
				life.observe(tc.c.Status())
			}
		}
		if proc.sidecar != nil {
			m.sampleSidecar(proc)
		}
	}
}

// sampleSidecar follows the sidecar's consumers, which come and go with the client's
// connections. A consumer whose connection ended still reports its last Since (as
// Stopped) and a new connection's consumer starts a later one, so only a later Since is a
// new state.
func (m *monitor) sampleSidecar(proc *agentProcess) {
	for _, c := range proc.sidecar.Consumers() {
		key := sidecarLifeKey(c.Name(), c.Topic())
		life := m.lives[key]
		if life == nil {
			life = &consumerLife{group: proc.group, sidecar: true, proc: proc}
			m.lives[key] = life
		}
		st := c.Status()
		if n := len(life.intervals); life.ended.IsZero() && (n == 0 || st.Since.After(life.intervals[n-1].from)) {
			life.observe(st)
		}
	}
}

// observe records the consumer's reported state when it is a new one.
func (life *consumerLife) observe(st protocol.ConsumerStatus) {
	n := len(life.intervals)
	if n > 0 && life.intervals[n-1].state == st.State && life.intervals[n-1].from.Equal(st.Since) {
		return
	}
	if n > 0 {
		life.intervals[n-1].to = st.Since
	}
	life.intervals = append(life.intervals, interval{state: st.State, from: st.Since})
}

// stateAt returns the interval of the named consumer (of a sidecar: its partition or topic)
// that contains t, if one was observed.
func (m *monitor) stateAt(name, topic string, t time.Time) (interval, *consumerLife, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	life := m.lives[name]
	if life == nil {
		life = m.lives[sidecarLifeKey(name, topic)]
	}
	if life == nil {
		return interval{}, nil, false
	}
	i, found := slices.BinarySearchFunc(life.intervals, t, func(iv interval, t time.Time) int { return iv.from.Compare(t) })
	if !found {
		i--
	}
	if i < 0 {
		return interval{}, life, false
	}
	iv := life.intervals[i]
	if !iv.to.IsZero() && !t.Before(iv.to) {
		return interval{}, life, false
	}
	return iv, life, true
}

// sidecarSummary counts what the sidecar consumers went through: lives, the Paused or
// Stopped intervals they reported and the Running ones that followed such an interval.
func (m *monitor) sidecarSummary() (lives, gated, resumed int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, life := range m.lives {
		if !life.sidecar {
			continue
		}
		lives++
		for i, iv := range life.intervals {
			if iv.state != protocol.Running {
				gated++
			} else if i > 0 && life.intervals[i-1].state != protocol.Running {
				resumed++
			}
		}
	}
	return lives, gated, resumed
}
