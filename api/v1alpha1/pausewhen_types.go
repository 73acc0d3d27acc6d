package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// MaxPauseConditions bounds spec.pauseWhen.
const MaxPauseConditions = 8

// SourceCondition means a spec.pauseWhen condition decided: it holds, and so the flow is Paused.
const SourceCondition StateSource = "Condition"

// ConditionAutoPaused is True while a spec.pauseWhen condition holds; its message names the
// condition and what was seen.
const ConditionAutoPaused = "AutoPaused"

// Reasons of the AutoPaused condition.
const (
	// ReasonConditionHolds: a condition holds (the flow pauses unless an override or a Stopped
	// state says otherwise).
	ReasonConditionHolds = "ConditionHolds"
	// ReasonNoConditionHolds: every condition was evaluated and none holds.
	ReasonNoConditionHolds = "NoConditionHolds"
)

// OnErrorPolicy is what a condition does when its source cannot be read.
// +kubebuilder:validation:Enum=Hold;Pause;Run
type OnErrorPolicy string

const (
	// OnErrorHold keeps the condition as it is (before any reading: not holding).
	OnErrorHold OnErrorPolicy = "Hold"
	// OnErrorPause takes a reading that failed as the dependency unhealthy.
	OnErrorPause OnErrorPolicy = "Pause"
	// OnErrorRun takes a reading that failed as the dependency healthy.
	OnErrorRun OnErrorPolicy = "Run"
)

// PauseCondition is one reason for a flow to pause itself: while it holds, a Running flow is
// Paused (a Stopped one stays Stopped, and the override annotation still wins). Set exactly one
// source: kubernetes, prometheus, http or backlog.
// +kubebuilder:validation:XValidation:rule="[has(self.kubernetes), has(self.prometheus), has(self.http), has(self.backlog)].filter(x, x).size() == 1",message="set exactly one source: kubernetes, prometheus, http or backlog"
type PauseCondition struct {
	// name identifies the condition in status, events and metrics.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// kubernetes holds while a condition of an object in the flow's namespace has a status,
	// e.g. a Deployment's Available is False.
	// +optional
	Kubernetes *ObjectConditionSource `json:"kubernetes,omitempty"`

	// prometheus holds while a PromQL query, run on the Prometheus the controller is
	// configured with, is above or below a threshold.
	// +optional
	Prometheus *PrometheusSource `json:"prometheus,omitempty"`

	// http holds while a Service in the flow's namespace answers an HTTP GET with a status
	// outside the healthy range, or does not answer in time (as a kubelet's probe judges).
	// +optional
	HTTP *HTTPSource `json:"http,omitempty"`

	// backlog holds while another subscription on the flow's topics has more messages waiting
	// than a threshold: a low-priority consumer gives way while a high-priority one lags. One
	// agent of the flow's pods reads it from the broker's admin API (an agent of protocol 3 or
	// later), so the figures may lag by that agent's refresh period (30s by default).
	// +optional
	Backlog *BacklogSource `json:"backlog,omitempty"`

	// interval is how often the source is read; at least 1s. Defaults to 10s.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('1h')",message="interval must be from 1s to 1h"
	Interval *metav1.Duration `json:"interval,omitempty"`

	// for is how long the source must say unhealthy before the condition holds. Defaults to 0:
	// the first unhealthy reading pauses.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('24h')",message="for must be at most 24h"
	For *metav1.Duration `json:"for,omitempty"`

	// resumeAfter is how long the source must say healthy before the condition stops holding;
	// at least 10s, the least time a condition holds, which bounds flapping. Defaults to 30s.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('10s') && duration(self) <= duration('24h')",message="resumeAfter must be from 10s to 24h"
	ResumeAfter *metav1.Duration `json:"resumeAfter,omitempty"`

	// onError is what a reading the source could not give means: Hold keeps the condition as
	// it is, Pause takes it as unhealthy, Run as healthy. A missing series, a NaN, an object
	// or condition that is not there, an unreachable server are such readings.
	// +optional
	// +kubebuilder:default=Hold
	OnError OnErrorPolicy `json:"onError,omitempty"`
}

// ObjectConditionSource is a status condition of an object in the flow's namespace.
type ObjectConditionSource struct {
	// apiVersion of the object, e.g. apps/v1.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	APIVersion string `json:"apiVersion"`

	// kind of the object, e.g. Deployment.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Kind string `json:"kind"`

	// name of the object, in the flow's namespace.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// conditionType is the type of the condition in the object's status.conditions, e.g. Available.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=316
	ConditionType string `json:"conditionType"`

	// status of that condition while the dependency is unhealthy.
	// +required
	// +kubebuilder:validation:Enum=True;False;Unknown
	Status string `json:"status"`
}

// PrometheusSource is a PromQL instant query that must return one sample, and the thresholds
// it is judged by: set above (unhealthy above it) or below (unhealthy below it), and optionally
// the threshold at which it is healthy again (hysteresis).
// +kubebuilder:validation:XValidation:rule="has(self.above) != has(self.below)",message="set exactly one of above or below"
// +kubebuilder:validation:XValidation:rule="!has(self.resumeBelow) || has(self.above)",message="resumeBelow goes with above"
// +kubebuilder:validation:XValidation:rule="!has(self.resumeAbove) || has(self.below)",message="resumeAbove goes with below"
type PrometheusSource struct {
	// query in PromQL, e.g. max(pg_replication_lag_seconds{cluster="orders"}).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	Query string `json:"query"`

	// above: the dependency is unhealthy while the value is greater.
	// +optional
	Above *resource.Quantity `json:"above,omitempty"`

	// resumeBelow: healthy again once the value is at or below it (default: above).
	// +optional
	ResumeBelow *resource.Quantity `json:"resumeBelow,omitempty"`

	// below: the dependency is unhealthy while the value is smaller.
	// +optional
	Below *resource.Quantity `json:"below,omitempty"`

	// resumeAbove: healthy again once the value is at or above it (default: below).
	// +optional
	ResumeAbove *resource.Quantity `json:"resumeAbove,omitempty"`
}

// BacklogSource is the backlog of another subscription on the flow's topics (summed over the
// topic's partitions, or over the topics the flow's consumers name when spec.topic is empty),
// in messages, with the threshold it is judged by and the one at which it is healthy again.
// +kubebuilder:validation:XValidation:rule="!has(self.resumeBelow) || self.resumeBelow <= self.above",message="resumeBelow must not exceed above"
type BacklogSource struct {
	// subscription whose backlog is read; not the flow's own (pausing it would grow the
	// backlog that keeps it paused).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="!self.matches('[\\x00-\\x1f\\x7f]')",message="subscription must not hold control characters"
	Subscription string `json:"subscription"`

	// above: the dependency is unhealthy while more messages than this wait.
	// +required
	// +kubebuilder:validation:Minimum=0
	Above int64 `json:"above"`

	// resumeBelow: healthy again once at most this many messages wait (default: above).
	// +optional
	// +kubebuilder:validation:Minimum=0
	ResumeBelow *int64 `json:"resumeBelow,omitempty"`
}

// HTTPSource is a probe of a Service in the flow's namespace: an HTTP GET of path on one of its
// ports, at its cluster IP. Only the status code is read; redirects are not followed. A Service
// that is not there, has no cluster IP (headless) or is an ExternalName is an error (onError
// decides): the controller calls only Services' cluster IPs, never a host a flow names.
// +kubebuilder:validation:XValidation:rule="!has(self.healthyStatus) || self.healthyStatus.min <= self.healthyStatus.max",message="healthyStatus.min must not exceed healthyStatus.max"
type HTTPSource struct {
	// service is the Service probed.
	// +required
	Service HTTPServiceReference `json:"service"`

	// scheme is HTTP or HTTPS; HTTPS is not verified, as a kubelet's probes do not verify it.
	// Defaults to HTTP.
	// +optional
	// +kubebuilder:validation:Enum=HTTP;HTTPS
	// +kubebuilder:default=HTTP
	Scheme string `json:"scheme,omitempty"`

	// healthyStatus is the range of status codes that mean healthy. Defaults to 200-399, as a
	// kubelet's probes judge.
	// +optional
	HealthyStatus *StatusRange `json:"healthyStatus,omitempty"`

	// timeout bounds the probe: no answer in time is unhealthy. Defaults to 1s; at most 5s,
	// and never more than the interval.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('10ms') && duration(self) <= duration('5s')",message="timeout must be from 10ms to 5s"
	Timeout *metav1.Duration `json:"timeout,omitempty"`
}

// HTTPServiceReference names a Service in the flow's namespace, one of its ports and a path.
type HTTPServiceReference struct {
	// name of the Service.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// port of the Service: its number, or its name.
	// +required
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? (self >= 1 && self <= 65535) : (self.size() >= 1 && self.size() <= 63)",message="port must be a number from 1 to 65535 or a port name"
	Port intstr.IntOrString `json:"port"`

	// path of the GET, with its query if any. Defaults to /.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^/[^\s]*$`
	// +kubebuilder:default=/
	Path string `json:"path,omitempty"`
}

// StatusRange is a range of HTTP status codes, both ends included.
type StatusRange struct {
	// min is the lowest healthy status code.
	// +required
	// +kubebuilder:validation:Minimum=100
	// +kubebuilder:validation:Maximum=599
	Min int32 `json:"min"`
	// max is the highest healthy status code.
	// +required
	// +kubebuilder:validation:Minimum=100
	// +kubebuilder:validation:Maximum=599
	Max int32 `json:"max"`
}

// PauseConditionStatus is what the controller last saw of one spec.pauseWhen condition.
type PauseConditionStatus struct {
	// name of the condition.
	Name string `json:"name"`
	// holds is whether the condition pauses the flow.
	Holds bool `json:"holds"`
	// since is when holds last changed (restored by a restarted controller).
	// +optional
	Since *metav1.Time `json:"since,omitempty"`
	// seen is the reading that decided holds (before any decision, the first reading):
	// Available=False, a query's value. The latest value of a query is a metric
	// (subflow_pause_condition_value), not written here at every reading.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Seen string `json:"seen,omitempty"`
	// error says why the latest reading failed.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Error string `json:"error,omitempty"`
}
