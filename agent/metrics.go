package agent

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/subflow-dev/subflow/agent/protocol"
)

var consumerLabelNames = []string{"topic", "subscription", "consumer"}

// metrics are the agent's Prometheus collectors, shared by its consumers.
type metrics struct {
	state               *prometheus.GaugeVec
	held                *prometheus.GaugeVec
	receivedWhilePaused *prometheus.CounterVec
	transitions         *prometheus.CounterVec
	seekProbes          prometheus.Counter
	seeks               *prometheus.CounterVec
	deferredNacks       *prometheus.GaugeVec
	duplicatesDropped   *prometheus.CounterVec
	nacksOverflow       prometheus.Counter
	chunkRenewals       prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "subflow_agent_consumer_state",
			Help: "1 for the state the consumer is in (Running, Paused, Stopped), 0 for the others.",
		}, append(consumerLabelNames, "state")),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "subflow_agent_held_messages",
			Help: "Messages taken from the client while the gate closed, delivered first on resume.",
		}, consumerLabelNames),
		receivedWhilePaused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "subflow_agent_received_while_paused_total",
			Help: "Messages the client handed to the gate while it was closed.",
		}, consumerLabelNames),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "subflow_agent_state_transitions_total",
			Help: "State changes of consumers, by the state entered.",
		}, append(consumerLabelNames, "state")),
		seekProbes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "subflow_agent_seek_probes_total",
			Help: "Admin API calls made to resolve seek indexes.",
		}),
		seeks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "subflow_agent_seeks_total",
			Help: "Seeks by index, by result (Completed, Failed).",
		}, []string{"result"}),
		deferredNacks: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "subflow_agent_deferred_nacks",
			Help: "Nacks the agent keeps: made while paused, or waiting for their redelivery delay to pass while running.",
		}, consumerLabelNames),
		duplicatesDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "subflow_agent_redelivered_duplicates_dropped_total",
			Help: "Broker redeliveries of messages the gate held and delivered, dropped so the application gets them once.",
		}, consumerLabelNames),
		nacksOverflow: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "subflow_agent_nacks_not_deferred_total",
			Help: "Nacks made while paused that exceeded the deferral bound and went to the client at once.",
		}),
		chunkRenewals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "subflow_agent_chunk_renewals_total",
			Help: "Fresh subscriptions of paused consumers of chunked messages, made before the client could expire (and acknowledge) incomplete ones.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	m.state = register(reg, m.state, &err)
	m.held = register(reg, m.held, &err)
	m.receivedWhilePaused = register(reg, m.receivedWhilePaused, &err)
	m.transitions = register(reg, m.transitions, &err)
	m.seekProbes = register(reg, m.seekProbes, &err)
	m.seeks = register(reg, m.seeks, &err)
	m.deferredNacks = register(reg, m.deferredNacks, &err)
	m.duplicatesDropped = register(reg, m.duplicatesDropped, &err)
	m.nacksOverflow = register(reg, m.nacksOverflow, &err)
	m.chunkRenewals = register(reg, m.chunkRenewals, &err)
	return m, err
}

// register registers c, or returns the collector already registered under its name so that
// several agents can share a registry.
func register[C prometheus.Collector](reg prometheus.Registerer, c C, errp *error) C {
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var already prometheus.AlreadyRegisteredError
	if errors.As(err, &already) {
		if existing, ok := already.ExistingCollector.(C); ok {
			return existing
		}
	}
	*errp = errors.Join(*errp, err)
	return c
}

// consumerMetrics are one consumer's children of the shared collectors.
type consumerMetrics struct {
	m                   *metrics
	labels              []string
	held                prometheus.Gauge
	receivedWhilePaused prometheus.Counter
	deferredNacks       prometheus.Gauge
	duplicatesDropped   prometheus.Counter
}

func (m *metrics) forConsumer(topic, subscription, name string) consumerMetrics {
	labels := []string{topic, subscription, name}
	cm := consumerMetrics{
		m:                   m,
		labels:              labels,
		held:                m.held.WithLabelValues(labels...),
		receivedWhilePaused: m.receivedWhilePaused.WithLabelValues(labels...),
		deferredNacks:       m.deferredNacks.WithLabelValues(labels...),
		duplicatesDropped:   m.duplicatesDropped.WithLabelValues(labels...),
	}
	cm.setState("", protocol.Stopped)
	return cm
}

func (cm consumerMetrics) withState(s protocol.State) []string {
	return append(append([]string(nil), cm.labels...), string(s))
}

// setState moves the state gauge and counts the transition.
func (cm consumerMetrics) setState(from, to protocol.State) {
	for _, s := range []protocol.State{protocol.Running, protocol.Paused, protocol.Stopped} {
		v := 0.0
		if s == to {
			v = 1
		}
		cm.m.state.WithLabelValues(cm.withState(s)...).Set(v)
	}
	if from != "" {
		cm.m.transitions.WithLabelValues(cm.withState(to)...).Inc()
	}
}

// delete removes the consumer's series once it is closed.
func (cm consumerMetrics) delete() {
	for _, s := range []protocol.State{protocol.Running, protocol.Paused, protocol.Stopped} {
		cm.m.state.DeleteLabelValues(cm.withState(s)...)
		cm.m.transitions.DeleteLabelValues(cm.withState(s)...)
	}
	cm.m.held.DeleteLabelValues(cm.labels...)
	cm.m.receivedWhilePaused.DeleteLabelValues(cm.labels...)
	cm.m.deferredNacks.DeleteLabelValues(cm.labels...)
	cm.m.duplicatesDropped.DeleteLabelValues(cm.labels...)
}
