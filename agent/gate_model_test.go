package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// The gate model test drives a *Consumer over the fake client with random operations and checks,
// after each, what the application observed against a reference model. Replay a failure with
// go test -run TestGateModel ./agent/ -seed N; run longer with -seeds N -ops N (or
// SUBFLOW_GATE_MODEL_SEEDS and SUBFLOW_GATE_MODEL_OPS).
var (
	modelSeed  = flag.Uint64("seed", 0, "gate model test: replay this seed only")
	modelSeeds = flag.Int("seeds", envInt("SUBFLOW_GATE_MODEL_SEEDS", 12), "gate model test: how many seeds")
	modelOps   = flag.Int("ops", envInt("SUBFLOW_GATE_MODEL_OPS", 400), "gate model test: operations per seed")
)

func envInt(name string, fallback int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return fallback
}

// copyKind says what may become of one copy of a message the client pushed into the gate.
type copyKind int

const (
	mustDeliver copyKind = iota // a first copy, or one sent after the cursor moved
	mayDeliver                  // a redelivered copy: at least once allows it, the filter may drop it
	mustDrop                    // redelivered while the gate held the message: the filter drops it
)

func (k copyKind) String() string { return [...]string{"must", "may", "drop"}[k] }

// copyID is one copy of message seq as the fake broker sent it.
type copyID struct{ seq, copy int }

// gateModel is the reference: which copies the gate has (pushed, not yet delivered or dropped),
// and what may reach the application.
type gateModel struct {
	paused, stopped, closed bool
	inGate                  map[copyID]copyKind // pushed into src, not delivered, not dropped
	sent                    map[int]bool        // seqs pushed since the cursor last moved
	delivered               map[int]bool        // seqs the application got at least once
	lastFirst               int                 // the last seq delivered for the first time since the cursor moved
}

func newGateModel() *gateModel {
	m := &gateModel{delivered: map[int]bool{}}
	m.cursorMoved()
	return m
}

func (m *gateModel) state() protocol.State {
	switch {
	case m.stopped || m.closed:
		return protocol.Stopped
	case m.paused:
		return protocol.Paused
	}
	return protocol.Running
}

// cursorMoved: Stop or a seek dropped what the gate had and forgot the redelivery filter.
func (m *gateModel) cursorMoved() {
	m.inGate, m.sent, m.lastFirst = map[copyID]copyKind{}, map[int]bool{}, -1
}

// kindOfResent is what a reconnect's copy of seq may become: the filter drops the copy of a
// message the gate held through a pause; any other copy of a message seen before may come twice.
func (m *gateModel) kindOfResent(seq int) copyKind {
	switch {
	case !m.sent[seq]:
		return mustDeliver
	case m.paused && m.mustDeliver(seq):
		return mustDrop
	}
	return mayDeliver
}

// mustDeliver reports whether the gate has a copy of seq it must deliver.
func (m *gateModel) mustDeliver(seq int) bool {
	for id, kind := range m.inGate {
		if id.seq == seq && kind == mustDeliver {
			return true
		}
	}
	return false
}

func (m *gateModel) pushed(id copyID, kind copyKind) { m.inGate[id], m.sent[id.seq] = kind, true }

// nacked: the application asked for a copy of seq. A copy the gate must still deliver is the
// one asked for; otherwise the filter lets the broker's copies through. It reports whether it
// does, so that the copies on their way (fakeBroker.wanted) pass too.
func (m *gateModel) nacked(seq int) bool {
	if m.mustDeliver(seq) {
		return false
	}
	for id, kind := range m.inGate {
		if id.seq == seq && kind == mustDrop {
			m.inGate[id] = mayDeliver
		}
	}
	return true
}

// deliver checks one message the application got.
func (m *gateModel) deliver(id copyID) error {
	kind, ok := m.inGate[id]
	switch {
	case m.state() != protocol.Running:
		return fmt.Errorf("message %v reached the application while %s", id, m.state())
	case !ok:
		return fmt.Errorf("message %v reached the application but the gate does not have it (delivered before, or dropped)", id)
	case kind == mustDrop:
		return fmt.Errorf("message %v is a redelivered copy of a message the gate held: a duplicate", id)
	case !m.delivered[id.seq] && id.seq <= m.lastFirst:
		return fmt.Errorf("message %v delivered for the first time after %d: out of order", id, m.lastFirst)
	}
	delete(m.inGate, id)
	if !m.delivered[id.seq] {
		m.delivered[id.seq], m.lastFirst = true, id.seq
	}
	return nil
}

// count returns how many copies the gate has, and how many of them it must deliver.
func (m *gateModel) count() (all, must int) {
	for _, kind := range m.inGate {
		all++
		if kind == mustDeliver {
			must++
		}
	}
	return all, must
}

// modelMessage is a fake message that knows which copy it is; the gate sees only its id.
type modelMessage struct {
	pulsar.Message
	id copyID
}

func (m modelMessage) ID() pulsar.MessageID { return pulsar.NewMessageID(1, int64(m.id.seq), -1, 0) }

// fakeBroker plays the broker and the client's receiver queue for one subscription: every
// message not acknowledged from the cursor on is sent to the connected consumer, in order.
type fakeBroker struct {
	produced, cursor, copies int
	acked                    map[int]bool
	queue                    []modelMessage // sent to the client, not yet pushed into src
	kinds                    map[copyID]copyKind
}

// resend starts a session: the client's queue is dropped and every unacknowledged message from
// the cursor on is sent again.
func (b *fakeBroker) resend(kind func(seq int) copyKind) {
	b.queue = nil
	for seq := b.cursor; seq < b.produced; seq++ {
		if !b.acked[seq] {
			b.send(seq, kind(seq))
		}
	}
}

// wanted: the application nacked seq, and the copies of it the broker sent that the client
// has not pushed yet may be delivered.
func (b *fakeBroker) wanted(seq int) {
	for _, m := range b.queue {
		if m.id.seq == seq && b.kinds[m.id] == mustDrop {
			b.kinds[m.id] = mayDeliver
		}
	}
}

func (b *fakeBroker) send(seq int, kind copyKind) {
	id := copyID{seq: seq, copy: b.copies}
	b.copies++
	b.kinds[id] = kind
	b.queue = append(b.queue, modelMessage{id: id})
}

// gateRun is one seeded run: the consumer, the fake broker and the model side by side.
type gateRun struct {
	t        *testing.T
	seed     uint64
	ops      int
	rng      *rand.Rand
	fc       *fakeClient
	c        *Consumer
	broker   *fakeBroker
	model    *gateModel
	log      []string
	unacked  map[int]modelMessage // delivered, not acknowledged
	withChan bool                 // the run takes from Chan() too
}

func TestGateModel(t *testing.T) {
	seeds := make([]uint64, 0, *modelSeeds)
	if *modelSeed != 0 {
		seeds = append(seeds, *modelSeed)
	}
	for i := 0; len(seeds) < cap(seeds) && *modelSeed == 0; i++ {
		seeds = append(seeds, uint64(time.Now().UnixNano())+uint64(i)*7919)
	}
	for _, seed := range seeds {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) { runGateModel(t, seed, *modelOps) })
	}
}

func runGateModel(t *testing.T, seed uint64, ops int) {
	fc := &fakeClient{}
	r := &gateRun{
		t: t, seed: seed, ops: ops, rng: rand.New(rand.NewPCG(seed, seed)), fc: fc,
		broker:  &fakeBroker{acked: map[int]bool{}, kinds: map[copyID]copyKind{}},
		model:   newGateModel(),
		unacked: map[int]modelMessage{},
	}
	r.withChan = r.rng.IntN(2) == 0
	r.c = subscribeFake(t, newTestAgent(t, Options{}), fc, pulsar.ConsumerOptions{NackRedeliveryDelay: time.Hour})
	r.broker.resend(r.model.kindOfResent)
	for i := 0; i < ops; i++ {
		r.do(r.pick())
	}
	r.do(gateOp{name: "close", run: (*gateRun).close}) // every run ends the consumer's life
}

func (r *gateRun) do(op gateOp) {
	r.log = append(r.log, op.name)
	stuck := r.watchdog(r.log[:len(r.log)-1])
	defer stuck.Stop()
	r.check(op.run(r))
	r.dispatch()
	r.check(r.compare())
}

// watchdog ends the test binary, with the replay, when an operation hangs (the gate deadlocked):
// the test's cleanup could not close the consumer either. before is the log up to the operation,
// which nobody writes any more.
func (r *gateRun) watchdog(before []string) *time.Timer {
	op := r.log[len(r.log)-1]
	return time.AfterFunc(2*waitLimit, func() {
		panic(fmt.Sprintf("gate model: %s did not return within %s\nafter %d operations: %s\n%s",
			op, 2*waitLimit, len(before), strings.Join(before, " "), r.replay()))
	})
}

func (r *gateRun) replay() string {
	return fmt.Sprintf("replay: go test -run 'TestGateModel' ./agent/ -seed %d -ops %d", r.seed, r.ops)
}

// check fails the run on the first divergence, with what is needed to replay it.
func (r *gateRun) check(err error) {
	if err == nil {
		return
	}
	r.t.Helper()
	r.t.Fatalf("%v\nafter %d operations: %s\n%s", err, len(r.log), strings.Join(r.log, " "), r.replay())
}

type gateOp struct {
	name   string
	weight int
	run    func(*gateRun) error
}

var gateOps = []gateOp{
	{"pause", 6, func(r *gateRun) error { r.c.Pause(); r.model.paused = true; return nil }},
	{"resume", 6, func(r *gateRun) error { r.c.Resume(); r.model.paused = false; return nil }},
	{"stop", 2, (*gateRun).stop},
	{"run", 3, (*gateRun).run},
	{"produce", 10, (*gateRun).produce},
	{"reconnect", 3, (*gateRun).reconnect},
	{"seek", 2, (*gateRun).seek},
	{"receive", 12, (*gateRun).receive},
	{"chan", 6, (*gateRun).takeChan},
	{"ack", 5, (*gateRun).ack},
	{"nack", 2, (*gateRun).nack},
}

func (r *gateRun) pick() gateOp {
	total := 0
	for _, op := range gateOps {
		total += op.weight
	}
	n := r.rng.IntN(total)
	for _, op := range gateOps {
		if n -= op.weight; n < 0 {
			return op
		}
	}
	panic("unreachable")
}

func (r *gateRun) stop() error {
	r.c.Stop()
	r.model.stopped = true
	r.model.cursorMoved()
	r.broker.queue = nil
	return nil
}

func (r *gateRun) run() error {
	wasStopped := r.model.stopped
	if err := r.c.Run(); err != nil {
		return fmt.Errorf("Run: %w", err)
	}
	r.model.stopped = false
	if wasStopped {
		r.broker.resend(r.model.kindOfResent)
	}
	return nil
}

func (r *gateRun) produce() error {
	seq := r.broker.produced
	r.broker.produced++
	if !r.model.stopped {
		r.broker.send(seq, mustDeliver)
	}
	r.log[len(r.log)-1] += strconv.Itoa(seq)
	return nil
}

// reconnect: the connection drops and the client subscribes again on its own.
func (r *gateRun) reconnect() error {
	if !r.model.stopped {
		r.broker.resend(r.model.kindOfResent)
	}
	return nil
}

func (r *gateRun) seek() error {
	target := r.rng.IntN(r.broker.produced + 1)
	r.log[len(r.log)-1] += strconv.Itoa(target)
	err := r.c.Seek(pulsar.NewMessageID(1, int64(target), -1, 0))
	if r.model.stopped {
		if !errors.Is(err, ErrConsumerStopped) {
			return fmt.Errorf("Seek while stopped = %v, want ErrConsumerStopped", err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("Seek: %w", err)
	}
	r.broker.cursor = target
	for seq := range r.broker.acked {
		if seq >= target {
			delete(r.broker.acked, seq) // a reset cursor forgets the acknowledgements after it
		}
	}
	r.model.cursorMoved()
	r.broker.resend(r.model.kindOfResent)
	return nil
}

// receive calls Receive: it must return a message when the gate has one it must deliver and
// the consumer runs, and nothing it must not.
func (r *gateRun) receive() error {
	ctx, cancel := r.probeContext()
	defer cancel()
	msg, err := r.c.Receive(ctx)
	if err != nil {
		return r.nothingReceived("Receive", err)
	}
	return r.delivered(msg)
}

// takeChan takes from Chan(), which then serves Receive too; half the runs never call it.
func (r *gateRun) takeChan() error {
	if !r.withChan {
		return r.receive()
	}
	ctx, cancel := r.probeContext()
	defer cancel()
	select {
	case cm := <-r.c.Chan():
		if cm.Consumer != r.c {
			return errors.New("Chan() yielded a message whose Consumer is not the gated consumer")
		}
		return r.delivered(cm.Message)
	case <-ctx.Done():
		return r.nothingReceived("Chan()", ctx.Err())
	}
}

// probeContext waits long when a message is due, and briefly to see that none comes otherwise.
func (r *gateRun) probeContext() (context.Context, context.CancelFunc) {
	if _, must := r.model.count(); must > 0 && r.model.state() == protocol.Running {
		return context.WithTimeout(context.Background(), waitLimit)
	}
	return context.WithTimeout(context.Background(), time.Millisecond)
}

func (r *gateRun) nothingReceived(call string, err error) error {
	if !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", call, err)
	}
	if _, must := r.model.count(); must > 0 && r.model.state() == protocol.Running {
		return fmt.Errorf("%s returned nothing within %s though the gate has %d messages to deliver", call, waitLimit, must)
	}
	return nil
}

func (r *gateRun) delivered(msg pulsar.Message) error {
	m, ok := msg.(modelMessage)
	if !ok {
		return fmt.Errorf("unexpected message %T", msg)
	}
	r.log[len(r.log)-1] += fmt.Sprintf("=%d.%d", m.id.seq, m.id.copy)
	r.unacked[m.id.seq] = m
	return r.model.deliver(m.id)
}

func (r *gateRun) ack() error {
	m, ok := r.anyUnacked()
	if !ok {
		return nil
	}
	r.log[len(r.log)-1] += strconv.Itoa(m.id.seq)
	err := r.c.Ack(m)
	switch {
	case r.model.stopped && !errors.Is(err, ErrConsumerStopped):
		return fmt.Errorf("Ack while stopped = %v, want ErrConsumerStopped", err)
	case !r.model.stopped && err != nil:
		return fmt.Errorf("Ack: %w", err)
	case err == nil:
		r.broker.acked[m.id.seq] = true
		delete(r.unacked, m.id.seq)
	}
	return nil
}

func (r *gateRun) nack() error {
	m, ok := r.anyUnacked()
	if !ok {
		return nil
	}
	r.log[len(r.log)-1] += strconv.Itoa(m.id.seq)
	r.c.Nack(m)
	if !r.model.stopped {
		if r.model.nacked(m.id.seq) {
			r.broker.wanted(m.id.seq)
		}
	}
	return nil
}

func (r *gateRun) anyUnacked() (modelMessage, bool) {
	if len(r.unacked) == 0 {
		return modelMessage{}, false
	}
	seqs := slices.Sorted(maps.Keys(r.unacked)) // in order, so that the seed replays the run
	return r.unacked[seqs[r.rng.IntN(len(seqs))]], true
}

func (r *gateRun) close() error {
	r.c.Close()
	r.model.closed = true
	r.model.cursorMoved()
	if _, err := r.c.Receive(context.Background()); !errors.Is(err, ErrConsumerClosed) {
		return fmt.Errorf("Receive after Close = %v, want ErrConsumerClosed", err)
	}
	return nil
}

// dispatch plays the client's dispatcher: it pushes queued messages into the gate's channel
// while there is room. A push that succeeds is a flow permit returned to the broker.
func (r *gateRun) dispatch() {
	if r.model.stopped || r.model.closed {
		return
	}
	fc := r.fc.last()
	for len(r.broker.queue) > 0 {
		m := r.broker.queue[0]
		select {
		case fc.ch <- pulsar.ConsumerMessage{Message: m}:
		default:
			return
		}
		r.broker.queue = r.broker.queue[1:]
		r.model.pushed(m.id, r.broker.kinds[m.id])
		r.log[len(r.log)-1] += fmt.Sprintf(" push%d.%d:%s", m.id.seq, m.id.copy, r.broker.kinds[m.id])
		if st := r.model.state(); st != protocol.Running {
			r.check(fmt.Errorf("the client pushed message %v (a permit) while %s", m.id, st))
		}
	}
}

// compare checks what the consumer reports against the model.
func (r *gateRun) compare() error {
	st := r.c.Status()
	all, must := r.model.count()
	switch {
	case st.State != r.model.state():
		return fmt.Errorf("State %s, want %s", st.State, r.model.state())
	case st.Connected != (r.model.state() != protocol.Stopped):
		return fmt.Errorf("Connected %v while %s", st.Connected, r.model.state())
	case st.HeldMessages > int64(all):
		return fmt.Errorf("%d messages held, more than the %d the gate may have", st.HeldMessages, all)
	case r.model.state() != protocol.Running && st.HeldMessages < int64(must):
		return fmt.Errorf("%d messages held while %s, fewer than the %d the gate must deliver", st.HeldMessages, st.State, must)
	}
	return nil
}
