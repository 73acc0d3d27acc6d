package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/subflow-dev/subflow/agent/protocol"
	"github.com/subflow-dev/subflow/agent/sidecar"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/controllers"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
)

// flowGrace is how long after a pause took effect a FLOW may still arrive: one the client
// decided before the gate closed, on its way through the connection and the broker's latency.
const flowGrace = 1500 * time.Millisecond

// violation is a broken invariant with the operations that came before it.
type violation struct {
	At     time.Time
	Kind   string
	Detail string
	Trace  []opRecord
}

const (
	traceLength   = 8
	maxViolations = 200
)

// violate records a violation seen now with the last operations applied before it.
func (w *world) violate(kind, detail string) { w.violateAt(kind, detail, time.Now()) }

// violateAt records a violation that happened at `at`.
func (w *world) violateAt(kind, detail string, at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	v := violation{At: at, Kind: kind, Detail: detail}
	n, _ := slices.BinarySearchFunc(w.trace, at, func(r opRecord, t time.Time) int { return r.At.Compare(t) })
	v.Trace = slices.Clone(w.trace[max(0, n-traceLength):n])
	w.count[kind]++
	if len(w.violations) < maxViolations {
		w.violations = append(w.violations, v)
	}
}

var stateClient = &http.Client{Timeout: 3 * time.Second}

// agentState asks a pod's agent for its rules and consumers, through its Pod address.
func agentState(ctx context.Context, p *simPod) (protocol.AgentState, error) {
	var st protocol.AgentState
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		fmt.Sprintf("http://127.0.0.1:%d%s/state", p.proxy.port(), protocol.PathPrefix), nil)
	if err != nil {
		return st, err
	}
	req.Header.Set("Authorization", "Bearer "+agentToken)
	resp, err := stateClient.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("GET state: %s", resp.Status)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// convergenceProblems lists what keeps the system from its stated goal now: every matched
// pod's agent holds the flow's rule at the effective state with its consumers in it, no
// unmatched pod holds it, and the flow is Ready at its generation.
func (w *world) convergenceProblems(ctx context.Context) []string {
	var problems []string
	var podList corev1.PodList
	if err := w.k8s.List(ctx, &podList, client.InNamespace(namespace)); err != nil {
		return []string{err.Error()}
	}
	podLabels := map[string]labels.Set{}
	for _, p := range podList.Items {
		podLabels[p.Name] = p.Labels
	}
	states := map[string]protocol.AgentState{}
	for _, p := range w.pods {
		st, err := agentState(ctx, p)
		if err != nil {
			problems = append(problems, fmt.Sprintf("pod %s: %v", p.name, err))
			continue
		}
		states[p.name] = st
	}
	for _, g := range w.groups {
		flow := &subflowv1.SubscriptionFlow{}
		if err := w.k8s.Get(ctx, client.ObjectKey{Namespace: namespace, Name: g.name}, flow); err != nil {
			problems = append(problems, err.Error())
			continue
		}
		want := controllers.EffectiveState(flow, w.clock.Now()).State
		if !meta.IsStatusConditionTrue(flow.Status.Conditions, subflowv1.ConditionReady) || flow.Status.ObservedGeneration != flow.Generation {
			problems = append(problems, fmt.Sprintf("flow %s not Ready at generation %d (observed %d, %s)", g.name, flow.Generation,
				flow.Status.ObservedGeneration, readyText(flow)))
		}
		if flow.Status.EffectiveState != want {
			problems = append(problems, fmt.Sprintf("flow %s reports %s, effective is %s", g.name, flow.Status.EffectiveState, want))
		}
		selector, err := metav1.LabelSelectorAsSelector(&flow.Spec.Selector)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		for _, p := range w.pods {
			st, ok := states[p.name]
			if !ok {
				continue
			}
			problems = append(problems, podProblems(flow, p, st, selector.Matches(podLabels[p.name]), protocol.State(want))...)
		}
	}
	return problems
}

func podProblems(flow *subflowv1.SubscriptionFlow, p *simPod, st protocol.AgentState, matched bool, want protocol.State) []string {
	var rule *protocol.FlowSummary
	for i := range st.Flows {
		if st.Flows[i].UID == string(flow.UID) {
			rule = &st.Flows[i]
		}
	}
	switch {
	case !matched && rule != nil:
		return []string{fmt.Sprintf("pod %s does not match flow %s but holds its rule (%s)", p.name, flow.Name, rule.State)}
	case !matched:
		return nil
	case rule == nil:
		return []string{fmt.Sprintf("pod %s matches flow %s but holds no rule of it", p.name, flow.Name)}
	case rule.State != want:
		return []string{fmt.Sprintf("pod %s holds flow %s at %s, effective is %s", p.name, flow.Name, rule.State, want)}
	}
	var problems []string
	for _, c := range st.Consumers {
		if c.Subscription == flow.Spec.Subscription && c.State != want {
			problems = append(problems, fmt.Sprintf("pod %s consumer %s is %s, effective is %s", p.name, c.Name, c.State, want))
		}
	}
	return problems
}

func readyText(flow *subflowv1.SubscriptionFlow) string {
	c := meta.FindStatusCondition(flow.Status.Conditions, subflowv1.ConditionReady)
	if c == nil {
		return "no Ready condition"
	}
	return fmt.Sprintf("Ready=%s %s: %s", c.Status, c.Reason, c.Message)
}

// awaitConvergence polls until nothing is left to converge or the bound passes; it returns
// how long it took and, on failure, the problems of the last poll.
func (w *world) awaitConvergence(ctx context.Context, bound time.Duration) (time.Duration, []string) {
	start := time.Now()
	for {
		problems := w.convergenceProblems(ctx)
		if len(problems) == 0 {
			return time.Since(start), nil
		}
		if time.Since(start) > bound || ctx.Err() != nil {
			return time.Since(start), problems
		}
		time.Sleep(250 * time.Millisecond) // polling interval of a deadline-bounded wait
	}
}

// seekProblems checks that every flow's latest seek completes within seekBound (earlier ones
// had, or the next was not issued) and that no agent process reset a cursor twice for one
// seek id.
func (w *world) seekProblems(ctx context.Context, seeks []seekIssued, last map[string]string, outcome func(*subflowv1.SeekStatus)) []string {
	var problems []string
	for name, id := range last {
		s, err := w.awaitSeek(ctx, name, id, seekBound)
		switch {
		case err != nil:
			problems = append(problems, err.Error())
		case s == nil || s.ID != id || s.CompletionTime == nil:
			problems = append(problems, fmt.Sprintf("flow %s: seek %s did not end Succeeded or Failed within %s (status %+v)", name, id, seekBound, s))
		default:
			outcome(s)
		}
	}
	w.mu.Lock()
	resets := slices.Clone(w.resets)
	w.mu.Unlock()
	type key struct {
		instance int
		seek     string
	}
	counts := map[key]int{}
	limit := map[string]int{}
	for _, r := range resets {
		var owner *seekIssued
		for i := range seeks {
			if seeks[i].subscription == r.Subscription && !seeks[i].at.After(r.At) {
				owner = &seeks[i]
			}
		}
		if owner == nil {
			problems = append(problems, fmt.Sprintf("agent process %d reset %s with no seek asked", r.Instance, r.Path))
			continue
		}
		counts[key{r.Instance, owner.id}]++
		limit[owner.id] = owner.targets
	}
	for k, n := range counts {
		if n > limit[k.seek] {
			problems = append(problems, fmt.Sprintf("agent process %d reset cursors %d times for seek %s (%d targets)", k.instance, n, k.seek, limit[k.seek]))
		}
	}
	return problems
}

// awaitSeek polls the flow's status until the seek has completed or the bound passes, and
// returns the last seek status read.
func (w *world) awaitSeek(ctx context.Context, name, id string, bound time.Duration) (*subflowv1.SeekStatus, error) {
	deadline := time.Now().Add(bound)
	for {
		flow := &subflowv1.SubscriptionFlow{}
		if err := w.k8s.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, flow); err != nil {
			return nil, err
		}
		s := flow.Status.Seek
		if (s != nil && s.ID == id && s.CompletionTime != nil) || time.Now().After(deadline) || ctx.Err() != nil {
			return s, nil
		}
		_ = sleepUntil(ctx, time.Now().Add(250*time.Millisecond))
	}
}

// checkFlows checks the FLOWs the consumers sent, as the wire recorder saw them: after a pause
// took effect (plus flowGrace) a consumer sends no FLOW, except the initial grant of a
// re-subscribe after a reconnect, and with chunked messages the README's bound for agents and
// single permits up to sidecar.MaxChunkGrants per pause for sidecars; after a stop, none at
// all. A FLOW sent after its subscription's CLOSE_CONSUMER is left out: the broker ignores it.
func (w *world) checkFlows(rep *Report) {
	chunkPermits := map[pausedSpan]uint32{}
	sidecarChunkGrants := map[pausedSpan]int{}
	for _, g := range w.groups {
		for _, topic := range g.topics {
			for _, f := range w.wire.Flows(wirerec.Filter{Topic: w.root + topic, Subscription: g.subscription}) {
				if f.AfterClose {
					continue
				}
				rep.FlowsChecked++
				iv, life, ok := w.mon.stateAt(f.Consumer.Name, f.Consumer.Topic, f.Time)
				if ok && life.sidecar {
					rep.SidecarFlowsChecked++
				}
				if !ok || iv.state == protocol.Running || f.Time.Before(iv.from.Add(flowGrace)) {
					continue
				}
				rep.FlowsWhileGated++
				if g.chunked && iv.state == protocol.Paused && !life.sidecar {
					chunkPermits[pausedSpan{f.Consumer.Name, iv}] += f.Permits // checked against the bound below
					continue
				}
				if g.chunked && iv.state == protocol.Paused && f.Permits == 1 {
					sidecarChunkGrants[pausedSpan{f.Consumer.Name, iv}]++ // the sidecar completing a begun chunked message
					continue
				}
				if w.flowAllowed(g, iv, life, f.Time, f.Permits) {
					continue
				}
				w.violateAt("flow-permits", fmt.Sprintf("FLOW(%d) from %s on %s, %s after it became %s (grant %d, sidecar %v)",
					f.Permits, f.Consumer.Name, f.Consumer.Topic, f.Time.Sub(iv.from).Round(time.Millisecond), iv.state, life.group.grant(), life.sidecar), f.Time)
			}
		}
	}
	for span, permits := range chunkPermits {
		if bound := chunkedPauseBound(span.iv, w.cfg.Converge); permits > bound {
			w.violateAt("flow-permits", fmt.Sprintf("%d FLOW permits from %s while paused from %s for %s: more than the chunked bound %d",
				permits, span.consumer, span.iv.from.Format(time.RFC3339Nano), span.iv.to.Sub(span.iv.from).Round(time.Millisecond), bound), span.iv.from)
		}
	}
	for span, grants := range sidecarChunkGrants {
		if grants > sidecar.MaxChunkGrants {
			w.violateAt("flow-permits", fmt.Sprintf("%d single-permit FLOWs from sidecar consumer %s while paused from %s: more than the %d a pause grants to complete chunked messages",
				grants, span.consumer, span.iv.from.Format(time.RFC3339Nano), sidecar.MaxChunkGrants), span.iv.from)
		}
	}
	if err := w.wire.Check(); err != nil {
		w.violate("wire", err.Error())
	}
}

// pausedSpan is one consumer's paused interval.
type pausedSpan struct {
	consumer string
	iv       interval
}

// chunkedPauseBound is the README's bound on the FLOW permits a consumer of chunked messages
// sends while paused for the interval: per session (the one in place at the pause, and each
// renewal every half expiry) (Q + P)·(K − 1), plus each renewal's initial grant Q; Q the
// receiver queue, K the chunks of the largest message, P the messages partly received when
// the broker stops (at most one per producer session: two, around a fault). An interval still
// open at the end counts until the run's convergence bound.
func chunkedPauseBound(iv interval, open time.Duration) uint32 {
	const queue, chunks, partial = 4, 3, 2
	length := open
	if !iv.to.IsZero() {
		length = iv.to.Sub(iv.from)
	}
	renewals := uint32(2 * length / chunkExpiry)
	return (1+renewals)*(queue+partial)*(chunks-1) + renewals*queue
}

// subscribeBound is how long a subscribe may take (the clients' operation timeout): a
// consumer leaving Stopped subscribes, and sends its initial grant, before the agent records
// the new state.
const subscribeBound = 10 * time.Second

// flowAllowed decides on a FLOW sent at t while the consumer was Paused or Stopped since
// iv.from (plus flowGrace). A transition happens before its state is recorded, so the end of
// the interval belongs to the next state: a resume may return permits in its last flowGrace,
// and a stopped consumer sends its initial grant when it subscribes again. Otherwise only the
// initial grant of a re-subscribe after a reconnect may come while paused. A sidecar forwards
// no FLOW at all while not Running: leaving Stopped it subscribes again and then grants what
// the client is owed (any number), and a client's re-subscribe meets the rules' state first.
func (w *world) flowAllowed(g *group, iv interval, life *consumerLife, t time.Time, permits uint32) bool {
	ending := func(d time.Duration) bool { return !iv.to.IsZero() && !t.Before(iv.to.Add(-d)) }
	grant := life.group.grant()
	switch {
	case iv.state == protocol.Stopped && life.sidecar:
		return ending(subscribeBound)
	case iv.state == protocol.Stopped:
		return permits == grant && ending(subscribeBound)
	case iv.state == protocol.Paused && life.sidecar:
		return ending(flowGrace)
	case iv.state == protocol.Paused:
		return ending(flowGrace) ||
			(permits == grant && w.reconnectBetween(g.subscription, iv.from.Add(-flowGrace), t))
	}
	return true
}

// reconnectBetween reports a broker fault, or a reset of the subscription's cursor (which
// disconnects its consumers), within [from, to].
func (w *world) reconnectBetween(subscription string, from, to time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	in := func(t time.Time) bool { return !t.Before(from) && !t.After(to) }
	for _, t := range w.events {
		if in(t) {
			return true
		}
	}
	for _, r := range w.resets {
		if r.Subscription == subscription && in(r.At) {
			return true
		}
	}
	return false
}
