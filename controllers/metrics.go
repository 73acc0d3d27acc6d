package controllers

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Controller metrics, registered with controller-runtime's registry (served on /metrics).
var (
	flowPaused = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "subflow_flow_paused",
		Help: "1 when the flow's effective state is Paused or Stopped, else 0; alert on pauses left in place.",
	}, []string{"namespace", "name", "state", "source"})
	flowAgents = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "subflow_flow_agents",
		Help: "Agents of the flow's matched pods by observed state (Running, Paused, Stopped, Mixed, Unreachable, NoConsumers, AgentTooOld, TooManyFlows).",
	}, []string{"namespace", "name", "state"})
	pushDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "subflow_agent_push_duration_seconds",
		Help:    "Duration of one push of a flow's desired state to one agent.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
	})
	flowBacklogAtRisk = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "subflow_flow_backlog_at_risk",
		Help: "1 while the flow is halted and the broker's retention will delete waiting messages within the warning lead time (BacklogAtRisk=True), else 0.",
	}, []string{"namespace", "name"})
	pushErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "subflow_agent_push_errors_total",
		Help: "Failed pushes to agents by reason (Unreachable, Unauthorized, StaleRevision, AgentTooOld, TooManyFlows, Rejected).",
	}, []string{"reason"})
)

func init() {
	metrics.Registry.MustRegister(flowPaused, flowAgents, flowBacklogAtRisk, pushDuration, pushErrors)
}

var agentStates = []string{"Running", "Paused", "Stopped", "Mixed", "Unreachable", "NoConsumers", "AgentTooOld", "TooManyFlows"}

// swapPausedSeries remembers the labels of the flow's current paused series (flowMemory) and
// returns the ones before, so that a state change replaces the series without scanning every
// flow's series.
func (m *memory) swapPausedSeries(key types.NamespacedName, labels [2]string) (old [2]string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.flowLocked(key, true)
	old, f.pausedSeries = f.pausedSeries, labels
	return old
}

// recordFlowMetrics publishes one flow's gauges; a flow has exactly one paused series.
func (r *SubscriptionFlowReconciler) recordFlowMetrics(namespace, name, state, source string, agents map[string]int, backlogAtRisk bool) {
	labels := [2]string{state, source}
	if old := r.memory.swapPausedSeries(types.NamespacedName{Namespace: namespace, Name: name}, labels); old != [2]string{} && old != labels {
		flowPaused.DeleteLabelValues(namespace, name, old[0], old[1])
	}
	value := 0.0
	if state != "Running" {
		value = 1
	}
	flowPaused.WithLabelValues(namespace, name, state, source).Set(value)
	for _, s := range agentStates {
		flowAgents.WithLabelValues(namespace, name, s).Set(float64(agents[s]))
	}
	risk := 0.0
	if backlogAtRisk {
		risk = 1
	}
	flowBacklogAtRisk.WithLabelValues(namespace, name).Set(risk)
}

func forgetFlowMetrics(namespace, name string) {
	labels := prometheus.Labels{"namespace": namespace, "name": name}
	flowPaused.DeletePartialMatch(labels)
	flowAgents.DeletePartialMatch(labels)
	flowBacklogAtRisk.DeletePartialMatch(labels)
}
