package v1alpha1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// FlowState is how a subscription flows.
// +kubebuilder:validation:Enum=Running;Paused;Stopped
type FlowState string

const (
	// StateRunning is normal consumption.
	StateRunning FlowState = "Running"
	// StatePaused keeps consumers connected while nothing is handed to the application and no
	// flow permits are granted; the backlog grows on the broker.
	StatePaused FlowState = "Paused"
	// StateStopped closes the consumers; unacked and buffered messages return to the broker.
	StateStopped FlowState = "Stopped"
)

// StateSource tells which input decided the effective state.
// +kubebuilder:validation:Enum=Spec;Window;Condition;Override
type StateSource string

const (
	// SourceSpec means spec.state decided.
	SourceSpec StateSource = "Spec"
	// SourceWindow means an active maintenance window decided.
	SourceWindow StateSource = "Window"
	// SourceOverride means the override annotation decided.
	SourceOverride StateSource = "Override"
	// SourceCondition (pausewhen_types.go): a spec.pauseWhen condition holds.
)

// DeletionPolicy says what happens to the agents' rule when the flow is deleted.
// +kubebuilder:validation:Enum=Resume;Retain
type DeletionPolicy string

const (
	// DeletionResume releases the rule in every agent before the object goes, so consumers run.
	DeletionResume DeletionPolicy = "Resume"
	// DeletionRetain leaves agents in their last state until they restart.
	DeletionRetain DeletionPolicy = "Retain"
)

// Annotations for the on-call engineer; they win over windows and spec without editing Git.
const (
	// InjectLabel on a pod asks the controller's webhook to wire it for subflow; its value is
	// the mode, agent or sidecar (docs/onboarding.md).
	InjectLabel = "subflow.dev/inject"
	// InjectedAnnotation records on a pod the mode the webhook wired it in.
	InjectedAnnotation = "subflow.dev/injected"
	// InjectionSkippedAnnotation records on a pod why the webhook admitted it unwired:
	// "<Reason>: <message>". Flows that select the pod name it in their status.
	InjectionSkippedAnnotation = "subflow.dev/injection-skipped"
	// OverrideStateAnnotation holds Running, Paused or Stopped.
	OverrideStateAnnotation = "subflow.dev/override-state"
	// OverrideUntilAnnotation optionally bounds the override (RFC 3339); an expired override is ignored.
	OverrideUntilAnnotation = "subflow.dev/override-until"
	// OverrideReasonAnnotation optionally says why (an incident link); shown in the Paused
	// condition and its events while the override is in force.
	OverrideReasonAnnotation = "subflow.dev/override-reason"
)

// Finalizer lets the controller release agents' rules before a flow is deleted.
const Finalizer = "subflow.dev/release-agents"

// MaxWindowDuration is the longest maintenance window the API accepts.
const MaxWindowDuration = 7 * 24 * time.Hour

// MaxHolders bounds status.heldBy, and so the pods one flow can drive.
const MaxHolders = 10000

// The agents' bearer token when spec.agent.tokenSecretRef names none: this Secret of the flow's
// namespace, which the controller creates with a random token when it is missing and the
// webhook mounts into the pods it wires, and this key of it.
const (
	DefaultTokenSecret = "subflow-agent-token"
	DefaultTokenKey    = "token"
)

// SubscriptionFlowSpec is the desired flow of one Pulsar subscription in the selected pods.
// +kubebuilder:validation:XValidation:rule="!has(self.pauseWhen) || self.pauseWhen.all(c, !has(c.backlog) || c.backlog.subscription != self.subscription)",message="a backlog condition reads another subscription than the flow's own: pausing would grow the backlog that keeps it paused"
// +kubebuilder:validation:XValidation:rule="!has(self.seek) || !has(self.seek.partitions) || (has(self.topic) && size(self.topic) > 0)",message="seek.partitions needs spec.topic: partitions belong to one partitioned topic"
type SubscriptionFlowSpec struct {
	// selector chooses the consumer pods whose agents apply this flow. It must not be empty:
	// an empty selector would match every pod of the namespace.
	// +required
	// +kubebuilder:validation:XValidation:rule="(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)",message="selector must not be empty: set matchLabels or matchExpressions"
	Selector metav1.LabelSelector `json:"selector"`

	// subscription is the Pulsar subscription name the flow applies to.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Subscription string `json:"subscription"`

	// topic narrows the flow to one topic (short or full name; a partitioned topic covers its
	// partitions). Empty means every topic the selected pods consume with that subscription.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Topic string `json:"topic,omitempty"`

	// state is the desired state when no window or override applies.
	// +optional
	// +kubebuilder:default=Running
	State FlowState `json:"state,omitempty"`

	// seek is a one-shot request to move the subscription to a broker-entry index.
	// +optional
	Seek *SeekSpec `json:"seek,omitempty"`

	// maintenanceWindows are recurring periods with their own state, e.g. Paused on Saturday night.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	MaintenanceWindows []MaintenanceWindow `json:"maintenanceWindows,omitempty"`

	// pauseWhen are conditions under which the flow pauses itself: while any holds, a Running
	// flow is Paused. An override still wins, and Stopped still beats Paused.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=8
	PauseWhen []PauseCondition `json:"pauseWhen,omitempty"`

	// agent tells the controller how to reach and authenticate to the agents.
	// +optional
	Agent AgentSpec `json:"agent,omitempty"`

	// deletionPolicy says whether deleting the flow resumes its consumers or leaves them as they are.
	// +optional
	// +kubebuilder:default=Resume
	DeletionPolicy DeletionPolicy `json:"deletionPolicy,omitempty"`
}

// SeekSpec asks for a seek to a broker-entry index (Pulsar PIP-101 semantics): for indexes in
// [A, B) on a partition the message with the index is the next delivered; below A means the
// earliest message, at or above B means the latest.
// +kubebuilder:validation:XValidation:rule="has(self.index) != has(self.partitions)",message="set exactly one of seek.index (non-partitioned topic) or seek.partitions"
// +kubebuilder:validation:XValidation:rule="self.id != oldSelf.id || self == oldSelf",message="seek.id already names a seek to another target: a seek runs once per id, so give the new target a new seek.id"
type SeekSpec struct {
	// id makes the seek one-shot: it runs once per id; a new id asks for a new seek.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	ID string `json:"id"`

	// index is the target broker-entry index on a non-partitioned topic.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Index *int64 `json:"index,omitempty"`

	// partitions gives a target index per partition of a partitioned topic.
	// +optional
	// +listType=map
	// +listMapKey=partition
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=1024
	Partitions []PartitionIndex `json:"partitions,omitempty"`
}

// PartitionIndex is a target broker-entry index on one partition.
type PartitionIndex struct {
	// partition is the partition number, from 0.
	// +required
	// +kubebuilder:validation:Minimum=0
	Partition int32 `json:"partition"`

	// index is the target broker-entry index on that partition.
	// +required
	// +kubebuilder:validation:Minimum=0
	Index int64 `json:"index"`
}

// MaintenanceWindow is a recurring period during which the flow takes another state.
type MaintenanceWindow struct {
	// schedule is a five-field cron expression (minute hour day-of-month month day-of-week) or a
	// macro such as @daily, telling when the window starts, as wall-clock time in timeZone. When
	// both day-of-month and day-of-week are restricted, a day matching either fires (cron's rule).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="self.matches('^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|[0-9*?/,A-Za-z-]+( +[0-9*?/,A-Za-z-]+){4})$')",message="schedule must be a five-field cron expression (minute hour day-of-month month day-of-week) or a macro such as @daily"
	// +kubebuilder:validation:XValidation:rule="self.startsWith('@') || size(self.split(' ').filter(f, f != '')) != 5 || self.split(' ').filter(f, f != '')[0].matches('^(\\\\*|\\\\?|[0-5]?[0-9](-[0-5]?[0-9])?)(/[1-9][0-9]*)?(,(\\\\*|\\\\?|[0-5]?[0-9](-[0-5]?[0-9])?)(/[1-9][0-9]*)?)*$')",message="schedule minute field must use 0-59"
	// +kubebuilder:validation:XValidation:rule="self.startsWith('@') || size(self.split(' ').filter(f, f != '')) != 5 || self.split(' ').filter(f, f != '')[1].matches('^(\\\\*|\\\\?|(1?[0-9]|2[0-3])(-(1?[0-9]|2[0-3]))?)(/[1-9][0-9]*)?(,(\\\\*|\\\\?|(1?[0-9]|2[0-3])(-(1?[0-9]|2[0-3]))?)(/[1-9][0-9]*)?)*$')",message="schedule hour field must use 0-23"
	// +kubebuilder:validation:XValidation:rule="self.startsWith('@') || size(self.split(' ').filter(f, f != '')) != 5 || self.split(' ').filter(f, f != '')[2].matches('^(\\\\*|\\\\?|(0?[1-9]|[12][0-9]|3[01])(-(0?[1-9]|[12][0-9]|3[01]))?)(/[1-9][0-9]*)?(,(\\\\*|\\\\?|(0?[1-9]|[12][0-9]|3[01])(-(0?[1-9]|[12][0-9]|3[01]))?)(/[1-9][0-9]*)?)*$')",message="schedule day-of-month field must use 1-31"
	// +kubebuilder:validation:XValidation:rule="self.startsWith('@') || size(self.split(' ').filter(f, f != '')) != 5 || self.split(' ').filter(f, f != '')[3].matches('^(\\\\*|\\\\?|(0?[1-9]|1[0-2]|[Jj][Aa][Nn]|[Ff][Ee][Bb]|[Mm][Aa][Rr]|[Aa][Pp][Rr]|[Mm][Aa][Yy]|[Jj][Uu][Nn]|[Jj][Uu][Ll]|[Aa][Uu][Gg]|[Ss][Ee][Pp]|[Oo][Cc][Tt]|[Nn][Oo][Vv]|[Dd][Ee][Cc])(-(0?[1-9]|1[0-2]|[Jj][Aa][Nn]|[Ff][Ee][Bb]|[Mm][Aa][Rr]|[Aa][Pp][Rr]|[Mm][Aa][Yy]|[Jj][Uu][Nn]|[Jj][Uu][Ll]|[Aa][Uu][Gg]|[Ss][Ee][Pp]|[Oo][Cc][Tt]|[Nn][Oo][Vv]|[Dd][Ee][Cc]))?)(/[1-9][0-9]*)?(,(\\\\*|\\\\?|(0?[1-9]|1[0-2]|[Jj][Aa][Nn]|[Ff][Ee][Bb]|[Mm][Aa][Rr]|[Aa][Pp][Rr]|[Mm][Aa][Yy]|[Jj][Uu][Nn]|[Jj][Uu][Ll]|[Aa][Uu][Gg]|[Ss][Ee][Pp]|[Oo][Cc][Tt]|[Nn][Oo][Vv]|[Dd][Ee][Cc])(-(0?[1-9]|1[0-2]|[Jj][Aa][Nn]|[Ff][Ee][Bb]|[Mm][Aa][Rr]|[Aa][Pp][Rr]|[Mm][Aa][Yy]|[Jj][Uu][Nn]|[Jj][Uu][Ll]|[Aa][Uu][Gg]|[Ss][Ee][Pp]|[Oo][Cc][Tt]|[Nn][Oo][Vv]|[Dd][Ee][Cc]))?)(/[1-9][0-9]*)?)*$')",message="schedule month field must use 1-12 or jan-dec"
	// +kubebuilder:validation:XValidation:rule="self.startsWith('@') || size(self.split(' ').filter(f, f != '')) != 5 || self.split(' ').filter(f, f != '')[4].matches('^(\\\\*|\\\\?|([0-6]|[Ss][Uu][Nn]|[Mm][Oo][Nn]|[Tt][Uu][Ee]|[Ww][Ee][Dd]|[Tt][Hh][Uu]|[Ff][Rr][Ii]|[Ss][Aa][Tt])(-([0-6]|[Ss][Uu][Nn]|[Mm][Oo][Nn]|[Tt][Uu][Ee]|[Ww][Ee][Dd]|[Tt][Hh][Uu]|[Ff][Rr][Ii]|[Ss][Aa][Tt]))?)(/[1-9][0-9]*)?(,(\\\\*|\\\\?|([0-6]|[Ss][Uu][Nn]|[Mm][Oo][Nn]|[Tt][Uu][Ee]|[Ww][Ee][Dd]|[Tt][Hh][Uu]|[Ff][Rr][Ii]|[Ss][Aa][Tt])(-([0-6]|[Ss][Uu][Nn]|[Mm][Oo][Nn]|[Tt][Uu][Ee]|[Ww][Ee][Dd]|[Tt][Hh][Uu]|[Ff][Rr][Ii]|[Ss][Aa][Tt]))?)(/[1-9][0-9]*)?)*$')",message="schedule day-of-week field must use 0-6 or sun-sat"
	// +kubebuilder:validation:XValidation:rule="self.startsWith('@') || size(self.split(' ').filter(f, f != '')) != 5 || !(self.split(' ').filter(f, f != '')[4] in ['*', '?'] && ((self.split(' ').filter(f, f != '')[2].matches('^(30|31)(,(30|31))*$') && self.split(' ').filter(f, f != '')[3].matches('^(0?2|[Ff][Ee][Bb])(,(0?2|[Ff][Ee][Bb]))*$')) || (self.split(' ').filter(f, f != '')[2].matches('^31(,31)*$') && self.split(' ').filter(f, f != '')[3].matches('^(0?[2469]|11|[Ff][Ee][Bb]|[Aa][Pp][Rr]|[Jj][Uu][Nn]|[Ss][Ee][Pp]|[Nn][Oo][Vv])(,(0?[2469]|11|[Ff][Ee][Bb]|[Aa][Pp][Rr]|[Jj][Uu][Nn]|[Ss][Ee][Pp]|[Nn][Oo][Vv]))*$'))))",message="schedule never fires: no listed month has that day of the month"
	Schedule string `json:"schedule"`

	// duration is how long each window lasts in elapsed time, e.g. 2h or 90m; at most 168h.
	// +required
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="duration must be greater than zero"
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('168h')",message="duration must be at most 168h (7 days)"
	Duration metav1.Duration `json:"duration"`

	// timeZone is the IANA time zone of the schedule, e.g. Europe/Berlin. Defaults to UTC.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$`
	// +kubebuilder:validation:XValidation:rule="self != 'Local' && timestamp('2000-01-01T00:00:00Z').getHours(self) >= 0",message="timeZone must be a known IANA time zone name such as Europe/Berlin"
	TimeZone string `json:"timeZone,omitempty"`

	// state is the state during the window.
	// +optional
	// +kubebuilder:default=Paused
	State FlowState `json:"state,omitempty"`
}

// AgentSpec says how to reach the agents in the selected pods.
type AgentSpec struct {
	// port is the agent's container port, by name or number. A container port named "subflow"
	// wins; otherwise this port; otherwise 9470.
	// +optional
	Port *intstr.IntOrString `json:"port,omitempty"`

	// tokenSecretRef names the Secret key holding the agents' bearer token. Defaults to
	// subflow-agent-token/token, which the controller creates with a random token when it is
	// missing; a Secret of another name must exist, labelled subflow.dev/agent-token=true.
	// +optional
	TokenSecretRef *SecretKeyRef `json:"tokenSecretRef,omitempty"`
}

// SecretKeyRef points at one key of a Secret in the flow's namespace.
type SecretKeyRef struct {
	// name of the Secret.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// key inside the Secret.
	// +optional
	// +kubebuilder:default=token
	// +kubebuilder:validation:MaxLength=253
	Key string `json:"key,omitempty"`
}

// SubscriptionFlowStatus is what the controller and the agents observed.
type SubscriptionFlowStatus struct {
	// observedGeneration is the generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// revision grows whenever the desired state pushed to agents changes.
	// +optional
	Revision int64 `json:"revision,omitempty"`

	// effectiveState is the state in force after overrides and windows.
	// +optional
	EffectiveState FlowState `json:"effectiveState,omitempty"`

	// stateSource tells which input decided effectiveState.
	// +optional
	StateSource StateSource `json:"stateSource,omitempty"`

	// nextTransitionTime is when a window starts or ends, or the override expires.
	// +optional
	NextTransitionTime *metav1.Time `json:"nextTransitionTime,omitempty"`

	// pods counts the selected pods.
	// +optional
	Pods PodCounts `json:"pods,omitempty"`

	// consumers counts the consumers the agents reported for this flow.
	// +optional
	Consumers ConsumerCounts `json:"consumers,omitempty"`

	// agents lists per-pod detail, unhealthy pods first, at most 50 entries.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=50
	Agents []AgentStatus `json:"agents,omitempty"`

	// heldBy lists the pods whose agents may hold this flow's rule. It is written before a pod is
	// first pushed to, so that a pod that stops matching, or every holder when the flow is
	// deleted, is released even by a restarted controller.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=10000
	// +kubebuilder:validation:items:MaxLength=253
	HeldBy []string `json:"heldBy,omitempty"`

	// pauseWhen reports each spec.pauseWhen condition: whether it holds, since when, what was seen.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=8
	PauseWhen []PauseConditionStatus `json:"pauseWhen,omitempty"`

	// seek reports the last seek request.
	// +optional
	Seek *SeekStatus `json:"seek,omitempty"`

	// backlog is the subscription's backlog on the broker, as one agent last read it, and when
	// the broker's retention would first delete part of it.
	// +optional
	Backlog *BacklogStatus `json:"backlog,omitempty"`

	// conditions: Ready, Paused, Reconciling, Stalled, SeekCompleted, BacklogAtRisk.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// PodCounts counts the selected pods.
type PodCounts struct {
	// matched pods are selected by spec.selector.
	// +optional
	Matched int32 `json:"matched"`
	// synced pods' agents applied the current revision.
	// +optional
	Synced int32 `json:"synced"`
	// unreachable pods' agents did not answer.
	// +optional
	Unreachable int32 `json:"unreachable"`
	// refused pods' agents answered and refused the current revision: too old for a feature it
	// requires (AgentTooOld), or holding as many flow rules as they may (TooManyFlows).
	// +optional
	Refused int32 `json:"refused,omitempty"`
}

// ConsumerCounts counts consumers by observed state.
type ConsumerCounts struct {
	// total consumers the agents reported for this flow.
	// +optional
	Total int32 `json:"total"`
	// running consumers.
	// +optional
	Running int32 `json:"running"`
	// paused consumers.
	// +optional
	Paused int32 `json:"paused"`
	// stopped consumers.
	// +optional
	Stopped int32 `json:"stopped"`
	// halted is "paused+stopped/total", shown by kubectl get.
	// +optional
	Halted string `json:"halted,omitempty"`
}

// AgentStatus is one pod's agent as last seen.
type AgentStatus struct {
	// pod name.
	Pod string `json:"pod"`
	// kind of what serves the pod's control API: agent (the library linked into a Go
	// application) or sidecar (the protocol sidecar); empty until the pod answered.
	// +optional
	// +kubebuilder:validation:Enum=agent;sidecar
	Kind string `json:"kind,omitempty"`
	// state: the agent's consumers' common state, Mixed, NoConsumers, Unreachable (no
	// answer), AgentTooOld (the agent lacks a feature the request requires) or TooManyFlows
	// (the agent holds as many flow rules as it may); the last two refused the revision.
	// +optional
	State string `json:"state,omitempty"`
	// agentVersion is the subflow version the pod's agent or sidecar was built from, as it
	// reported it; empty when it did not say.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	AgentVersion string `json:"agentVersion,omitempty"`
	// protocolVersion is the agent protocol the pod's agent speaks (1 for an agent that
	// reports none); empty until it answered.
	// +optional
	// +kubebuilder:validation:Minimum=1
	ProtocolVersion int32 `json:"protocolVersion,omitempty"`
	// consumers matched in that pod.
	// +optional
	Consumers int32 `json:"consumers,omitempty"`
	// heldMessages the pod's consumers hold behind the gate.
	// +optional
	HeldMessages int64 `json:"heldMessages,omitempty"`
	// receivedWhilePaused counts messages the pod's clients pushed to a closed gate (held,
	// never handed over), e.g. after a reconnect while paused.
	// +optional
	ReceivedWhilePaused int64 `json:"receivedWhilePaused,omitempty"`
	// lastSyncTime is when the agent last applied the current revision.
	// +optional
	LastSyncTime *metav1.Time `json:"lastSyncTime,omitempty"`
	// message explains a problem with this agent.
	// +optional
	Message string `json:"message,omitempty"`
}

// SeekStatus reports a seek.
type SeekStatus struct {
	// id of the seek request.
	ID string `json:"id"`
	// executor is the pod whose agent performs the seek.
	// +optional
	Executor string `json:"executor,omitempty"`
	// completionTime is when the seek finished.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// positions are where the cursors moved, per partition. A failed seek lists the partitions
	// it moved all the same (a partitioned seek can fail half way: see failedPartitions).
	// +optional
	// +listType=atomic
	Positions []SeekPosition `json:"positions,omitempty"`
	// failedPartitions are the partitions whose cursor the seek did not move, and why: their
	// messages are delivered from where they were. Seek them under a new id to finish.
	// +optional
	// +listType=atomic
	FailedPartitions []SeekPartitionFailure `json:"failedPartitions,omitempty"`
	// reason is why the seek failed, one CamelCase word: the executor's (SeekFailed,
	// SeekTimedOut, NoConsumer, IndexMetadataDisabled, or a newer agent's own), which is also
	// SeekCompleted's reason. Empty for a seek that succeeded, and for one a controller before
	// this field recorded (its message starts with the reason).
	// +optional
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z][A-Za-z0-9]*$`
	Reason string `json:"reason,omitempty"`
	// message explains a failure: "Reason: error".
	// +optional
	Message string `json:"message,omitempty"`
}

// SeekPartitionFailure is a partition whose cursor a seek did not move.
type SeekPartitionFailure struct {
	// partition is the partition number.
	Partition int32 `json:"partition"`
	// index requested.
	Index int64 `json:"index"`
	// message is the error.
	// +optional
	Message string `json:"message,omitempty"`
}

// BacklogStatus sums the subscription's backlog over the flow's topics (partitions).
type BacklogStatus struct {
	// messages waiting for the subscription.
	// +optional
	Messages int64 `json:"messages"`
	// bytes waiting for the subscription.
	// +optional
	Bytes int64 `json:"bytes"`
	// oldestPublishTime is the publish time of the oldest waiting message.
	// +optional
	OldestPublishTime *metav1.Time `json:"oldestPublishTime,omitempty"`
	// deletionTime is when the broker's retention (a message TTL, or a backlog quota with the
	// consumer_backlog_eviction policy) first deletes waiting messages, if it will.
	// +optional
	DeletionTime *metav1.Time `json:"deletionTime,omitempty"`
	// deletedBy names the retention that deletes them first.
	// +optional
	DeletedBy string `json:"deletedBy,omitempty"`
	// readTime is when the agent read the figures.
	// +optional
	ReadTime *metav1.Time `json:"readTime,omitempty"`
	// reporter is the pod whose agent read them.
	// +optional
	Reporter string `json:"reporter,omitempty"`
	// message explains figures that could not be read.
	// +optional
	Message string `json:"message,omitempty"`
}

// SeekPosition is where one partition's cursor was put.
type SeekPosition struct {
	// partition is -1 for a non-partitioned topic.
	Partition int32 `json:"partition"`
	// index requested.
	Index int64 `json:"index"`
	// messageID resolved, as ledger:entry:partition:batch.
	// +optional
	MessageID string `json:"messageID,omitempty"`
	// cursor, as ledger:entry, is where the cursor was put when that is before messageID: the
	// first chunk of a chunked message the index lies inside, so that it is delivered whole.
	// +optional
	Cursor string `json:"cursor,omitempty"`
}

// SubscriptionFlow declares Running, Paused or Stopped for a Pulsar subscription and the pods
// that consume it, with optional seek, maintenance windows and an on-call override.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=sf;sflow,categories=subflow
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.spec.state`
// +kubebuilder:printcolumn:name="Effective",type=string,JSONPath=`.status.effectiveState`
// +kubebuilder:printcolumn:name="Paused",type=string,JSONPath=`.status.consumers.halted`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type SubscriptionFlow struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired flow.
	// +required
	Spec SubscriptionFlowSpec `json:"spec"`

	// status is the observed flow.
	// +optional
	Status SubscriptionFlowStatus `json:"status,omitempty"`
}

// SubscriptionFlowList is a list of SubscriptionFlow.
// +kubebuilder:object:root=true
type SubscriptionFlowList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SubscriptionFlow `json:"items"`
}

func init() {
	SchemeBuilder.Register(&SubscriptionFlow{}, &SubscriptionFlowList{})
}
