// Package protocol holds the JSON messages exchanged between the subflow controller and the
// agents linked into consumer pods (docs/design.md section 4). It has no dependencies so that both
// sides, and applications, can import it cheaply.
package protocol

import (
	"slices"
	"time"
)

// DefaultPort is the agent's control port when the pod names no container port "subflow".
const DefaultPort = 9470

// PortName is the container port name the controller looks for on a pod (plain HTTP).
const PortName = "subflow"

// TLSPortName names the container port of an agent that serves HTTPS.
const TLSPortName = "subflow-https"

// The kinds of pod-side host the control API is served by (FlowStatus.Kind).
const (
	// KindAgent is the agent library linked into a Go application.
	KindAgent = "agent"
	// KindSidecar is the protocol sidecar next to an application in any language.
	KindSidecar = "sidecar"
)

// The environment subflow's pod webhook gives an agent-mode application whose pod a flow selects
// when it is created: start gated ("true"), and the state after the sync timeout without a push.
// agent.New reads them.
const (
	StartGatedEnv    = "SUBFLOW_START_GATED"
	FallbackStateEnv = "SUBFLOW_FALLBACK_STATE"
)

// PathPrefix is the versioned root of every agent endpoint.
const PathPrefix = "/subflow/v1"

// Version is the agent protocol this build speaks (docs/design.md, section 4.17: versions
// and skew). Version 1 is every agent that reports no version: it refuses a request with a field
// it does not know. From version 2 on, an agent ignores the fields it does not know and refuses
// a request that requires, in RequiresHeader, a feature it lacks. Version 3 adds
// FlowRequest.BacklogOf (feature "backlogOf") and BacklogStatus.Subscription. Agents report
// their version in VersionHeader on every answer and in the protocolVersion of every JSON answer.
const Version = 3

// VersionHeader carries the sender's protocol version, a decimal integer: the controller's in
// a request, the agent's in an answer.
const VersionHeader = "Subflow-Protocol"

// RequiresHeader lists, comma-separated, the features a request relies on: an agent lacking
// one of them refuses the whole request (422, ReasonAgentTooOld) and changes nothing, where it
// would otherwise ignore what it does not know. A controller names a feature there when an
// agent that ignored it would do something else than asked.
const RequiresHeader = "Subflow-Requires"

// features are what this build implements, each named by the request field it introduced, as
// the field's JSON path with "[]" for a list's elements, or "path=Value" for a new value of a
// known field. Every optional field of FlowRequest is one; the required ones are the baseline.
var features = []string{
	"topic", "reportBacklog", "backlogOf",
	"seek", "seek.index", "seek.partitions", "seek.execute", "seek.succeeded",
	"seek.movedPartitions", "seek.positions", "seek.positions[].cursor",
}

// Features lists the features this build implements, for RequiresHeader.
func Features() []string { return slices.Clone(features) }

// HasFeature reports whether this build implements the named feature.
func HasFeature(name string) bool { return slices.Contains(features, name) }

// MaxMissingFeatures bounds Error.MissingFeatures.
const MaxMissingFeatures = 20

// MaxIgnoredFields bounds FlowStatus.IgnoredFields.
const MaxIgnoredFields = 20

// State is how a subscription should flow, or how a consumer actually flows.
type State string

const (
	// Running is normal consumption.
	Running State = "Running"
	// Paused keeps consumers connected but hands nothing to the application and grants no permits.
	Paused State = "Paused"
	// Stopped closes the underlying consumers; unacked and buffered messages return to the broker.
	Stopped State = "Stopped"
)

// Valid reports whether s is one of the three states.
func (s State) Valid() bool { return s == Running || s == Paused || s == Stopped }

// restrictiveness orders states: when several flows match one consumer the highest wins.
func (s State) restrictiveness() int {
	switch s {
	case Stopped:
		return 2
	case Paused:
		return 1
	default:
		return 0
	}
}

// MostRestrictive returns the stricter of a and b (Stopped > Paused > Running).
func MostRestrictive(a, b State) State {
	if b.restrictiveness() > a.restrictiveness() {
		return b
	}
	return a
}

// FlowRequest is the body of PUT {PathPrefix}/flows/{namespace}/{name}: the desired state of one
// SubscriptionFlow as the controller computed it.
type FlowRequest struct {
	// UID identifies the SubscriptionFlow object; a recreated flow has a new UID.
	UID string `json:"uid"`
	// Revision grows whenever the desired state changes; lower revisions are refused (409).
	Revision int64 `json:"revision"`
	// Subscription the rule applies to.
	Subscription string `json:"subscription"`
	// Topic narrows the rule to one topic (short or full name, partitions included); empty means all.
	Topic string `json:"topic,omitempty"`
	// State is the desired state of the matched consumers.
	State State `json:"state"`
	// Seek is an optional one-shot seek request.
	Seek *SeekRequest `json:"seek,omitempty"`
	// ReportBacklog asks this agent (one per flow) to read the subscription's backlog and the
	// retention that may delete it, through the admin API, and report them in FlowStatus.Backlog.
	ReportBacklog bool `json:"reportBacklog,omitempty"`
	// BacklogOf names other subscriptions whose backlog this agent reads on the rule's topics
	// (the rule's topic, else every topic its matched consumers name) and reports in
	// FlowStatus.Backlog, whether or not ReportBacklog is set: at most MaxBacklogOf, each a
	// distinct, non-empty name of at most MaxBacklogOfNameBytes without control characters.
	// A controller that sets it requires feature "backlogOf" (RequiresHeader).
	BacklogOf []string `json:"backlogOf,omitempty"`
}

// DefaultBacklogRefresh is how often an agent reads a watched backlog again by default, so
// how old the figures of an answer may be: the controller judges their staleness by it.
const DefaultBacklogRefresh = 30 * time.Second

// MaxBacklogOf bounds FlowRequest.BacklogOf, so that an answer holds at most the rule's topics'
// entries times 1 + MaxBacklogOf subscriptions.
const MaxBacklogOf = 8

// MaxBacklogOfNameBytes bounds each name of FlowRequest.BacklogOf.
const MaxBacklogOfNameBytes = 256

// SeekRequest asks for a seek to a broker-entry index (PIP-101 semantics).
type SeekRequest struct {
	// ID makes the seek one-shot: an agent executes each ID at most once.
	ID string `json:"id"`
	// Index for a non-partitioned topic.
	Index *int64 `json:"index,omitempty"`
	// Partitions gives one index per partition of a partitioned topic.
	Partitions []PartitionIndex `json:"partitions,omitempty"`
	// Execute is true on exactly one agent per seek ID. The executor starts the seek in the
	// background under its own deadline and answers at once with SeekRunning; later pushes
	// (or GET /state) report SeekSucceeded or SeekFailed. An ID runs at most once per flow UID.
	Execute bool `json:"execute,omitempty"`
	// Succeeded tells every agent that the executor's seek succeeded. Only then does an agent
	// that did not execute it drop the messages it held from before the seek was announced to
	// it (the broker redelivers from the new cursor). Announcing a seek changes nothing.
	Succeeded bool `json:"succeeded,omitempty"`
	// MovedPartitions is set instead of Succeeded when the executor's seek moved only some
	// partitions' cursors (SeekStatus.Failed names the others): an agent that did not execute
	// it drops what it held of these partitions only.
	MovedPartitions []int32 `json:"movedPartitions,omitempty"`
	// Positions comes with Succeeded or MovedPartitions: where the executor put the cursors.
	// An agent that did not execute the seek filters out the messages before a target inside
	// its batch entry, as the executor does, since the broker may send that entry to it.
	Positions []SeekPosition `json:"positions,omitempty"`
}

// PartitionIndex is a target index on one partition.
type PartitionIndex struct {
	Partition int32 `json:"partition"`
	Index     int64 `json:"index"`
}

// FlowStatus is the agent's answer to a PUT: what it actually did for that flow.
type FlowStatus struct {
	// Pod is the name the agent reports for itself (usually the pod name).
	Pod string `json:"pod"`
	// Kind is KindAgent or KindSidecar; empty (an older agent) means KindAgent.
	Kind string `json:"kind,omitempty"`
	// ProtocolVersion is the agent's protocol Version; absent from version 1 agents.
	ProtocolVersion int `json:"protocolVersion,omitempty"`
	// AgentVersion is the subflow module version the agent was built from, when known.
	AgentVersion string `json:"agentVersion,omitempty"`
	// AppliedRevision is the revision now in force for this flow's UID.
	AppliedRevision int64 `json:"appliedRevision"`
	// IgnoredFields names, by JSON path ("[]" for a list's elements), the request's fields
	// the agent does not know and ignored: a newer controller's optional fields (at most
	// MaxIgnoredFields).
	IgnoredFields []string `json:"ignoredFields,omitempty"`
	// Consumers lists every consumer the rule matched, with their observed state.
	Consumers []ConsumerStatus `json:"consumers"`
	// Seek reports the seek of the current request, if any.
	Seek *SeekStatus `json:"seek,omitempty"`
	// Conflict names other flows that match the same consumers with a different state.
	Conflict string `json:"conflict,omitempty"`
	// HeldBy lists the other rules matching these consumers whose state is more restrictive
	// than this flow's, so that they decide the consumers' state (at most MaxHeldBy). The
	// controller names them, and tells a rule whose flow is gone (deletionPolicy Retain).
	HeldBy []RuleRef `json:"heldBy,omitempty"`
	// OtherConsumers lists, when the rule matched no consumer, the subscriptions and topics of
	// the consumers the agent does have (at most MaxOtherConsumers), so that the controller can
	// name a typo in the flow.
	OtherConsumers []ConsumerRef `json:"otherConsumers,omitempty"`
	// Backlog reports, per topic (partition) and subscription, the backlog on the broker and the
	// retention policies in force: the flow's subscription's when the request set ReportBacklog,
	// and each subscription of BacklogOf. Values may lag by the agent's refresh period.
	Backlog []BacklogStatus `json:"backlog,omitempty"`
}

// BacklogStatus is one topic's (or partition's) backlog for one subscription and what
// may delete it while nobody consumes: a message TTL, or a backlog quota whose policy is
// consumer_backlog_eviction.
type BacklogStatus struct {
	Topic string `json:"topic"`
	// Subscription is the subscription the entry is about, set on every entry from protocol
	// version 3 on; absent (an older agent), it is the flow's own subscription.
	Subscription string `json:"subscription,omitempty"`
	// Messages and Bytes waiting for the subscription (msgBacklog, backlogSize).
	Messages int64 `json:"messages"`
	Bytes    int64 `json:"bytes"`
	// OldestPublishTime is the publish time of the oldest message in the backlog; nil when empty
	// or unknown.
	OldestPublishTime *time.Time `json:"oldestPublishTime,omitempty"`
	// MessageTTLSeconds is the effective message TTL (topic, else namespace, else broker); nil
	// means none.
	MessageTTLSeconds *int64 `json:"messageTTLSeconds,omitempty"`
	// Quotas are the effective backlog quotas.
	Quotas []BacklogQuota `json:"quotas,omitempty"`
	// ReadAt is when the agent read these values.
	ReadAt time.Time `json:"readAt"`
	// Unknown explains why the values could not be read (e.g. the admin API refused the
	// application's credentials); the other fields are then empty.
	Unknown string `json:"unknown,omitempty"`
	// RetentionUnknown explains why the TTL and quotas could not be read (they are topic
	// policies, which Pulsar shows to tenant admins only) while the backlog figures could;
	// MessageTTLSeconds and Quotas are then empty and say nothing.
	RetentionUnknown string `json:"retentionUnknown,omitempty"`
	// KeySharedStall, when set, says that on this Key_Shared subscription consumers that take
	// no messages (paused ones) hold back dispatch to their running siblings: the broker's
	// replay queue holds their keys' entries and, once it reaches the look-ahead limit, the
	// broker stops reading for everyone while messages wait.
	KeySharedStall *KeySharedStall `json:"keySharedStall,omitempty"`
}

// MaxStallNames bounds each consumer list of a KeySharedStall; the counts stay exact.
const MaxStallNames = 10

// KeySharedStall is what the topic stats show of a Key_Shared dispatch stall.
type KeySharedStall struct {
	// Halted are consumers with no permits (availablePermits <= 0): paused, or not receiving.
	Halted      []string `json:"halted"`
	HaltedCount int      `json:"haltedCount"`
	// Starved are consumers with permits and no unacknowledged message: they could take
	// messages and get none.
	Starved      []string `json:"starved"`
	StarvedCount int      `json:"starvedCount"`
	// InReplay is the broker's replay queue (msgInReplay, entries); Waiting the entries in
	// the backlog that are neither in it nor unacknowledged by a consumer (never dispatched).
	InReplay int64 `json:"inReplay"`
	Waiting  int64 `json:"waiting"`
}

// BacklogQuota is one effective backlog quota of a topic.
type BacklogQuota struct {
	// Type is destination_storage (a size limit) or message_age (a time limit).
	Type string `json:"type"`
	// LimitBytes and LimitSeconds are the quota's limits; zero or negative means none.
	LimitBytes   int64 `json:"limitBytes,omitempty"`
	LimitSeconds int64 `json:"limitSeconds,omitempty"`
	// Policy is producer_request_hold, producer_exception or consumer_backlog_eviction; only
	// the last deletes messages.
	Policy string `json:"policy"`
}

// MaxOtherConsumers bounds FlowStatus.OtherConsumers.
const MaxOtherConsumers = 20

// MaxHeldBy bounds FlowStatus.HeldBy.
const MaxHeldBy = 20

// RuleRef names a flow rule an agent holds and the state it asks for.
type RuleRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
	State     State  `json:"state"`
}

// ConsumerRef names a consumer's subscription and topic.
type ConsumerRef struct {
	Subscription string `json:"subscription"`
	Topic        string `json:"topic"`
}

// ConsumerStatus is the observed state of one agent consumer.
type ConsumerStatus struct {
	Topic        string    `json:"topic"`
	Subscription string    `json:"subscription"`
	Name         string    `json:"name"`
	State        State     `json:"state"`
	Since        time.Time `json:"since"`
	// HeldMessages are messages taken from the client while gated, delivered first on resume.
	HeldMessages int64 `json:"heldMessages"`
	// ReceivedWhilePaused counts messages the client pushed to the gate while it was closed.
	ReceivedWhilePaused int64 `json:"receivedWhilePaused"`
	// Connected: the consumer is subscribed and, as far as the agent knows, reaches the broker.
	// An agent reports false while the client's attempts to reconnect fail; a sidecar, while it
	// has no broker connection for the consumer.
	Connected bool `json:"connected"`
	// LastConnected is when the consumer last subscribed or reconnected (agent pods).
	LastConnected *time.Time `json:"lastConnected,omitempty"`
	// ReconnectingSince is set while the client fails to reach the broker for this consumer:
	// when its reconnect began (agent pods).
	ReconnectingSince *time.Time `json:"reconnectingSince,omitempty"`
}

// SeekState is the progress of one seek ID on an agent.
type SeekState string

const (
	// SeekRunning means the executor started the seek and it has not finished yet.
	SeekRunning SeekState = "Running"
	// SeekSucceeded means the cursors moved; Positions tells where.
	SeekSucceeded SeekState = "Succeeded"
	// SeekFailed means the seek did not complete; Reason and Error tell why. Positions names
	// the partitions whose cursor moved all the same (reason SeekPartiallyApplied: a partitioned
	// seek whose resets failed on the partitions Failed names); usually none did.
	SeekFailed SeekState = "Failed"
	// SeekObserved means the agent is not the executor: it noted the announcement and drops
	// what it held from before it once told the seek succeeded.
	SeekObserved SeekState = "Observed"
)

// SeekStatus reports a seek.
type SeekStatus struct {
	ID        string         `json:"id"`
	State     SeekState      `json:"state"`
	Positions []SeekPosition `json:"positions,omitempty"`
	// Failed lists the partitions whose cursor did not move, and why.
	Failed []PartitionFailure `json:"failed,omitempty"`
	// Reason is a stable CamelCase cause when State is Failed (e.g. IndexMetadataDisabled).
	Reason string `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`
}

// Reasons of a failed seek (SeekStatus.Reason); the controller makes them SeekCompleted's reason.
const (
	// SeekPartiallyApplied is the Reason of a failed seek that moved some partitions and not others.
	SeekPartiallyApplied = "SeekPartiallyApplied"
	// SeekTimedOut is the Reason of a seek that did not finish within its deadline.
	SeekTimedOut = "SeekTimedOut"
	// SeekNoConsumer is the Reason of a seek whose executor has no consumer of the flow's
	// subscription and topic to seek.
	SeekNoConsumer = "NoConsumer"
	// SeekIndexMetadataDisabled is the Reason of a seek on a broker that stores no entry index.
	SeekIndexMetadataDisabled = "IndexMetadataDisabled"
	// SeekError is the Reason of a seek that failed otherwise; Error says how.
	SeekError = "SeekFailed"
)

// PartitionFailure is a partition whose cursor a seek did not move.
type PartitionFailure struct {
	Partition int32  `json:"partition"`
	Index     int64  `json:"index"`
	Error     string `json:"error"`
}

// SeekPosition is where one partition's cursor was put.
type SeekPosition struct {
	// Partition is -1 for a non-partitioned topic.
	Partition int32 `json:"partition"`
	Index     int64 `json:"index"`
	// MessageID is the resolved position, as "ledger:entry:partition:batch".
	MessageID string `json:"messageID"`
	// Cursor, as "ledger:entry", is where the cursor was put when that is before MessageID:
	// the first chunk of a chunked message the target lies inside. What lies from there up to
	// the target is delivered again by the broker and dropped by the agents.
	Cursor string `json:"cursor,omitempty"`
}

// AgentState is the body of GET {PathPrefix}/state.
type AgentState struct {
	Pod  string `json:"pod"`
	Kind string `json:"kind,omitempty"`
	// ProtocolVersion and AgentVersion are as in FlowStatus.
	ProtocolVersion int              `json:"protocolVersion,omitempty"`
	AgentVersion    string           `json:"agentVersion,omitempty"`
	Flows           []FlowSummary    `json:"flows"`
	Consumers       []ConsumerStatus `json:"consumers"`
}

// FlowSummary is one flow rule an agent holds.
type FlowSummary struct {
	Namespace       string `json:"namespace"`
	Name            string `json:"name"`
	UID             string `json:"uid"`
	AppliedRevision int64  `json:"appliedRevision"`
	State           State  `json:"state"`
}

// Error is the JSON body of every non-2xx answer.
type Error struct {
	// Reason is stable and machine readable: one of the Reason constants.
	Reason  string `json:"reason"`
	Message string `json:"message"`
	// AppliedRevision is the revision the agent holds for the flow, set with ReasonStaleRevision
	// so that the controller can move past it in one step.
	AppliedRevision int64 `json:"appliedRevision,omitempty"`
	// ProtocolVersion is the answering agent's protocol Version; absent from version 1 agents.
	ProtocolVersion int `json:"protocolVersion,omitempty"`
	// MissingFeatures, with ReasonAgentTooOld, lists the features the request required that
	// the agent lacks (at most MaxMissingFeatures).
	MissingFeatures []string `json:"missingFeatures,omitempty"`
}

// Reasons of Error.
const (
	ReasonBadRequest = "BadRequest"
	// ReasonUnsupportedMediaType: the body is not application/json.
	ReasonUnsupportedMediaType = "UnsupportedMediaType"
	ReasonUnauthorized         = "Unauthorized"
	// ReasonStaleRevision (409): the agent applied a newer revision of the same flow UID.
	ReasonStaleRevision = "StaleRevision"
	// ReasonStaleUID (409): a newer flow with the same namespace/name (a new UID) replaced this
	// UID's rule; the old UID is refused from then on.
	ReasonStaleUID = "StaleUID"
	// ReasonUIDMismatch (409): a DELETE named another UID than the rule's.
	ReasonUIDMismatch = "UIDMismatch"
	ReasonNotFound    = "NotFound"
	// ReasonAgentTooOld (422): the request requires features (RequiresHeader) the agent lacks;
	// nothing was changed. Upgrade the agent, or the pod's sidecar.
	ReasonAgentTooOld = "AgentTooOld"
	// ReasonTooManyFlows (409): the agent holds as many flow rules as it may and refused a new
	// one; updates and releases of the rules it holds still work.
	ReasonTooManyFlows = "TooManyFlows"
)
