package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
)

// Config sizes a run.
type Config struct {
	Seed     uint64
	Ops      int           // operations drawn and applied
	Messages int           // numbered messages produced, spread over the topics
	Pods     int           // pods at the start (and the end), spread over the consumer kinds
	Duration time.Duration // of the operations phase; the producer is paced over it
	// Converge bounds the wait for convergence after the last operation.
	Converge time.Duration
	// Drain bounds the wait, after the final Running, for every message to be delivered.
	Drain time.Duration
	// Out receives the report; Verbose, when set, every operation as it is applied, what the
	// sidecar pods log (Info and above) and the consumers' clients' warnings and errors.
	Out, Verbose io.Writer
	// ServiceURL (pulsar://host:port) and AdminURL (http://host:port) name a real Pulsar
	// broker to run on, in a namespace new to the run; both empty, the run starts the
	// in-process two-broker test cluster.
	ServiceURL, AdminURL string
}

func (c Config) withDefaults() Config {
	if c.Ops <= 0 {
		c.Ops = 100
	}
	if c.Messages <= 0 {
		c.Messages = 10000
	}
	if c.Pods <= 0 {
		c.Pods = 10
	}
	if c.Duration <= 0 {
		c.Duration = time.Minute
	}
	if c.Converge <= 0 {
		c.Converge = 90 * time.Second
	}
	if c.Drain <= 0 {
		c.Drain = 2 * time.Minute
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	return c
}

// Report is what a run found.
type Report struct {
	Seed                            uint64
	Broker                          string // what the run ran on
	Ops                             map[string]int
	Produced, Deliveries, Distinct  int64
	FlowsChecked, FlowsWhileGated   int
	Seeks                           int
	SeekOutcomes                    map[string]int
	SeekFailures                    map[string]int // by message
	AdminRedirects                  int64          // admin calls a broker redirected to the topic's owner
	GatedReceives                   int64          // checked by the strict-pause rule
	Violations                      []violation
	ViolationCounts                 map[string]int
	Converge, FinalConverge, Drain  time.Duration
	Elapsed                         time.Duration
	GoroutinesStart, GoroutinesEnd  int
	GoroutineGrowth                 string // the functions whose goroutines grew most
	HeapStartMiB, HeapEndMiB        float64
	ControllerReplicas, AgentStarts int
	// Sidecar pods: created, their consumers' lives (one per partition or topic), the Paused
	// or Stopped intervals they reported and the Running ones after such an interval; the
	// messages their applications received, of them the receives that began gated and those
	// handed over while that state held (within sidecarLeakBound); the FLOWs checked of them.
	SidecarPods, SidecarLives, SidecarGated, SidecarResumed int
	SidecarDeliveries, SidecarGatedReceives, SidecarLeaked  int64
	SidecarFlowsChecked                                     int
	// BrokerHoldBacks notes each subscription whose messages the broker held back at the end
	// of the drain, and the unload of its topic that followed (awaitDelivery).
	BrokerHoldBacks []string
}

// Failed reports whether any invariant was violated.
func (r *Report) Failed() bool { return len(r.ViolationCounts) > 0 }

// Run sets up the world, applies cfg.Ops operations over cfg.Duration while the producer
// writes cfg.Messages messages, then checks every invariant. The error is for a run that could
// not be carried out; violations are in the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg = cfg.withDefaults()
	if (cfg.ServiceURL == "") != (cfg.AdminURL == "") {
		return nil, fmt.Errorf("chaos: a real broker needs both ServiceURL (%q) and AdminURL (%q)", cfg.ServiceURL, cfg.AdminURL)
	}
	fmt.Fprintf(cfg.Out, "chaos seed %d (ops %d, messages %d, pods %d, duration %s)\n", cfg.Seed, cfg.Ops, cfg.Messages, cfg.Pods, cfg.Duration)
	began := time.Now()
	w, err := newWorld(cfg)
	if err != nil {
		if w != nil {
			w.close()
		}
		return nil, err
	}
	defer w.close()
	fmt.Fprintf(cfg.Out, "broker: %s\n", w.broker.describe())
	rep := &Report{Seed: cfg.Seed, Broker: w.broker.describe()}
	e := newEngine(w, cfg.Seed)
	if err := runPhases(ctx, w, e, rep); err != nil {
		return rep, err
	}
	rep.Elapsed = time.Since(began)
	rep.Ops = e.counts
	rep.Seeks, rep.SeekOutcomes, rep.SeekFailures = len(e.seeks), e.seekOutcomes, e.seekFailures
	rep.AdminRedirects = w.adminRedirects.Load()
	rep.GatedReceives = w.gatedReceives.Load()
	rep.Produced, rep.Deliveries, rep.Distinct = w.ledger.totals()
	rep.ControllerReplicas, rep.AgentStarts = w.ctrls.nextID, int(w.instances.Load())
	rep.SidecarPods, rep.SidecarDeliveries, rep.SidecarGatedReceives = w.sidecarPods, w.sidecarDeliveries.Load(), w.sidecarGated.Load()
	rep.SidecarLeaked = w.sidecarLeaked.Load()
	rep.SidecarLives, rep.SidecarGated, rep.SidecarResumed = w.mon.sidecarSummary()
	w.mu.Lock()
	rep.Violations = slices.Clone(w.violations)
	rep.ViolationCounts = maps.Clone(w.count)
	w.mu.Unlock()
	rep.print(cfg.Out)
	return rep, nil
}

func runPhases(ctx context.Context, w *world, e *engine, rep *Report) error {
	cfg := w.cfg
	prodCtx, stopProducer := context.WithCancel(ctx)
	producerDone := w.produce(prodCtx, cfg.Messages, cfg.Duration)
	defer func() {
		stopProducer()
		_ = producerDone() // idempotent: waits for the producer goroutines
		w.producers.closeAll()
	}()
	if err := w.awaitTopics(ctx); err != nil {
		return err
	}
	kinds := initialKinds(cfg.Seed, w.groups, cfg.Pods)
	for i := range cfg.Pods {
		if _, err := w.createPod(ctx, w.groups[i%len(w.groups)], kinds[i]); err != nil {
			return err
		}
	}
	initial := map[podShape]int{}
	for _, p := range w.pods {
		initial[podShape{p.group, p.sidecar}]++
	}
	w.mon.run()
	defer w.mon.stop()
	if _, problems := w.awaitConvergence(ctx, cfg.Converge); len(problems) > 0 {
		return fmt.Errorf("the system did not converge before the first operation: %s", strings.Join(problems, "; "))
	}
	rep.GoroutinesStart, rep.HeapStartMiB = checkpoint()
	w.goroutinesAtStart = goroutinesByFunction()

	opsStart := time.Now()
	for i := range cfg.Ops {
		due := opsStart.Add(time.Duration(float64(cfg.Duration) * float64(i) / float64(cfg.Ops)))
		if err := sleepUntil(ctx, due); err != nil {
			return err
		}
		e.step(ctx, i, cfg.Ops)
	}
	e.healAll()
	if e.ha {
		if _, err := e.switchHA(); err != nil {
			return err
		}
	}
	// The producer is paced to end with the operations; faults may have slowed it.
	if err := waitProducer(producerDone, cfg.Drain); err != nil {
		w.violate("producer", err.Error())
	}

	var problems []string
	rep.Converge, problems = w.awaitConvergence(ctx, cfg.Converge)
	for _, p := range problems {
		w.violate("convergence", p)
	}
	if err := w.normalize(ctx, initial); err != nil {
		return err
	}
	rep.FinalConverge, problems = w.awaitConvergence(ctx, cfg.Converge)
	for _, p := range problems {
		w.violate("convergence", "after the final Running: "+p)
	}
	rep.Drain = w.awaitDelivery(ctx, cfg.Drain, rep)
	for _, p := range w.seekProblems(ctx, e.seeks, e.lastSeek, e.seekOutcome) {
		w.violate("seek", p)
	}
	w.checkFlows(rep)
	if err := w.trimPods(ctx, initial); err != nil {
		return err
	}
	w.awaitGrowthSettled(ctx, rep)
	return nil
}

func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func waitProducer(wait func() error, bound time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(bound):
		return errors.New("the producer did not store every message within the drain bound")
	}
}

// awaitTopics waits until every topic holds a message, so that pattern consumers find them all.
func (w *world) awaitTopics(ctx context.Context) error {
	deadline := time.Now().Add(time.Minute)
	for {
		w.ledger.mu.Lock()
		ready := 0
		for _, t := range producedTopics {
			if w.ledger.produced[t] > 0 {
				ready++
			}
		}
		w.ledger.mu.Unlock()
		if ready == len(producedTopics) {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("the producer could not write to every topic within a minute")
		}
		if err := sleepUntil(ctx, time.Now().Add(50*time.Millisecond)); err != nil {
			return err
		}
	}
}

// initialKinds draws which of the first pods are sidecar pods, from a source of their own so
// that the operations drawn for a seed stay those of runs without sidecar pods: one in
// sidecarShare of the pods whose group allows it, and at least one in a run of four or more.
func initialKinds(seed uint64, groups []*group, pods int) []bool {
	rng := rand.New(rand.NewPCG(seed^0x5eed5ce0, seed))
	kinds := make([]bool, pods)
	var eligible []int
	drawn := false
	for i := range kinds {
		if g := groups[i%len(groups)]; sidecarEligible(g) {
			eligible = append(eligible, i)
			kinds[i] = rng.IntN(sidecarShare) == 0
			drawn = drawn || kinds[i]
		}
	}
	if !drawn && pods >= sidecarShare && len(eligible) > 0 {
		kinds[eligible[rng.IntN(len(eligible))]] = true
	}
	return kinds
}

// normalize brings everything to Running: spec state, no windows, no override, the wide
// selector, every pod labelled in, and at least the initial number of pods per group and kind.
func (w *world) normalize(ctx context.Context, initial map[podShape]int) error {
	for _, g := range w.groups {
		patch := map[string]any{
			"metadata": map[string]any{"annotations": map[string]any{
				"subflow.dev/override-state": nil, "subflow.dev/override-until": nil}},
			"spec": map[string]any{"state": "Running", "maintenanceWindows": nil,
				"selector": map[string]any{"matchLabels": map[string]any{appLabel: g.name, tierLabel: nil}}},
		}
		if err := (&engine{w: w}).patchFlow(ctx, g, patch); err != nil {
			return err
		}
		for _, sc := range []bool{false, true} {
			for shape := (podShape{g, sc}); w.podsOfShape(shape) < initial[shape]; {
				if _, err := w.createPod(ctx, g, sc); err != nil {
					return err
				}
			}
		}
	}
	for _, p := range w.pods {
		if err := w.labelPod(ctx, p, map[string]string{appLabel: p.group.name}); err != nil {
			return err
		}
	}
	return nil
}

// trimPods deletes the pods beyond the initial number per group and kind, so that the last
// checkpoint measures the same shape as the first.
func (w *world) trimPods(ctx context.Context, initial map[podShape]int) error {
	for _, g := range w.groups {
		for _, sc := range []bool{false, true} {
			shape := podShape{g, sc}
			for w.podsOfShape(shape) > initial[shape] {
				i := slices.IndexFunc(w.pods, func(p *simPod) bool { return p.group == g && p.sidecar == sc })
				if err := w.deletePod(ctx, w.pods[i]); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// awaitDelivery waits until every subscription received every produced message of its topics.
// When the bound passes with messages that the broker holds back (subscriptionView.holdsBack), it unloads
// their topics, as an operator would, notes it in the report and waits once more; what is still
// missing then is a violation.
func (w *world) awaitDelivery(ctx context.Context, bound time.Duration, rep *Report) time.Duration {
	start := time.Now()
	if !w.awaitDelivered(ctx, bound) && w.unloadHeldBack(ctx, rep) {
		w.awaitDelivered(ctx, bound)
	}
	var clientRace string
	if n := w.clientLog.DroppedFrames(); n > 0 {
		clientRace = fmt.Sprintf(" (the consumers' clients dropped %d frames for a consumer they no longer knew: pulsar-client-go's handler race, testkit.ClientLog)", n)
	}
	for _, g := range w.groups {
		if n, examples := w.ledger.missing(g.subscription, g.topics); n > 0 {
			w.violate("lost", fmt.Sprintf("subscription %s never received %d produced messages, e.g. %v%s; the broker's view of %s: %s; on the wire: %s",
				g.subscription, n, examples, clientRace, g.flowTopic, w.brokerView(ctx, g.flowTopic, g.subscription), w.entryTrails(g, examples)))
		}
	}
	return time.Since(start)
}

// awaitDelivered polls until every subscription received every produced message of its topics,
// and tells whether that happened within bound.
func (w *world) awaitDelivered(ctx context.Context, bound time.Duration) bool {
	deadline := time.Now().Add(bound)
	for {
		if !slices.ContainsFunc(w.groups, func(g *group) bool { n, _ := w.ledger.missing(g.subscription, g.topics); return n > 0 }) {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		_ = sleepUntil(ctx, time.Now().Add(250*time.Millisecond))
	}
}

// unloadHeldBack unloads the topic of each subscription whose missing messages the broker holds
// back, and tells whether it unloaded any. Pulsar 4.0.7's Shared dispatcher was seen to read
// entries and then neither send them (the wire recorder saw no consumer of ours get them) nor
// keep them for redelivery: they stay in the backlog behind the cursor's read position while
// every consumer has permits, until the topic is unloaded or every consumer leaves. An unload
// makes the cursor read again from its mark-delete position. Nothing was lost and no agent had a
// part in it, so the report notes it instead of counting a violation; if the messages still do
// not come, the "lost" violation stands.
func (w *world) unloadHeldBack(ctx context.Context, rep *Report) bool {
	unloaded := false
	for _, g := range w.groups {
		n, _ := w.ledger.missing(g.subscription, g.topics)
		if n == 0 || g.partitions > 0 || len(g.topics) != 1 || g.flowTopic != w.root+g.topics[0] {
			continue
		}
		view := w.brokerSubscription(ctx, g.flowTopic, g.subscription)
		if !view.holdsBack(n, w.ledger.missingIDs(g.subscription, g.topics[0])) {
			continue
		}
		w.reconnectEvent()
		var err error
		w.producers.aroundFault(func() { err = w.broker.unload(g.topics[0]) })
		note := fmt.Sprintf("subscription %s: the broker held back %d messages (%s); unloaded %s", g.subscription, n, view, g.topics[0])
		if err != nil {
			note += ": " + err.Error()
		}
		rep.BrokerHoldBacks = append(rep.BrokerHoldBacks, note)
		unloaded = unloaded || err == nil
	}
	return unloaded
}

// checkpoint measures goroutines and the live heap after a collection.
func checkpoint() (int, float64) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return runtime.NumGoroutine(), float64(ms.HeapAlloc) / (1 << 20)
}

// Growth tolerances between the checkpoints. Goroutines: client connections and idle HTTP
// connections come and go. Heap: the broker keeps every message and every FLOW, and the run
// records deliveries, so it grows with the messages; a leak per operation or per pod shows.
// Connections a killed controller left idle end with the agents' idle timeout (60 s), so
// the last checkpoint waits up to settleBound for the count to come back.
const (
	goroutineSlack    = 30
	heapSlackMiB      = 64
	heapPerMessageKiB = 2
	settleBound       = 75 * time.Second
)

func (w *world) awaitGrowthSettled(ctx context.Context, rep *Report) {
	limit := rep.GoroutinesStart + goroutineSlack + rep.GoroutinesStart/10
	deadline := time.Now().Add(settleBound)
	for {
		stateClient.CloseIdleConnections() // the run's own idle connections to the agents
		rep.GoroutinesEnd, rep.HeapEndMiB = checkpoint()
		rep.GoroutineGrowth = goroutineGrowth(w.goroutinesAtStart, 5)
		if rep.GoroutinesEnd <= limit || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		_ = sleepUntil(ctx, time.Now().Add(time.Second))
	}
	if rep.GoroutinesEnd > limit {
		w.violate("leak", fmt.Sprintf("goroutines grew from %d to %d (limit %d): %s",
			rep.GoroutinesStart, rep.GoroutinesEnd, limit, rep.GoroutineGrowth))
	}
	produced, _, _ := w.ledger.totals()
	allowed := heapSlackMiB + float64(produced)*heapPerMessageKiB/1024
	if rep.HeapEndMiB-rep.HeapStartMiB > allowed {
		w.violate("leak", fmt.Sprintf("heap grew from %.1f to %.1f MiB (allowed %.1f for %d messages)",
			rep.HeapStartMiB, rep.HeapEndMiB, allowed, produced))
	}
}

func (r *Report) print(out io.Writer) {
	fmt.Fprintf(out, "seed %d on %s\n", r.Seed, r.Broker)
	total := 0
	var kinds []string
	for _, k := range slices.Sorted(maps.Keys(r.Ops)) {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, r.Ops[k]))
		total += r.Ops[k]
	}
	fmt.Fprintf(out, "operations %d: %s\n", total, strings.Join(kinds, " "))
	fmt.Fprintf(out, "messages produced %d, deliveries %d (distinct %d, replays and redeliveries %d)\n",
		r.Produced, r.Deliveries, r.Distinct, r.Deliveries-r.Distinct)
	fmt.Fprintf(out, "seeks %d %v; receives that began gated %d; FLOWs on the wire %d, %d of them while gated\n",
		r.Seeks, r.SeekOutcomes, r.GatedReceives, r.FlowsChecked, r.FlowsWhileGated)
	for _, msg := range slices.Sorted(maps.Keys(r.SeekFailures)) {
		fmt.Fprintf(out, "    seek failed %dx: %s\n", r.SeekFailures[msg], msg)
	}
	fmt.Fprintf(out, "admin calls redirected to the topic's owner and followed by the agent: %d\n", r.AdminRedirects)
	fmt.Fprintf(out, "convergence after the last operation %s, after the final Running %s, drain %s, run %s\n",
		r.Converge.Round(time.Millisecond), r.FinalConverge.Round(time.Millisecond), r.Drain.Round(time.Millisecond), r.Elapsed.Round(time.Second))
	fmt.Fprintf(out, "goroutines %d -> %d, heap %.1f -> %.1f MiB, controller replicas %d, agent processes %d\n",
		r.GoroutinesStart, r.GoroutinesEnd, r.HeapStartMiB, r.HeapEndMiB, r.ControllerReplicas, r.AgentStarts)
	fmt.Fprintf(out, "sidecar pods %d: consumers %d, Paused or Stopped %d times, resumed %d times, deliveries %d (receives that began gated %d, %d of them within the leak bound), FLOWs on the wire %d\n",
		r.SidecarPods, r.SidecarLives, r.SidecarGated, r.SidecarResumed, r.SidecarDeliveries, r.SidecarGatedReceives, r.SidecarLeaked, r.SidecarFlowsChecked)
	if r.GoroutineGrowth != "" {
		fmt.Fprintf(out, "goroutines grown since the start: %s\n", r.GoroutineGrowth)
	}
	n := 0
	for _, c := range r.ViolationCounts {
		n += c
	}
	for _, note := range r.BrokerHoldBacks {
		fmt.Fprintf(out, "broker hold-back: %s\n", note)
	}
	fmt.Fprintf(out, "violations %d\n", n)
	for _, v := range r.Violations {
		fmt.Fprintf(out, "VIOLATION %s at %s: %s\n", v.Kind, v.At.Format("15:04:05.000"), v.Detail)
		for _, op := range v.Trace {
			fmt.Fprintf(out, "    after %s\n", op)
		}
	}
	fmt.Fprintf(out, "BENCH chaos ops=%d messages=%d violations=%d converge_ms=%d drain_ms=%d goroutines=%d/%d heap_mib=%.1f/%.1f\n",
		total, r.Produced, n, r.Converge.Milliseconds(), r.Drain.Milliseconds(), r.GoroutinesStart, r.GoroutinesEnd, r.HeapStartMiB, r.HeapEndMiB)
}

// goroutinesByFunction counts goroutines by the first function of their stack outside the
// runtime and standard sync packages.
func goroutinesByFunction() map[string]int {
	var buf strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 1)
	counts := map[string]int{}
	for _, block := range strings.Split(buf.String(), "\n\n") {
		lines := strings.Split(block, "\n")
		var count int
		if _, err := fmt.Sscanf(lines[0], "%d @", &count); err != nil {
			continue
		}
		fn := "?"
		for _, l := range lines[1:] {
			if f := strings.Fields(l); len(f) >= 3 && f[0] == "#" && !strings.HasPrefix(f[2], "runtime.") &&
				!strings.HasPrefix(f[2], "internal/") && !strings.HasPrefix(f[2], "sync.") {
				fn = f[2]
				break
			}
		}
		counts[fn] += count
	}
	return counts
}

// goroutineGrowth names the functions whose goroutines grew most since before.
func goroutineGrowth(before map[string]int, n int) string {
	type grown struct {
		fn    string
		delta int
	}
	var all []grown
	for fn, c := range goroutinesByFunction() {
		if d := c - before[fn]; d > 0 {
			all = append(all, grown{fn, d})
		}
	}
	slices.SortFunc(all, func(a, b grown) int { return b.delta - a.delta })
	var parts []string
	for _, g := range all[:min(n, len(all))] {
		parts = append(parts, fmt.Sprintf("+%d %s", g.delta, g.fn))
	}
	return strings.Join(parts, ", ")
}

// entryTrails says, for the first examples of missing messages, what the wire recorder saw of
// the entry each is in (trailLength events at most): whom the broker sent it to, and who listed
// it in an ACK or a redelivery request. So a "lost" violation tells a message the broker never
// sent from one a consumer received, and names who acknowledged it.
func (w *world) entryTrails(g *group, examples []string) string {
	var out []string
	for _, ex := range examples[:min(len(examples), 3)] {
		topic, n, ok := parsePayload([]byte(ex))
		if !ok {
			continue
		}
		id := w.ledger.producedID(topic, n)
		if id == nil {
			out = append(out, ex+" (no id recorded)")
			continue
		}
		var trail []string
		types := []pb.BaseCommand_Type{pb.BaseCommand_MESSAGE, pb.BaseCommand_ACK, pb.BaseCommand_REDELIVER_UNACKNOWLEDGED_MESSAGES}
		for _, e := range w.wire.Events(wirerec.Filter{Topic: w.root + topic, Subscription: g.subscription}, types...) {
			if len(trail) == trailLength {
				trail = append(trail, "...")
				break
			}
			if touchesEntry(e, id) {
				trail = append(trail, fmt.Sprintf("%s %s %s", e.Time.Format("15:04:05.000"), e.Type, e.Consumer.Name))
			}
		}
		out = append(out, fmt.Sprintf("%s at %d:%d: [%s]", ex, id.LedgerID(), id.EntryID(), strings.Join(trail, ", ")))
	}
	return strings.Join(out, "; ")
}

// trailLength bounds the events entryTrails lists per entry.
const trailLength = 12

// touchesEntry reports whether e sends, acknowledges or asks again for the entry of id; a
// cumulative ACK touches every entry up to its own.
func touchesEntry(e wirerec.Event, id pulsar.MessageID) bool {
	same := func(m wirerec.MessageID) bool {
		return m.Ledger == uint64(id.LedgerID()) && m.Entry == uint64(id.EntryID())
	}
	if e.Type == pb.BaseCommand_MESSAGE {
		return same(e.MessageID)
	}
	if e.Cumulative {
		m := e.MessageID
		return m.Ledger > uint64(id.LedgerID()) || (m.Ledger == uint64(id.LedgerID()) && m.Entry >= uint64(id.EntryID()))
	}
	return slices.ContainsFunc(e.IDs, same)
}

// subscriptionView is what the broker's stats say of a subscription: its backlog, where its
// cursor stands and whether a read waits on it, and each consumer.
type subscriptionView struct {
	err              error
	backlog          int64
	markDelete, read string // ledger:entry
	waitingRead      bool
	pendingReads     int
	lastEntry        string
	consumers        []consumerView
}

type consumerView struct {
	name, kind                    string
	unacked, permits, messagesOut int64
}

func (v subscriptionView) String() string {
	if v.err != nil {
		return v.err.Error()
	}
	var consumers []string
	for _, c := range v.consumers {
		consumers = append(consumers, fmt.Sprintf("%s (%s) unacked=%d permits=%d out=%d", c.name, c.kind, c.unacked, c.permits, c.messagesOut))
	}
	return fmt.Sprintf("backlog %d, cursor markDelete=%s read=%s waitingReadOp=%v pendingReadOps=%d, last entry %s, consumers [%s]",
		v.backlog, v.markDelete, v.read, v.waitingRead, v.pendingReads, v.lastEntry, strings.Join(consumers, "; "))
}

// holdsBack reports whether the broker holds back the missing messages (n of them, at ids):
// its backlog counts them, its cursor has read past every one, and no consumer holds any
// unacknowledged - so no consumer of ours can have them, and the broker does not send them.
func (v subscriptionView) holdsBack(n int64, ids []pulsar.MessageID) bool {
	if v.err != nil || v.backlog < n || len(ids) == 0 || len(v.consumers) == 0 {
		return false
	}
	var readLedger, readEntry int64
	if _, err := fmt.Sscanf(v.read, "%d:%d", &readLedger, &readEntry); err != nil {
		return false
	}
	for _, id := range ids {
		if id.LedgerID() > readLedger || (id.LedgerID() == readLedger && id.EntryID() >= readEntry) {
			return false
		}
	}
	return !slices.ContainsFunc(v.consumers, func(c consumerView) bool { return c.unacked > 0 })
}

// brokerView says what the broker's stats say of the subscription (subscriptionView), so that
// a "lost" violation tells messages the broker counts as consumed from ones it holds back, and
// names the consumer that holds unacknowledged messages it never handed on (its name carries
// the pod's).
func (w *world) brokerView(ctx context.Context, topic, subscription string) string {
	return w.brokerSubscription(ctx, topic, subscription).String()
}

func (w *world) brokerSubscription(ctx context.Context, topic, subscription string) subscriptionView {
	// Not cancelled with the run: a drain cut short is when the report needs it most.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	base := w.broker.adminURLs()[0] + "/admin/v2/persistent/" + strings.TrimPrefix(topic, "persistent://")
	var stats struct {
		Subscriptions map[string]struct {
			MsgBacklog int64 `json:"msgBacklog"`
			Consumers  []struct {
				ConsumerName     string `json:"consumerName"`
				AvailablePermits int64  `json:"availablePermits"`
				UnackedMessages  int64  `json:"unackedMessages"`
				MsgOutCounter    int64  `json:"msgOutCounter"`
			} `json:"consumers"`
		} `json:"subscriptions"`
	}
	if err := getJSON(ctx, base+"/stats", &stats); err != nil {
		return subscriptionView{err: err}
	}
	var internal struct {
		LastConfirmedEntry string `json:"lastConfirmedEntry"`
		Cursors            map[string]struct {
			MarkDeletePosition string `json:"markDeletePosition"`
			ReadPosition       string `json:"readPosition"`
			WaitingReadOp      bool   `json:"waitingReadOp"`
			PendingReadOps     int    `json:"pendingReadOps"`
		} `json:"cursors"`
	}
	if err := getJSON(ctx, base+"/internalStats", &internal); err != nil {
		return subscriptionView{err: err}
	}
	cursor := internal.Cursors[subscription]
	sub := stats.Subscriptions[subscription]
	v := subscriptionView{backlog: sub.MsgBacklog, markDelete: cursor.MarkDeletePosition, read: cursor.ReadPosition,
		waitingRead: cursor.WaitingReadOp, pendingReads: cursor.PendingReadOps, lastEntry: internal.LastConfirmedEntry}
	sidecars := map[string]bool{}
	for _, p := range w.pods {
		sidecars[p.name] = p.sidecar
	}
	for _, c := range sub.Consumers {
		kind := "agent"
		if pod, _, _ := strings.Cut(c.ConsumerName, "-i"); sidecars[pod] {
			kind = "sidecar"
		}
		v.consumers = append(v.consumers, consumerView{name: c.ConsumerName, kind: kind, unacked: c.UnackedMessages, permits: c.AvailablePermits, messagesOut: c.MsgOutCounter})
	}
	return v
}

// getJSON decodes the answer to a GET of url into v.
func getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("%s: %v", url, err)
	}
	return nil
}
