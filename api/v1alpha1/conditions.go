package v1alpha1

import "github.com/subflow-dev/subflow/agent/protocol"

// Condition types of a SubscriptionFlow, with their reasons. Ready is always present; Reconciling
// and Stalled only while True (kstatus). All have positive polarity unless noted.
const (
	// ConditionReady is True when every matched pod's agent applied the current revision and
	// every matched consumer reached the effective state.
	ConditionReady = "Ready"
	// ConditionPaused is True when the effective state is Paused or Stopped and every matched
	// consumer reported paused or stopped for the current revision.
	ConditionPaused = "Paused"
	// ConditionReconciling is True while the controller is driving agents toward the desired state.
	ConditionReconciling = "Reconciling"
	// ConditionStalled is True when progress needs a person: invalid spec, wrong token.
	// Negative polarity: its presence is the problem.
	ConditionStalled = "Stalled"
	// ConditionSeekCompleted is True when the current seek id executed; False with a reason when it failed.
	ConditionSeekCompleted = "SeekCompleted"
	// ConditionBacklogAtRisk is True while consumption is halted and the broker's retention will
	// delete waiting messages within the warning lead time (or is deleting them). Negative
	// polarity; present once an agent reported the backlog.
	ConditionBacklogAtRisk = "BacklogAtRisk"
)

// Reasons, grouped by the condition they usually explain.
const (
	// ReasonSynced (Ready=True): every agent applied the current revision.
	ReasonSynced = "Synced"
	// ReasonNoMatchingPods (Ready=True): the selector matches no pod; nothing to drive.
	ReasonNoMatchingPods = "NoMatchingPods"
	// ReasonNoMatchingConsumers: the matched pods' agents have no consumer of the flow's
	// subscription (and topic): nothing is paused, whatever the flow asks. Usually a typo.
	ReasonNoMatchingConsumers = "NoMatchingConsumers"
	// ReasonAgentsUnreachable (Ready=False): some pods' agents did not answer; the message names them.
	ReasonAgentsUnreachable = "AgentsUnreachable"
	// ReasonConsumersConverging (Ready=False): agents answered but some consumers are not yet in the effective state.
	ReasonConsumersConverging = "ConsumersConverging"
	// ReasonHeldByOtherRule (Ready=False): another rule in the agents - another flow, or one a
	// flow deleted with deletionPolicy Retain left behind - holds consumers in a more
	// restrictive state than this flow's; the message names it.
	ReasonHeldByOtherRule = "HeldByOtherRule"
	// ReasonAgentTooOld (Ready=False): some pods' agents refused the current revision because
	// it requires a feature they lack (protocol 422 AgentTooOld); they changed nothing. The
	// message names them and what they lack: upgrade the application's agent or the sidecar
	// image. Ready keeps its positive polarity: False, with this reason, while any pod refuses.
	ReasonAgentTooOld = "AgentTooOld"
	// ReasonTooManyFlows (Ready=False): some pods' agents hold as many flow rules as they may
	// and refused this flow's (protocol 409 TooManyFlows); they changed nothing. The message
	// names them; room is made by releasing another flow there. Ready keeps its positive
	// polarity: False, with this reason, while any pod refuses.
	ReasonTooManyFlows = "TooManyFlows"
	// ReasonReleasePending (Ready=False): pods that no longer match still hold the rule; the
	// controller retries releasing them.
	ReasonReleasePending = "ReleasePending"
	// ReasonAgentAuthFailed (Ready=False, Stalled=True): an agent refused the token.
	ReasonAgentAuthFailed = "AgentAuthFailed"
	// ReasonInvalidSpec (Ready=False, Stalled=True): the spec passed the API server but cannot be used.
	ReasonInvalidSpec = "InvalidSpec"
	// ReasonProgressing (Reconciling=True): pushing the current revision.
	ReasonProgressing = "Progressing"

	// ReasonConsumersPaused (Paused=True): every consumer is paused or stopped.
	ReasonConsumersPaused = "ConsumersPaused"
	// ReasonPausePending (Paused=False): the effective state halts consumption but some consumers still run.
	ReasonPausePending = "PausePending"
	// ReasonRunning (Paused=False): the effective state is Running.
	ReasonRunning = "Running"

	// ReasonSeekSucceeded (SeekCompleted=True): the executor moved the cursors.
	ReasonSeekSucceeded = "SeekSucceeded"
	// ReasonSeekPending (SeekCompleted=False): the seek has not run yet.
	ReasonSeekPending = "SeekPending"
	// ReasonSeekFailed (SeekCompleted=False): the executor reported an error. When it gave a
	// reason of its own - IndexMetadataDisabled, or one of agent/protocol's seek reasons
	// (SeekTimedOut, NoConsumer) - SeekCompleted has that reason instead.
	ReasonSeekFailed = protocol.SeekError
	// ReasonSeekPartiallyApplied (SeekCompleted=False): a partitioned seek moved some
	// partitions' cursors and not the others (status.seek.failedPartitions).
	ReasonSeekPartiallyApplied = protocol.SeekPartiallyApplied
	// ReasonSeekIDReused (SeekCompleted=False): spec.seek names the id of a seek that already
	// ran with another target; it does not run again.
	ReasonSeekIDReused = "SeekIDReused"
	// ReasonRetentionDeletesBacklog (BacklogAtRisk=True): a TTL or an evicting quota will delete
	// waiting messages soon; the message says which and when.
	ReasonRetentionDeletesBacklog = "RetentionDeletesBacklog"
	// ReasonBacklogSafe (BacklogAtRisk=False): nothing will delete waiting messages within the
	// lead time, or consumption runs.
	ReasonBacklogSafe = "BacklogSafe"
	// ReasonBacklogUnknown (BacklogAtRisk=Unknown): the agent could not read the backlog or the
	// retention policies (e.g. the admin API refused the application's credentials).
	ReasonBacklogUnknown = "BacklogUnknown"

	// ReasonIndexMetadataDisabled (SeekCompleted=False): the broker does not store entry indexes;
	// enable brokerEntryMetadataInterceptors=AppendIndexMetadataInterceptor.
	ReasonIndexMetadataDisabled = protocol.SeekIndexMetadataDisabled
)
