package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// Operation kinds.
const (
	opSpecState       = "spec-state"
	opOverrideSet     = "override-set"
	opOverrideLift    = "override-lift"
	opOverrideExpire  = "override-expire"
	opWindowAdd       = "window-add"
	opWindowRemove    = "window-remove"
	opClockAdvance    = "clock-advance"
	opSeek            = "seek"
	opSelector        = "selector-change"
	opRelabel         = "pod-relabel"
	opPodCreate       = "pod-create"
	opPodDelete       = "pod-delete"
	opPodTerminate    = "pod-terminate"
	opAgentRestart    = "agent-restart"
	opAgentHTTPDown   = "agent-http-down"
	opControllerKill  = "controller-kill"
	opBrokerDrop      = "broker-drop-connections"
	opTopicUnload     = "topic-unload"
	opTopicMove       = "topic-move"
	opAdminFault      = "admin-fault"
	opBrokerLatency   = "broker-latency"
	opControllerHA    = "controller-ha" // not drawn: the run switches to two replicas and back
	clockAnnotation   = "chaos.subflow.dev/clock"
	maxWindows        = 3
	maxPodsPerGroup   = 4
	clockStepMinutes  = 90
	faultSpanOps      = 4
	windowMinMinutes  = 10
	windowSpanMinutes = 40
)

// weights of the drawn operations.
var weights = []struct {
	kind   string
	weight int
}{
	{opSpecState, 14}, {opOverrideSet, 5}, {opOverrideLift, 4}, {opOverrideExpire, 3},
	{opWindowAdd, 4}, {opWindowRemove, 3}, {opClockAdvance, 5}, {opSeek, 7},
	{opSelector, 3}, {opRelabel, 6}, {opPodCreate, 4}, {opPodDelete, 4}, {opPodTerminate, 3},
	{opAgentRestart, 4}, {opAgentHTTPDown, 4}, {opControllerKill, 3}, {opBrokerDrop, 3},
	{opTopicUnload, 3}, {opTopicMove, 3}, {opAdminFault, 3}, {opBrokerLatency, 2},
}

// drawKind draws one of the kinds the broker side can apply (draws), with their weights.
func drawKind(rng *rand.Rand, draws func(kind string) bool) string {
	total := 0
	for _, w := range weights {
		if draws(w.kind) {
			total += w.weight
		}
	}
	n := rng.IntN(total)
	for _, w := range weights {
		if !draws(w.kind) {
			continue
		}
		if n < w.weight {
			return w.kind
		}
		n -= w.weight
	}
	return weights[0].kind
}

// opRecord is one applied operation, for the trace.
type opRecord struct {
	I      int
	At     time.Time
	Kind   string
	Detail string
	Err    string
}

func (r opRecord) String() string {
	s := fmt.Sprintf("#%d %s %s %s", r.I, r.At.Format("15:04:05.000"), r.Kind, r.Detail)
	if r.Err != "" {
		s += " (error: " + r.Err + ")"
	}
	return s
}

// seekIssued is a seek the run asked for.
type seekIssued struct {
	flow, subscription, id string
	at                     time.Time
	targets                int
}

// engine draws and applies operations; all randomness comes from rng, drawn before the
// operation looks at the world, so that a seed gives the same sequence of operations.
type engine struct {
	w        *world
	rng      *rand.Rand
	ha       bool
	heals    map[int][]func()
	seeks    []seekIssued
	lastSeek map[string]string // flow -> id of its latest seek
	counts   map[string]int
	// seekOutcomes counts seeks by how they ended: succeeded, failed, or skipped (not issued
	// while the flow's previous seek ran).
	seekOutcomes map[string]int
	seekFailures map[string]int       // failed seeks by message
	overdue      map[string]bool      // seeks already reported as not finishing in time
	unmatched    map[string]time.Time // flow -> when it was last seen matching no pod
}

// seekBound is how long a seek may take from the request to its completion in status: the
// agents' seek timeout (30 s) plus the controller's polling and pushes.
const seekBound = 90 * time.Second

func (e *engine) issuedAt(id string) time.Time {
	for _, s := range e.seeks {
		if s.id == id {
			return s.at
		}
	}
	return time.Time{}
}

func (e *engine) seekOutcome(s *subflowv1.SeekStatus) {
	if s.Message == "" {
		e.seekOutcomes["succeeded"]++
	} else {
		e.seekOutcomes["failed"]++
		e.seekFailures[s.Message]++
	}
}

func newEngine(w *world, seed uint64) *engine {
	return &engine{w: w, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), heals: map[int][]func(){},
		lastSeek: map[string]string{}, counts: map[string]int{}, seekOutcomes: map[string]int{}, seekFailures: map[string]int{},
		overdue: map[string]bool{}, unmatched: map[string]time.Time{}}
}

// step applies operation i: first the heals due, then the mode switch or a drawn operation.
func (e *engine) step(ctx context.Context, i, total int) {
	for _, heal := range e.heals[i] {
		heal()
	}
	delete(e.heals, i)
	kind := drawKind(e.rng, e.w.broker.draws)
	if (i == total/3 && !e.ha) || (i == 2*total/3 && e.ha) {
		kind = opControllerHA
	}
	rec := opRecord{I: i, At: time.Now(), Kind: kind}
	detail, err := e.apply(ctx, i, kind)
	rec.Detail = detail
	if err != nil {
		rec.Err = err.Error()
	}
	e.counts[kind]++
	e.w.mu.Lock()
	e.w.trace = append(e.w.trace, rec)
	e.w.mu.Unlock()
	if e.w.cfg.Verbose != nil {
		fmt.Fprintln(e.w.cfg.Verbose, rec)
	}
}

// healAll runs every pending heal (end of the run).
func (e *engine) healAll() {
	for i, heals := range e.heals {
		for _, heal := range heals {
			heal()
		}
		delete(e.heals, i)
	}
}

func (e *engine) healAt(i int, fn func()) { e.heals[i] = append(e.heals[i], fn) }

func (e *engine) apply(ctx context.Context, i int, kind string) (string, error) {
	g := e.w.groups[e.rng.IntN(len(e.w.groups))]
	a, b, c := e.rng.IntN(1<<20), e.rng.IntN(1<<20), e.rng.Float64()
	switch kind {
	case opControllerHA:
		return e.switchHA()
	case opSpecState:
		state := pickState(c)
		return fmt.Sprintf("%s -> %s", g.name, state), e.patchFlow(ctx, g, map[string]any{"spec": map[string]any{"state": state}})
	case opOverrideSet:
		return e.overrideSet(ctx, g, pickState(c), a%2 == 0, time.Duration(5+b%56)*time.Minute)
	case opOverrideLift:
		return g.name, e.setOverride(ctx, g, "", "")
	case opOverrideExpire:
		return e.overrideExpire(ctx, g)
	case opWindowAdd:
		return e.windowAdd(ctx, g, a%60, windowMinMinutes+b%windowSpanMinutes, c < 0.7)
	case opWindowRemove:
		return e.windowRemove(ctx, g, a)
	case opClockAdvance:
		d := time.Duration(1+a%clockStepMinutes) * time.Minute
		return fmt.Sprintf("+%s", d), e.advanceClock(ctx, d)
	case opSeek:
		return e.seek(ctx, i, g, []float64{c, float64(a) / (1 << 20), float64(b) / (1 << 20)})
	case opSelector:
		return e.toggleSelector(ctx, g)
	case opRelabel:
		return e.relabel(ctx, a, b%2 == 0)
	case opPodCreate:
		return e.podCreate(ctx, g, a%sidecarShare == 0) // a sidecar pod where the group allows it
	case opPodDelete:
		return e.podDelete(ctx, a)
	case opPodTerminate:
		return e.podTerminate(ctx, i, a, 1+b%faultSpanOps)
	case opAgentRestart:
		p := e.pick(a)
		if p == nil {
			return "no pod", nil
		}
		return p.name, e.w.restartAgent(ctx, p)
	case opAgentHTTPDown:
		p := e.pick(a)
		if p == nil {
			return "no pod", nil
		}
		span := 1 + b%faultSpanOps
		p.proxy.setDown(true)
		e.healAt(i+span, func() { p.proxy.setDown(false) })
		return fmt.Sprintf("%s for %d ops", p.name, span), nil
	case opControllerKill:
		return e.killController()
	case opBrokerDrop:
		e.w.reconnectEvent() // before the fault: consumers may re-subscribe before it returns
		var detail string
		e.w.producers.aroundFault(func() { detail = e.w.broker.dropConnections(e.w.wire, a%clusterBrokers) })
		return detail, nil
	case opTopicUnload:
		topic := producedTopics[a%len(producedTopics)]
		e.w.reconnectEvent()
		var err error
		e.w.producers.aroundFault(func() { err = e.w.broker.unload(topic) })
		return topic, err
	case opTopicMove:
		topic := producedTopics[a%len(producedTopics)]
		to := b % clusterBrokers
		e.w.reconnectEvent()
		var err error
		e.w.producers.aroundFault(func() { err = e.w.broker.moveTopic(topic, to) })
		return fmt.Sprintf("%s to broker %d", topic, to), err
	case opAdminFault:
		span := 1 + b%faultSpanOps
		var detail string
		if a%2 == 0 {
			d := time.Duration(100+a%1400) * time.Millisecond
			e.w.faults.latency.Store(int64(d))
			detail = fmt.Sprintf("latency %s for %d ops", d, span)
		} else {
			e.w.faults.failing.Store(true)
			detail = fmt.Sprintf("503s for %d ops", span)
		}
		e.healAt(i+span, func() { e.w.faults.latency.Store(0); e.w.faults.failing.Store(false) })
		return detail, nil
	case opBrokerLatency:
		d := time.Duration(20+a%280) * time.Millisecond
		span := 1 + b%3
		e.w.broker.setLatency(d)
		e.healAt(i+span, func() { e.w.broker.setLatency(0) })
		return fmt.Sprintf("%s for %d ops", d, span), nil
	}
	return "", fmt.Errorf("unknown operation %q", kind)
}

func pickState(x float64) subflowv1.FlowState {
	switch {
	case x < 0.45:
		return subflowv1.StateRunning
	case x < 0.8:
		return subflowv1.StatePaused
	default:
		return subflowv1.StateStopped
	}
}

func (e *engine) pick(n int) *simPod {
	if len(e.w.pods) == 0 {
		return nil
	}
	return e.w.pods[n%len(e.w.pods)]
}

func (e *engine) getFlow(ctx context.Context, g *group) (*subflowv1.SubscriptionFlow, error) {
	flow := &subflowv1.SubscriptionFlow{}
	err := e.w.k8s.Get(ctx, client.ObjectKey{Namespace: namespace, Name: g.name}, flow)
	if err == nil && flow.Status.Pods.Matched == 0 {
		e.unmatched[g.name] = time.Now()
	}
	return flow, err
}

func (e *engine) patchFlow(ctx context.Context, g *group, patch map[string]any) error {
	return e.w.mergePatch(ctx, &subflowv1.SubscriptionFlow{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: g.name}}, patch)
}

func (e *engine) setOverride(ctx context.Context, g *group, state subflowv1.FlowState, until string) error {
	ann := map[string]any{subflowv1.OverrideStateAnnotation: nil, subflowv1.OverrideUntilAnnotation: nil}
	if state != "" {
		ann[subflowv1.OverrideStateAnnotation] = string(state)
	}
	if until != "" {
		ann[subflowv1.OverrideUntilAnnotation] = until
	}
	return e.patchFlow(ctx, g, map[string]any{"metadata": map[string]any{"annotations": ann}})
}

func (e *engine) overrideSet(ctx context.Context, g *group, state subflowv1.FlowState, expires bool, within time.Duration) (string, error) {
	until := ""
	if expires {
		until = e.w.clock.Now().Add(within).UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("%s %s until %q", g.name, state, until), e.setOverride(ctx, g, state, until)
}

// overrideExpire moves the clock past the flow's override expiry, or sets one already expired.
func (e *engine) overrideExpire(ctx context.Context, g *group) (string, error) {
	flow, err := e.getFlow(ctx, g)
	if err != nil {
		return g.name, err
	}
	if until, err := time.Parse(time.RFC3339, flow.Annotations[subflowv1.OverrideUntilAnnotation]); err == nil {
		d := max(until.Sub(e.w.clock.Now())+time.Minute, time.Minute)
		return fmt.Sprintf("%s: clock +%s past %s", g.name, d.Round(time.Second), until.Format(time.RFC3339)), e.advanceClock(ctx, d)
	}
	until := e.w.clock.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	return fmt.Sprintf("%s: Paused until %s (already past)", g.name, until), e.setOverride(ctx, g, subflowv1.StatePaused, until)
}

// advanceClock moves the controllers' clock and nudges every flow (an annotation), standing in
// for the requeue a real clock would have reached at the window boundary.
func (e *engine) advanceClock(ctx context.Context, d time.Duration) error {
	e.w.clock.Advance(d)
	for _, g := range e.w.groups {
		ann := map[string]any{clockAnnotation: e.w.clock.Now().UTC().Format(time.RFC3339)}
		if err := e.patchFlow(ctx, g, map[string]any{"metadata": map[string]any{"annotations": ann}}); err != nil {
			return err
		}
	}
	return nil
}

// windowZones are the windows' time zones; Europe/Berlin has a daylight-saving gap ahead of
// the clock's start.
var windowZones = []string{"UTC", "Europe/Berlin"}

func (e *engine) windowAdd(ctx context.Context, g *group, minute, minutes int, paused bool) (string, error) {
	flow, err := e.getFlow(ctx, g)
	if err != nil {
		return g.name, err
	}
	if len(flow.Spec.MaintenanceWindows) >= maxWindows {
		return g.name + ": has the most windows", nil
	}
	state := subflowv1.StateStopped
	if paused {
		state = subflowv1.StatePaused
	}
	win := subflowv1.MaintenanceWindow{Schedule: fmt.Sprintf("%d * * * *", minute), TimeZone: windowZones[minutes%len(windowZones)], State: state,
		Duration: metav1.Duration{Duration: time.Duration(minutes) * time.Minute}}
	windows := append(flow.Spec.MaintenanceWindows, win)
	return fmt.Sprintf("%s: %q %s for %dm %s", g.name, win.Schedule, win.TimeZone, minutes, state),
		e.patchFlow(ctx, g, map[string]any{"spec": map[string]any{"maintenanceWindows": windows}})
}

func (e *engine) windowRemove(ctx context.Context, g *group, n int) (string, error) {
	flow, err := e.getFlow(ctx, g)
	if err != nil {
		return g.name, err
	}
	windows := flow.Spec.MaintenanceWindows
	if len(windows) == 0 {
		return g.name + ": no window", nil
	}
	k := n % len(windows)
	detail := fmt.Sprintf("%s: %q", g.name, windows[k].Schedule)
	windows = append(windows[:k:k], windows[k+1:]...)
	var value any = windows
	if len(windows) == 0 {
		value = nil
	}
	return detail, e.patchFlow(ctx, g, map[string]any{"spec": map[string]any{"maintenanceWindows": value}})
}

// seek asks for a seek to an index that loses nothing: at most the first index of each
// partition not yet delivered to the subscription (fractions say how far back). One seek per
// flow at a time, so that reset-cursor calls can be attributed to seek ids.
func (e *engine) seek(ctx context.Context, i int, g *group, fractions []float64) (string, error) {
	flow, err := e.getFlow(ctx, g)
	if err != nil {
		return g.name, err
	}
	if last := e.lastSeek[g.name]; last != "" {
		s := flow.Status.Seek
		if s == nil || s.ID != last || s.CompletionTime == nil {
			// A seek waits while no pod matches (there is no consumer to run it); the bound
			// counts from the last time the flow was seen without pods.
			since := e.issuedAt(last)
			if t := e.unmatched[g.name]; t.After(since) {
				since = t
			}
			if flow.Status.Pods.Matched > 0 && time.Since(since) > seekBound && !e.overdue[last] {
				e.overdue[last] = true
				e.w.violate("seek", fmt.Sprintf("flow %s: seek %s not finished %s after it was asked for; status seek %s; %s; agents %s",
					g.name, last, seekBound, seekText(s), readyText(flow), agentsText(flow)))
			}
			e.seekOutcomes["skipped"]++
			return fmt.Sprintf("%s: skipped, seek %s not finished", g.name, last), nil
		}
		e.seekOutcome(s)
	}
	id := "s" + strconv.Itoa(i)
	spec := map[string]any{"id": id}
	targets := 1
	var where string
	switch {
	case g.partitions > 0:
		var parts []map[string]any
		for p := range g.partitions {
			upTo := e.w.ledger.deliveredPrefix(g.subscription, fmt.Sprintf("%s-partition-%d", g.flowTopic, p))
			idx := int64(fractions[p%len(fractions)] * float64(upTo))
			parts = append(parts, map[string]any{"partition": p, "index": idx})
			where += fmt.Sprintf(" p%d:%d/%d", p, idx, upTo)
		}
		spec["partitions"] = parts
		targets = g.partitions
	case g.flowTopic != "":
		upTo := e.w.ledger.deliveredPrefix(g.subscription, g.flowTopic)
		idx := int64(fractions[0] * float64(upTo))
		spec["index"] = idx
		where = fmt.Sprintf(" %d/%d", idx, upTo)
	default:
		spec["index"] = 0 // a flow over several topics: the agent refuses, and nothing moves
		where = " 0 (several topics)"
	}
	e.lastSeek[g.name] = id
	e.seeks = append(e.seeks, seekIssued{flow: g.name, subscription: g.subscription, id: id, at: time.Now(), targets: targets})
	detail := fmt.Sprintf("%s %s to%s while %s", g.name, id, where, flow.Status.EffectiveState)
	return detail, e.patchFlow(ctx, g, map[string]any{"spec": map[string]any{"seek": spec}})
}

func (e *engine) toggleSelector(ctx context.Context, g *group) (string, error) {
	flow, err := e.getFlow(ctx, g)
	if err != nil {
		return g.name, err
	}
	labels := map[string]any{appLabel: g.name, tierLabel: "a"}
	if _, narrowed := flow.Spec.Selector.MatchLabels[tierLabel]; narrowed {
		labels[tierLabel] = nil
	}
	return fmt.Sprintf("%s: %v", g.name, labels),
		e.patchFlow(ctx, g, map[string]any{"spec": map[string]any{"selector": map[string]any{"matchLabels": labels}}})
}

func (e *engine) relabel(ctx context.Context, n int, idle bool) (string, error) {
	p := e.pick(n)
	if p == nil {
		return "no pod", nil
	}
	var obj corev1.Pod
	if err := e.w.k8s.Get(ctx, client.ObjectKey{Namespace: namespace, Name: p.name}, &obj); err != nil {
		return p.name, err
	}
	labels := obj.Labels
	change := map[string]string{}
	if idle {
		if labels[appLabel] == p.group.name {
			change[appLabel] = p.group.name + idleSuffix
		} else {
			change[appLabel] = p.group.name
		}
	} else if labels[tierLabel] == "a" {
		change[tierLabel] = "b"
	} else {
		change[tierLabel] = "a"
	}
	return fmt.Sprintf("%s %v", p.name, change), e.w.labelPod(ctx, p, change)
}

func (e *engine) podCreate(ctx context.Context, g *group, sidecar bool) (string, error) {
	if e.w.podsOf(g) >= maxPodsPerGroup {
		return g.name + ": group full", nil
	}
	p, err := e.w.createPod(ctx, g, sidecar)
	if err != nil {
		return g.name, err
	}
	return p.name, nil
}

func (e *engine) podDelete(ctx context.Context, n int) (string, error) {
	p := e.pick(n)
	if p == nil {
		return "no pod", nil
	}
	if e.w.podsOf(p.group) <= 1 {
		return p.name + ": last of its group, kept", nil
	}
	return p.name, e.w.deletePod(ctx, p)
}

// podTerminate deletes a pod that a finalizer holds, as a pod in its termination grace period:
// its process keeps running, with the state it has, for span operations, then ends and the
// finalizer goes.
func (e *engine) podTerminate(ctx context.Context, i, n, span int) (string, error) {
	p := e.pick(n)
	if p == nil {
		return "no pod", nil
	}
	if e.w.podsOf(p.group) <= 1 {
		return p.name + ": last of its group, kept", nil
	}
	if err := e.w.terminatePod(ctx, p); err != nil {
		return p.name, err
	}
	e.healAt(i+span, func() { e.w.finishTermination(context.Background(), p) })
	return fmt.Sprintf("%s for %d ops", p.name, span), nil
}

func (e *engine) killController() (string, error) {
	cs := e.w.ctrls
	if e.ha {
		id := cs.killLeader()
		r, err := cs.start(true)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("leader replica %d killed, replica %d started", id, r.id), nil
	}
	cs.killAll()
	r, err := cs.start(false)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("restarted as replica %d", r.id), nil
}

// switchHA moves between one replica and two with leader election.
func (e *engine) switchHA() (string, error) {
	cs := e.w.ctrls
	cs.killAll()
	e.ha = !e.ha
	replicas := 1
	if e.ha {
		replicas = 2
	}
	for range replicas {
		if _, err := cs.start(e.ha); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("%d replica(s), leader election %v", replicas, e.ha), nil
}

func jsonBytes(v any) ([]byte, error) { return json.Marshal(v) }

func seekText(s *subflowv1.SeekStatus) string {
	if s == nil {
		return "none"
	}
	done := "running"
	if s.CompletionTime != nil {
		done = "completed " + s.CompletionTime.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("{id %s executor %s %s %q}", s.ID, s.Executor, done, s.Message)
}

func agentsText(flow *subflowv1.SubscriptionFlow) string {
	var parts []string
	for _, a := range flow.Status.Agents {
		parts = append(parts, fmt.Sprintf("%s=%s %q", a.Pod, a.State, a.Message))
	}
	return strings.Join(parts, ", ")
}
