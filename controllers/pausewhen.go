package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/controllers/pausewhen"
)

// Defaults of a spec.pauseWhen condition.
const (
	DefaultConditionInterval    = 10 * time.Second
	DefaultConditionResumeAfter = 30 * time.Second
	// maxConditionRead bounds one reading of a source: a hanging Prometheus or API server must
	// not hold a reconcile worker.
	maxConditionRead = 5 * time.Second
	// DefaultProbeTimeout bounds an http condition's probe when it says nothing.
	DefaultProbeTimeout = time.Second
)

var (
	pauseConditionHolds = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "subflow_pause_condition_holds",
		Help: "1 while the flow's spec.pauseWhen condition holds (it pauses the flow), else 0.",
	}, []string{"namespace", "name", "condition"})
	pauseConditionEvaluated = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "subflow_pause_condition_last_evaluation_timestamp_seconds",
		Help: "When the flow's spec.pauseWhen condition's source was last read (Unix time).",
	}, []string{"namespace", "name", "condition"})
	pauseConditionValue = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "subflow_pause_condition_value",
		Help: "The last value a spec.pauseWhen condition's source returned: a prometheus query's value, a backlog's messages, an http probe's status code.",
	}, []string{"namespace", "name", "condition"})
	pauseConditionErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "subflow_pause_condition_errors_total",
		Help: "Readings of the flow's spec.pauseWhen condition that its source could not give (onError decides what they mean).",
	}, []string{"namespace", "name", "condition"})
)

func init() {
	metrics.Registry.MustRegister(pauseConditionHolds, pauseConditionEvaluated, pauseConditionValue, pauseConditionErrors)
}

// A kubernetes condition names an object the controller reads with get, one at a time: by
// default it may read Deployments and StatefulSets, the dependencies users name most; the
// chart's pauseWhen.readableResources grants more (a database operator's clusters), and a
// condition on a kind it may not read says so in its error. An http condition gets the Service
// it probes, for its cluster IP and port.
// +kubebuilder:rbac:groups=apps,resources=deployments;statefulsets,verbs=get
// +kubebuilder:rbac:groups="",resources=services,verbs=get

// Conditions evaluates the flows' spec.pauseWhen: it reads their sources (sharing a reading
// between flows asking the same within an interval) and feeds one tracker per flow and
// condition, kept in the flow's memory, whose decisions go into status.pauseWhen, from which
// EffectiveState reads them.
type Conditions struct {
	// Reader reads the objects that kubernetes conditions name (the API server; a Forbidden
	// answer tells which permission the controller lacks).
	Reader client.Reader
	// Prometheus runs prometheus conditions' queries; nil when the controller has none
	// configured (--prometheus-url): such conditions read as errors.
	Prometheus *pausewhen.Prometheus
	// Prober sends http conditions' probes (one that dials directly when nil).
	Prober *pausewhen.Prober

	proberOnce sync.Once
	readings   pausewhen.Readings
}

// flowConditions are the trackers of one flow's conditions, by name (flowMemory.conditions).
// A tracker is changed only by its flow's reconcile, one at a time.
type flowConditions struct {
	uid      types.UID // a flow deleted and created again under its name starts afresh
	trackers map[string]*conditionTracker
}

type conditionTracker struct {
	pausewhen.Tracker
	// evaluated is when the source was last read for this flow.
	evaluated time.Time
}

// conditionOutcome is what one evaluation of a flow's conditions found.
type conditionOutcome struct {
	// statuses go into status.pauseWhen, in spec order.
	statuses []subflowv1.PauseConditionStatus
	// changed are the conditions whose decision changed now, with what the tracker says.
	changed []string
	// next is when a condition must be evaluated again (zero: no condition).
	next time.Time
	// descriptions say, per condition, what it decided and why.
	descriptions []string
}

// evaluate reads the sources of the flow's conditions that are due at now and returns each
// condition's status. A condition not known in this process starts from what status says
// (a controller that restarts keeps a pause its predecessor decided).
func (cs *Conditions) evaluate(ctx context.Context, flow *subflowv1.SubscriptionFlow, mem *memory, now time.Time) conditionOutcome {
	var out conditionOutcome
	conds := flow.Spec.PauseWhen
	trackers := make([]*conditionTracker, len(conds))
	readings := make([]*pausewhen.Reading, len(conds))
	// The due conditions are read together: one after the other, a flow's reconcile would
	// last the sum of its reads (up to 8 x 5 s with its sources hanging).
	var reads sync.WaitGroup
	for i, cond := range conds {
		trackers[i] = mem.tracker(flow, cond)
		interval := durationOr(cond.Interval, DefaultConditionInterval)
		if due(trackers[i].evaluated, interval, now) {
			reads.Go(func() { r := cs.read(ctx, flow, mem, cond, interval, now); readings[i] = &r })
		}
	}
	reads.Wait()
	for i, cond := range conds {
		t := trackers[i]
		if r := readings[i]; r != nil {
			t.evaluated = now
			if t.Observe(*r) {
				out.changed = append(out.changed, t.Describe(cond.Name))
			}
			recordConditionMetrics(flow, cond.Name, cond.Prometheus != nil || cond.HTTP != nil || cond.Backlog != nil, t, *r)
		}
		// A run under way completes at a reading, so the next reading is the next change.
		next := t.evaluated.Add(durationOr(cond.Interval, DefaultConditionInterval))
		if out.next.IsZero() || next.Before(out.next) {
			out.next = next
		}
		out.statuses = append(out.statuses, conditionStatus(cond.Name, t))
		out.descriptions = append(out.descriptions, t.Describe(cond.Name))
	}
	mem.forgetRemovedConditions(flow)
	return out
}

// due reports whether a condition last read at evaluated is to be read at now: after its
// interval, at once when never read, or when the clock went back (an NTP step) past the last
// reading.
func due(evaluated time.Time, interval time.Duration, now time.Time) bool {
	return evaluated.IsZero() || !now.Before(evaluated.Add(interval)) || now.Before(evaluated)
}

// tracker returns the flow's tracker of cond, made from status when this process has none,
// with cond's policy as the spec says it now.
func (m *memory) tracker(flow *subflowv1.SubscriptionFlow, cond subflowv1.PauseCondition) *conditionTracker {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.flowLocked(flowKey(flow), true)
	if f.conditions.uid != flow.UID || f.conditions.trackers == nil {
		// A flow deleted and created again under its name starts afresh.
		f.conditions = flowConditions{uid: flow.UID, trackers: map[string]*conditionTracker{}}
	}
	t, ok := f.conditions.trackers[cond.Name]
	if !ok {
		t = &conditionTracker{}
		for _, st := range flow.Status.PauseWhen {
			if st.Name == cond.Name && st.Since != nil {
				t.Restore(st.Holds, st.Since.Time)
			}
		}
		f.conditions.trackers[cond.Name] = t
	}
	t.Policy = pausewhen.Policy{For: durationOr(cond.For, 0), ResumeAfter: durationOr(cond.ResumeAfter, DefaultConditionResumeAfter),
		OnError: pausewhen.OnError(cond.OnError)}
	return t
}

// forgetRemovedConditions drops the trackers of conditions the flow no longer has.
func (m *memory) forgetRemovedConditions(flow *subflowv1.SubscriptionFlow) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.flowLocked(flowKey(flow), false)
	if f == nil {
		return
	}
	if f.conditions.uid != flow.UID {
		f.conditions = flowConditions{} // of a flow deleted and created again under its name
		return
	}
	for name := range f.conditions.trackers {
		if !slices.ContainsFunc(flow.Spec.PauseWhen, func(c subflowv1.PauseCondition) bool { return c.Name == name }) {
			delete(f.conditions.trackers, name)
			forgetConditionMetrics(flow.Namespace, flow.Name, name)
		}
	}
}

// keepBacklogFigures records what the flow's watching agent answered, for the next reading of
// its backlog conditions; a flow without them keeps nothing.
func (m *memory) keepBacklogFigures(flow *subflowv1.SubscriptionFlow, figures pausewhen.BacklogFigures) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(backlogSubscriptions(flow)) == 0 {
		if f := m.flowLocked(flowKey(flow), false); f != nil {
			f.backlog = nil
		}
		return
	}
	m.flowLocked(flowKey(flow), true).backlog = &figures
}

func (m *memory) backlogFigures(flow *subflowv1.SubscriptionFlow) pausewhen.BacklogFigures {
	m.mu.Lock()
	defer m.mu.Unlock()
	if f := m.flowLocked(flowKey(flow), false); f != nil && f.backlog != nil {
		return *f.backlog
	}
	return pausewhen.BacklogFigures{Missing: "no agent has been asked yet"}
}

// read takes a reading of cond's source, shared with every flow that asks the same within
// interval (a backlog is the flow's own agent's answer, read from memory).
func (cs *Conditions) read(ctx context.Context, flow *subflowv1.SubscriptionFlow, mem *memory, cond subflowv1.PauseCondition,
	interval time.Duration, now time.Time) pausewhen.Reading {
	ctx, cancel := context.WithTimeout(ctx, min(interval, maxConditionRead))
	defer cancel()
	namespace := flow.Namespace
	switch {
	case cond.Backlog != nil:
		return backlogSourceOf(cond.Backlog).Judge(mem.backlogFigures(flow), backlogStaleAfter(interval), now)
	case cond.Kubernetes != nil:
		src := pausewhen.ObjectCondition{APIVersion: cond.Kubernetes.APIVersion, Kind: cond.Kubernetes.Kind, Namespace: namespace,
			Name: cond.Kubernetes.Name, ConditionType: cond.Kubernetes.ConditionType, Status: cond.Kubernetes.Status}
		r := cs.readings.Get(ctx, src.Key(), interval, func(ctx context.Context) pausewhen.Reading { return src.Read(ctx, cs.Reader, now) })
		if apierrors.IsForbidden(r.Err) {
			r.Err = fmt.Errorf("the controller may not read %s %s: grant its ServiceAccount get on them (chart value pauseWhen.readableResources): %w",
				cond.Kubernetes.Kind, cond.Kubernetes.APIVersion, r.Err)
		}
		return r
	case cond.Prometheus != nil:
		q := pausewhen.Query{PromQL: cond.Prometheus.Query, Thresholds: thresholdsOf(cond.Prometheus)}
		// The value is shared between the flows that ask the same query; each judges it by its
		// own thresholds.
		shared := cs.readings.Get(ctx, q.Key(), interval, func(ctx context.Context) pausewhen.Reading { return q.Read(ctx, cs.Prometheus, now) })
		return q.Thresholds.Rejudge(shared)
	case cond.HTTP != nil:
		probe := probeOf(namespace, cond.HTTP, interval)
		// The answer is shared between the flows that probe the same; each judges its status by
		// its own range.
		shared := cs.readings.Get(ctx, probe.Key(), interval, func(ctx context.Context) pausewhen.Reading {
			return probe.Read(ctx, cs.Reader, cs.prober(), now)
		})
		return probe.Healthy.Judge(shared)
	}
	return pausewhen.Reading{Verdict: pausewhen.Unknown, Err: errors.New("no source"), At: now}
}

func (cs *Conditions) prober() *pausewhen.Prober {
	cs.proberOnce.Do(func() {
		if cs.Prober == nil {
			cs.Prober = pausewhen.NewProber(nil)
		}
	})
	return cs.Prober
}

// probeOf is the probe an http condition asks for, with the defaults applied; its timeout is
// never more than the interval.
func probeOf(namespace string, h *subflowv1.HTTPSource, interval time.Duration) pausewhen.Probe {
	p := pausewhen.Probe{Namespace: namespace, Service: h.Service.Name, Port: h.Service.Port, Path: h.Service.Path,
		HTTPS: h.Scheme == "HTTPS", Timeout: min(durationOr(h.Timeout, DefaultProbeTimeout), interval, maxConditionRead),
		Healthy: pausewhen.DefaultHealthy}
	if p.Path == "" {
		p.Path = "/"
	}
	if h.HealthyStatus != nil {
		p.Healthy = pausewhen.StatusRange{Min: int(h.HealthyStatus.Min), Max: int(h.HealthyStatus.Max)}
	}
	return p
}

// backlogStaleAfter is how old a backlog figure may be: the agent reads it again every
// protocol.DefaultBacklogRefresh, and the controller asks at every interval. (The agent's
// clock stamps the figures: a node's clock more than this off the controller's reads stale.)
func backlogStaleAfter(interval time.Duration) time.Duration {
	return 2 * max(interval, protocol.DefaultBacklogRefresh)
}

func backlogSourceOf(b *subflowv1.BacklogSource) pausewhen.Backlog {
	above := float64(b.Above)
	t := pausewhen.Thresholds{Above: &above}
	if b.ResumeBelow != nil {
		resume := float64(*b.ResumeBelow)
		t.ResumeBelow = &resume
	}
	return pausewhen.Backlog{Subscription: b.Subscription, Thresholds: t}
}

func thresholdsOf(p *subflowv1.PrometheusSource) pausewhen.Thresholds {
	f := func(q interface{ AsApproximateFloat64() float64 }) *float64 { v := q.AsApproximateFloat64(); return &v }
	var t pausewhen.Thresholds
	if p.Above != nil {
		t.Above = f(p.Above)
	}
	if p.ResumeBelow != nil {
		t.ResumeBelow = f(p.ResumeBelow)
	}
	if p.Below != nil {
		t.Below = f(p.Below)
	}
	if p.ResumeAbove != nil {
		t.ResumeAbove = f(p.ResumeAbove)
	}
	return t
}

func conditionStatus(name string, t *conditionTracker) subflowv1.PauseConditionStatus {
	// What decided, not every reading: a query's value changes at every interval, and a status
	// write per flow and interval would load the API server for nothing (the latest value is a
	// metric).
	st := subflowv1.PauseConditionStatus{Name: name, Holds: t.Tripped(), Seen: clip(t.Decided().Seen, 256)}
	if s := t.Since(); !s.IsZero() {
		st.Since = &metav1.Time{Time: s}
	}
	if err := t.Last().Err; err != nil {
		st.Error = clip(err.Error(), 1024)
	}
	return st
}

func durationOr(d *metav1.Duration, fallback time.Duration) time.Duration {
	if d == nil {
		return fallback
	}
	return d.Duration
}

// holding names the flow's conditions that hold, as status.pauseWhen records them.
func holding(flow *subflowv1.SubscriptionFlow) []string {
	var names []string
	for _, st := range flow.Status.PauseWhen {
		if st.Holds && slices.ContainsFunc(flow.Spec.PauseWhen, func(c subflowv1.PauseCondition) bool { return c.Name == st.Name }) {
			names = append(names, st.Name)
		}
	}
	return names
}

// setAutoPausedCondition says whether a condition pauses the flow, naming it and what was
// seen; a flow without conditions has no AutoPaused condition.
func setAutoPausedCondition(st *subflowv1.SubscriptionFlowStatus, flow *subflowv1.SubscriptionFlow, descriptions []string) {
	if len(flow.Spec.PauseWhen) == 0 {
		meta.RemoveStatusCondition(&st.Conditions, subflowv1.ConditionAutoPaused)
		return
	}
	var holds []string
	for i, st := range st.PauseWhen {
		if st.Holds && i < len(descriptions) {
			holds = append(holds, descriptions[i])
		}
	}
	if len(holds) > 0 {
		msg := strings.Join(holds, "; ")
		if st.EffectiveState != subflowv1.StatePaused || st.StateSource != subflowv1.SourceCondition {
			msg += fmt.Sprintf(" (the flow is %s by %s, which wins)", st.EffectiveState, st.StateSource)
		}
		setCondition(st, subflowv1.ConditionAutoPaused, metav1.ConditionTrue, subflowv1.ReasonConditionHolds, fit(maxConditionMessage, "; ", msg))
		return
	}
	setCondition(st, subflowv1.ConditionAutoPaused, metav1.ConditionFalse, subflowv1.ReasonNoConditionHolds,
		fit(maxConditionMessage, "; ", strings.Join(descriptions, "; ")))
}

func recordConditionMetrics(flow *subflowv1.SubscriptionFlow, name string, numeric bool, t *conditionTracker, r pausewhen.Reading) {
	holds := 0.0
	if t.Tripped() {
		holds = 1
	}
	pauseConditionHolds.WithLabelValues(flow.Namespace, flow.Name, name).Set(holds)
	pauseConditionEvaluated.WithLabelValues(flow.Namespace, flow.Name, name).Set(float64(r.At.Unix()))
	if r.Err != nil {
		pauseConditionErrors.WithLabelValues(flow.Namespace, flow.Name, name).Inc()
	} else if numeric {
		pauseConditionValue.WithLabelValues(flow.Namespace, flow.Name, name).Set(r.Value)
	}
}

func forgetConditionMetrics(namespace, name, condition string) {
	for _, v := range []*prometheus.GaugeVec{pauseConditionHolds, pauseConditionEvaluated, pauseConditionValue} {
		v.DeleteLabelValues(namespace, name, condition)
	}
	pauseConditionErrors.DeleteLabelValues(namespace, name, condition)
}
