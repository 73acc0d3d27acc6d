package controllers

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

const (
	// maxAgentsListed bounds status.agents (the CRD allows 50).
	maxAgentsListed = 50
	// maxAgentText bounds what one agent puts into status (an error body, a conflict, a
	// consumer's name): agents are not trusted to keep theirs short, and the API server refuses
	// a whole status write when one condition message passes 32768 bytes.
	maxAgentText = 512
	// maxConditionMessage bounds every condition message, well inside the API's 32768 bytes.
	maxConditionMessage = 8192
)

// clip cuts s to at most n bytes on a rune boundary, marking the cut.
func clip(s string, n int) string {
	const mark = "…"
	if len(s) <= n {
		return s
	}
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

// podOutcome is one matched pod's answer to the push of the current revision.
type podOutcome struct {
	Pod    string
	Status *protocol.FlowStatus // nil when the agent did not answer
	Err    error
	// PreviousToken: the agent accepted only the token its Secret held before a rotation.
	PreviousToken bool
	// Wiring says why the pod may not be wired for subflow, when its agent did not answer.
	Wiring []string
}

// observation is everything the status is computed from in one reconcile.
type observation struct {
	Effective Effective
	// Conditions is what the evaluation of spec.pauseWhen found (its statuses are in
	// flow.Status.PauseWhen already: EffectiveState read them).
	Conditions conditionOutcome
	Revision   int64
	Outcomes   []podOutcome // one per matched pod, sorted by pod name
	Executor   string       // pod executing the current seek
	TokenRef   string       // "namespace/name key" for messages
	Tokens     agentTokens  // what was offered, to tell a rotation in progress
	Now        time.Time
	// PreviousRevision and PreviousAgents are the status before this reconcile.
	PreviousRevision int64
	PreviousAgents   []subflowv1.AgentStatus
	// HeldBy are the pods that may hold the rule after this reconcile's releases.
	HeldBy []string
	// Unreleased are pods that no longer match and whose release failed, with the error.
	Unreleased []string
	// Reporter is the pod asked to read the subscription's backlog.
	Reporter string
	// Subscription is the flow's, whose figures the reporter's answer holds beside others'.
	Subscription string
	// Watcher is the pod asked for the backlogs the flow's backlog conditions read; when
	// there is none, WatcherMissing says why.
	Watcher, WatcherMissing string
	// BacklogLeadTime is how early BacklogAtRisk warns of a predicted deletion.
	BacklogLeadTime time.Duration
	// Orphaned are the UIDs of rules agents reported holding consumers whose flow is gone.
	Orphaned map[string]bool
	// Selector is the flow's pod selector as kubectl writes it, for the release command.
	Selector string
	// HeldUntil is when the first pod held back for failing (podbackoff.go) may be pushed
	// again; zero when none is. For the requeue only.
	HeldUntil time.Time
}

// backlogRisk assesses what the reporter answered, if it did.
func (obs observation) backlogRisk() *backlogRisk {
	for _, o := range obs.Outcomes {
		if o.Pod == obs.Reporter && o.Status != nil {
			return assessBacklog(o.Pod, obs.Subscription, o.Status.Backlog, obs.Now, obs.BacklogLeadTime)
		}
	}
	return nil
}

// stallNote is the Key_Shared stall the reporter saw, if any; it goes last in Ready's message,
// where the event takes it from.
func (r *backlogRisk) stallNote() string {
	if r == nil {
		return ""
	}
	return r.stall
}

// agentStates counts every matched pod's agent by observed state, for metrics (the status
// lists at most maxAgentsListed).
func (obs observation) agentStates() map[string]int {
	counts := map[string]int{}
	for _, o := range obs.Outcomes {
		counts[outcomeState(o)]++
	}
	return counts
}

// outcomeState is a pod's state in status.agents: its consumers' common state, the reason
// with which its agent refused the revision, or Unreachable.
func outcomeState(o podOutcome) string {
	switch reason := refusal(o.Err); {
	case o.Status != nil:
		return commonState(o.Status.Consumers)
	case reason != "":
		return reason
	default:
		return "Unreachable"
	}
}

// refusal is the reason with which an agent that works refused the flow's revision and
// changed nothing - AgentTooOld (it lacks a feature the request requires) or TooManyFlows (it
// holds as many flow rules as it may) - or "" for any other outcome. Such a pod answered: it
// is neither unreachable nor synced, and its consumers are not known to follow the flow.
func refusal(err error) string {
	switch {
	case IsAgentTooOld(err):
		return subflowv1.ReasonAgentTooOld
	case IsTooManyFlows(err):
		return subflowv1.ReasonTooManyFlows
	}
	return ""
}

// unanswered reports whether a pod's agent gave no answer to the revision (a refusal is one).
func unanswered(o podOutcome) bool { return o.Status == nil && refusal(o.Err) == "" }

const (
	tooOldAdvice       = "upgrade the application's agent or the sidecar image"
	tooManyFlowsAdvice = "release another flow that selects the pod"
)

// refusalCause says why a pod's agent refused the revision, without the advice.
func refusalCause(err error) string {
	var agentErr *AgentError
	if !errors.As(err, &agentErr) || !IsAgentTooOld(err) {
		return "the agent holds as many flow rules as it may"
	}
	lacks := "a feature the flow requires"
	if len(agentErr.MissingFeatures) > 0 {
		lacks = strings.Join(agentErr.MissingFeatures, ", ")
	}
	return fmt.Sprintf("agent protocol %d lacks %s", protocolVersion(agentErr.ProtocolVersion), lacks)
}

// refusalMessage is a refusing pod's message in status.agents: the cause and what to do.
func refusalMessage(err error) string {
	advice := tooManyFlowsAdvice
	if IsAgentTooOld(err) {
		advice = tooOldAdvice
	}
	return fit(maxAgentText, ": ", refusalCause(err), advice)
}

// protocolVersion is the protocol an agent reported speaking; none means version 1.
func protocolVersion(v int) int32 {
	return int32(min(max(v, 1), math.MaxInt32))
}

// maxAgentVersion bounds status.agents[].agentVersion (the CRD's maxLength).
const maxAgentVersion = 64

// computeStatus derives the whole status from the observation; old carries over condition
// transition times and the seek result of earlier reconciles.
func computeStatus(flow *subflowv1.SubscriptionFlow, obs observation) subflowv1.SubscriptionFlowStatus {
	st := subflowv1.SubscriptionFlowStatus{
		ObservedGeneration: flow.Generation,
		Revision:           obs.Revision,
		EffectiveState:     obs.Effective.State,
		StateSource:        obs.Effective.Source,
		Conditions:         append([]metav1.Condition(nil), flow.Status.Conditions...),
		Backlog:            flow.Status.Backlog.DeepCopy(),
		PauseWhen:          flow.Status.PauseWhen,
	}
	if obs.Effective.Next != nil {
		st.NextTransitionTime = &metav1.Time{Time: *obs.Effective.Next}
	}
	st.Pods, st.Consumers, st.Agents = countOutcomes(obs)
	st.HeldBy = obs.HeldBy
	st.Seek = seekStatus(flow, obs)
	ready, reason, message := readiness(flow.Spec, obs, st)
	risk := obs.backlogRisk()
	// The notes keep their beginning however long the reason is: the Key_Shared stall's event
	// is found by its note's first words.
	message = fit(maxConditionMessage, "; ", append([]string{message}, append(slices.Clone(obs.Effective.Notes),
		rotationNote(obs), risk.stallNote())...)...)
	setCondition(&st, subflowv1.ConditionReady, ready, reason, message)
	stalled := reason == subflowv1.ReasonAgentAuthFailed || reason == subflowv1.ReasonInvalidSpec
	if ready == metav1.ConditionTrue || stalled {
		setCondition(&st, subflowv1.ConditionReconciling, metav1.ConditionFalse, "", "")
	} else {
		setCondition(&st, subflowv1.ConditionReconciling, metav1.ConditionTrue, subflowv1.ReasonProgressing,
			fmt.Sprintf("Driving agents to %s at revision %d", obs.Effective.State, obs.Revision))
	}
	if stalled {
		setCondition(&st, subflowv1.ConditionStalled, metav1.ConditionTrue, reason, message)
	} else {
		setCondition(&st, subflowv1.ConditionStalled, metav1.ConditionFalse, "", "")
	}
	paused, pausedReason, pausedMessage := pausedCondition(obs, st)
	setCondition(&st, subflowv1.ConditionPaused, paused, pausedReason, pausedMessage)
	setSeekCondition(&st, flow, obs)
	setBacklogCondition(&st, risk, obs.Effective.State, obs.BacklogLeadTime)
	setAutoPausedCondition(&st, flow, obs.Conditions.descriptions)
	stampTransitions(st.Conditions, flow.Status.Conditions, obs.Now)
	return st
}

// stampTransitions dates the conditions whose status changed since before with now, the
// reconciler's clock, like every other time in the status (meta.SetStatusCondition takes the
// wall clock).
func stampTransitions(conditions, before []metav1.Condition, now time.Time) {
	for i := range conditions {
		if old := meta.FindStatusCondition(before, conditions[i].Type); old == nil || old.Status != conditions[i].Status {
			conditions[i].LastTransitionTime = metav1.NewTime(now)
		}
	}
}

// stalledStatus is the status of a flow whose spec cannot be applied: everything observed before
// stays as it was (agents were not touched), the conditions say why.
func stalledStatus(flow *subflowv1.SubscriptionFlow, reason, message string, now time.Time) subflowv1.SubscriptionFlowStatus {
	st := *flow.Status.DeepCopy()
	st.ObservedGeneration = flow.Generation
	setCondition(&st, subflowv1.ConditionReady, metav1.ConditionFalse, reason, message)
	setCondition(&st, subflowv1.ConditionStalled, metav1.ConditionTrue, reason, message)
	setCondition(&st, subflowv1.ConditionReconciling, metav1.ConditionFalse, "", "")
	stampTransitions(st.Conditions, flow.Status.Conditions, now)
	return st
}

// hostKind is what serves a pod's control API; agents older than the sidecar do not say.
func hostKind(kind string) string {
	if kind == protocol.KindSidecar {
		return kind
	}
	return protocol.KindAgent
}

func countOutcomes(obs observation) (subflowv1.PodCounts, subflowv1.ConsumerCounts, []subflowv1.AgentStatus) {
	var pods subflowv1.PodCounts
	var consumers subflowv1.ConsumerCounts
	agents := make([]subflowv1.AgentStatus, 0, len(obs.Outcomes))
	for _, o := range obs.Outcomes {
		pods.Matched++
		agent := subflowv1.AgentStatus{Pod: o.Pod}
		if reason := refusal(o.Err); o.Status == nil && reason != "" {
			pods.Refused++
			var agentErr *AgentError
			errors.As(o.Err, &agentErr)
			agent.State, agent.Message, agent.ProtocolVersion = reason, refusalMessage(o.Err), protocolVersion(agentErr.ProtocolVersion)
			agents = append(agents, agent)
			continue
		}
		if o.Status == nil {
			pods.Unreachable++
			agent.State, agent.Message = "Unreachable", unreachableText(o)
			agents = append(agents, agent)
			continue
		}
		pods.Synced++
		agent.Kind = hostKind(o.Status.Kind)
		agent.AgentVersion, agent.ProtocolVersion = clip(o.Status.AgentVersion, maxAgentVersion), protocolVersion(o.Status.ProtocolVersion)
		agent.LastSyncTime = lastSync(obs, o.Pod)
		agent.State = commonState(o.Status.Consumers)
		agent.Message = clip(o.Status.Conflict, maxAgentText)
		if len(o.Status.HeldBy) > 0 {
			agent.Message = clip(heldAgentMessage(obs, o.Status.HeldBy), maxAgentText)
		}
		if o.PreviousToken && agent.Message == "" {
			agent.Message = "accepts only the previous token: its copy of the rotated Secret is not updated yet"
		}
		for _, c := range o.Status.Consumers {
			agent.Consumers++
			agent.HeldMessages += c.HeldMessages
			agent.ReceivedWhilePaused += c.ReceivedWhilePaused
			consumers.Total++
			switch c.State {
			case protocol.Running:
				consumers.Running++
			case protocol.Paused:
				consumers.Paused++
			case protocol.Stopped:
				consumers.Stopped++
			}
		}
		agents = append(agents, agent)
	}
	consumers.Halted = fmt.Sprintf("%d/%d", consumers.Paused+consumers.Stopped, consumers.Total)
	// Problems first, so that a bounded list still shows what needs attention.
	sort.SliceStable(agents, func(i, j int) bool { return agentRank(agents[i]) < agentRank(agents[j]) })
	if len(agents) > maxAgentsListed {
		agents = agents[:maxAgentsListed]
	}
	return pods, consumers, agents
}

// lastSync keeps the time a pod first applied the current revision, so that a resync that
// changes nothing leaves the status as it is (and writes nothing).
func lastSync(obs observation, pod string) *metav1.Time {
	if obs.PreviousRevision == obs.Revision {
		for _, a := range obs.PreviousAgents {
			if a.Pod == pod && a.LastSyncTime != nil {
				return a.LastSyncTime.DeepCopy()
			}
		}
	}
	now := metav1.NewTime(obs.Now)
	return &now
}

func agentRank(a subflowv1.AgentStatus) int {
	switch {
	case a.State == "Unreachable":
		return 0
	case a.Message != "" || a.State == "Mixed":
		return 1
	default:
		return 2
	}
}

func commonState(consumers []protocol.ConsumerStatus) string {
	if len(consumers) == 0 {
		return "NoConsumers"
	}
	state := consumers[0].State
	for _, c := range consumers[1:] {
		if c.State != state {
			return "Mixed"
		}
	}
	return string(state)
}

// readiness: what needs a person first (spec problems, auth failures), then unreachable agents,
// holders not yet released, then consumers not yet in the effective state.
func readiness(spec subflowv1.SubscriptionFlowSpec, obs observation, st subflowv1.SubscriptionFlowStatus) (metav1.ConditionStatus, string, string) {
	if len(obs.Effective.Problems) > 0 {
		return metav1.ConditionFalse, subflowv1.ReasonInvalidSpec, strings.Join(obs.Effective.Problems, "; ") +
			"; the rest of the spec applies"
	}
	if pods := podsWhere(obs, func(o podOutcome) bool { return IsUnauthorized(o.Err) }); len(pods) > 0 {
		return metav1.ConditionFalse, subflowv1.ReasonAgentAuthFailed, authAdvice(obs, pods)
	}
	if pods := podsWhere(obs, unanswered); len(pods) > 0 {
		return metav1.ConditionFalse, subflowv1.ReasonAgentsUnreachable, fmt.Sprintf(
			"%d of %d agents unreachable: %s", len(pods), st.Pods.Matched, describeUnreachable(obs))
	}
	if pods := refusedPods(obs, subflowv1.ReasonAgentTooOld); len(pods) > 0 {
		return metav1.ConditionFalse, subflowv1.ReasonAgentTooOld, fmt.Sprintf(
			"%d of %d agents are too old for revision %d and changed nothing: %s; %s", len(pods), st.Pods.Matched,
			obs.Revision, listNames(pods), tooOldAdvice)
	}
	if pods := refusedPods(obs, subflowv1.ReasonTooManyFlows); len(pods) > 0 {
		return metav1.ConditionFalse, subflowv1.ReasonTooManyFlows, fmt.Sprintf(
			"%d of %d agents hold as many flow rules as they may and refused this flow: %s; %s", len(pods), st.Pods.Matched,
			listNames(pods), tooManyFlowsAdvice)
	}
	if pods := obs.Unreleased; len(pods) > 0 {
		return metav1.ConditionFalse, subflowv1.ReasonReleasePending, fmt.Sprintf(
			"Pods that no longer match still hold the rule; releasing: %s", listNames(pods))
	}
	if st.Pods.Matched == 0 {
		return metav1.ConditionTrue, subflowv1.ReasonNoMatchingPods, "No running pod matches spec.selector"
	}
	if st.Consumers.Total == 0 {
		return metav1.ConditionFalse, subflowv1.ReasonNoMatchingConsumers, noConsumersMessage(spec, obs)
	}
	if lagging := laggingConsumers(obs); len(lagging) > 0 {
		return metav1.ConditionFalse, subflowv1.ReasonConsumersConverging, fmt.Sprintf(
			"Consumers not yet %s: %s", obs.Effective.State, listNames(lagging))
	}
	if held := heldConsumers(obs); len(held) > 0 {
		return metav1.ConditionFalse, subflowv1.ReasonHeldByOtherRule, fmt.Sprintf(
			"Consumers held in a more restrictive state than %s: %s", obs.Effective.State, heldMessage(obs, held))
	}
	return metav1.ConditionTrue, subflowv1.ReasonSynced, fmt.Sprintf(
		"%d agents applied revision %d: %d consumers %s", st.Pods.Synced, obs.Revision, st.Consumers.Total, obs.Effective.State)
}

// refusedPods names the pods whose agents refused the revision with reason, with the cause.
func refusedPods(obs observation, reason string) []string {
	var pods []string
	for _, o := range obs.Outcomes {
		if o.Status == nil && refusal(o.Err) == reason {
			pods = append(pods, clip(fmt.Sprintf("%s (%s)", o.Pod, refusalCause(o.Err)), maxAgentText))
		}
	}
	return pods
}

// authAdvice says why agents refused the token, given what the controller saw of rotations.
func authAdvice(obs observation, pods []string) string {
	const mount = "the kubelet updates a Secret mounted as a volume within a minute or two, but never one mounted " +
		"with subPath or read into an environment variable"
	switch t := obs.Tokens; {
	case t.rotating():
		return fmt.Sprintf("Agents in %s refused both the token from Secret %s and the one it held before its rotation %s ago; "+
			"make the pods mount that Secret: %s", listNames(pods), obs.TokenRef, ago(obs.Now, t.RotatedAt), mount)
	case !t.RotatedAt.IsZero():
		return fmt.Sprintf("Agents in %s still refuse the token from Secret %s, rotated %s ago: their copy was not updated "+
			"(%s); restart those pods", listNames(pods), obs.TokenRef, ago(obs.Now, t.RotatedAt), mount)
	default:
		return fmt.Sprintf("Agents in %s refused the token from Secret %s; make the pods mount that Secret as a volume and "+
			"give its file to the agent (a subPath mount is never updated)", listNames(pods), obs.TokenRef)
	}
}

// rotationNote names the agents that accept only the previous token while a rotation's grace
// lasts, so that an operator sees a rotation in progress and when it must be over.
func rotationNote(obs observation) string {
	pods := podsWhere(obs, func(o podOutcome) bool { return o.PreviousToken })
	if len(pods) == 0 {
		return ""
	}
	return fmt.Sprintf("token rotation in progress: agents in %s still accept only the previous token of Secret %s, "+
		"offered to them until %s", listNames(pods), obs.TokenRef, obs.Tokens.Until.UTC().Format(time.RFC3339))
}

func ago(now, then time.Time) string { return now.Sub(then).Round(time.Second).String() }

// noConsumersMessage says what the flow asked for and what the matched pods' agents consume.
func noConsumersMessage(spec subflowv1.SubscriptionFlowSpec, obs observation) string {
	wanted := fmt.Sprintf("subscription %q", spec.Subscription)
	if spec.Topic != "" {
		wanted += fmt.Sprintf(" on topic %q", spec.Topic)
	}
	var have []string
	for _, o := range obs.Outcomes {
		if o.Status == nil {
			continue
		}
		for _, c := range o.Status.OtherConsumers {
			ref := clip(fmt.Sprintf("%q on %s", c.Subscription, c.Topic), maxAgentText)
			if !slices.Contains(have, ref) {
				have = append(have, ref)
			}
		}
	}
	agents := "their agents have no consumer at all"
	if len(have) > 0 {
		agents = "their agents consume " + listNames(have)
	}
	return fmt.Sprintf("No consumer of %s in the %d matched pods, so nothing is %s; %s", wanted, len(obs.Outcomes),
		strings.ToLower(string(obs.Effective.State)), agents)
}

func pausedCondition(obs observation, st subflowv1.SubscriptionFlowStatus) (metav1.ConditionStatus, string, string) {
	if obs.Effective.State == subflowv1.StateRunning {
		return metav1.ConditionFalse, subflowv1.ReasonRunning, "The effective state is Running"
	}
	// Zero consumers is never paused: nothing was observed halting.
	if st.Pods.Matched == 0 {
		return metav1.ConditionFalse, subflowv1.ReasonNoMatchingPods, "No running pod matches spec.selector: no consumer is paused"
	}
	if st.Pods.Unreachable == 0 && st.Pods.Refused == 0 && st.Consumers.Total == 0 {
		return metav1.ConditionFalse, subflowv1.ReasonNoMatchingConsumers, "The matched pods have no consumer of the flow: none is paused"
	}
	// A pod whose agent refused the revision is not paused by it, whatever it did before.
	if st.Pods.Unreachable > 0 || st.Pods.Refused > 0 {
		return metav1.ConditionFalse, subflowv1.ReasonPausePending, unobservedMessage(obs, st)
	}
	if st.Consumers.Running > 0 {
		return metav1.ConditionFalse, subflowv1.ReasonPausePending, fmt.Sprintf(
			"%d of %d consumers still running", st.Consumers.Running, st.Consumers.Total)
	}
	source := string(obs.Effective.Source)
	if obs.Effective.Reason != "" {
		source += ": " + obs.Effective.Reason
	}
	return metav1.ConditionTrue, subflowv1.ReasonConsumersPaused, fmt.Sprintf(
		"%d/%d consumers paused or stopped (%s, from %s)", st.Consumers.Paused+st.Consumers.Stopped,
		st.Consumers.Total, obs.Effective.State, source)
}

// unobservedMessage says what a pause is waiting for when some pods' agents did not answer or
// refused the revision: it counts only the consumers it saw, and names the pods whose
// consumers it could not see, which may well be running.
func unobservedMessage(obs observation, st subflowv1.SubscriptionFlowStatus) string {
	var unknown []string
	if pods := podsWhere(obs, unanswered); len(pods) > 0 {
		unknown = append(unknown, fmt.Sprintf("%d %s unreachable, %s consumers' state unknown: %s", len(pods),
			plural(len(pods), "pod", "pods"), plural(len(pods), "its", "their"), listNames(pods)))
	}
	var refused []string
	for _, o := range obs.Outcomes {
		if reason := refusal(o.Err); o.Status == nil && reason != "" {
			refused = append(refused, fmt.Sprintf("%s (%s)", o.Pod, reason))
		}
	}
	if n := len(refused); n > 0 {
		unknown = append(unknown, fmt.Sprintf("%d %s refused revision %d, %s consumers not known to be %s: %s", n,
			plural(n, "pod", "pods"), obs.Revision, plural(n, "its", "their"), strings.ToLower(string(obs.Effective.State)), listNames(refused)))
	}
	switch {
	case st.Pods.Synced > 0:
		return fmt.Sprintf("%d of the %d consumers in reachable pods still running; %s", st.Consumers.Running, st.Consumers.Total,
			strings.Join(unknown, "; "))
	case len(refused) > 0:
		return fmt.Sprintf("No agent applied revision %d; %s", obs.Revision, strings.Join(unknown, "; "))
	default:
		return "No agent answered; " + strings.Join(unknown, "; ")
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// seekStatus keeps a finished seek's result and records the executor of a pending one.
func seekStatus(flow *subflowv1.SubscriptionFlow, obs observation) *subflowv1.SeekStatus {
	seek := flow.Spec.Seek
	if seek == nil {
		// The last seek that ran stays recorded, so that adding it back with its id and another
		// target is recognised (SeekIDReused) instead of run again; a pending one is withdrawn.
		if old := flow.Status.Seek; old != nil && old.CompletionTime != nil {
			return old.DeepCopy()
		}
		return nil
	}
	if old := flow.Status.Seek; old != nil && old.ID == seek.ID && old.CompletionTime != nil {
		return old.DeepCopy()
	}
	st := &subflowv1.SeekStatus{ID: seek.ID, Executor: obs.Executor}
	for _, o := range obs.Outcomes {
		if o.Pod != obs.Executor || o.Status == nil || o.Status.Seek == nil || o.Status.Seek.ID != seek.ID {
			continue
		}
		switch o.Status.Seek.State {
		case protocol.SeekSucceeded, protocol.SeekFailed:
			now := metav1.NewTime(obs.Now)
			st.CompletionTime = &now
			st.Positions, st.FailedPartitions = seekOutcome(o.Status.Seek)
			requestedIndexes(st.Positions, seek)
			if o.Status.Seek.State == protocol.SeekFailed {
				st.Reason = seekReason(o.Status.Seek)
				st.Message = clip(st.Reason+": "+o.Status.Seek.Error, maxAgentText)
			}
		}
	}
	return st
}

// requestedIndexes puts the spec's index of each partition into the positions, as the API says
// (index requested): an agent reports the index it resolved, which differs for an index before
// the first entry or past the last (it seeks to the earliest or the latest), and a position
// that does not repeat the request would read as another target under the same id
// (SeekIDReused) at the next reconcile. Where the cursor went is the messageID.
func requestedIndexes(positions []subflowv1.SeekPosition, seek *subflowv1.SeekSpec) {
	for i, p := range positions {
		switch {
		case p.Partition == -1 && seek.Index != nil:
			positions[i].Index = *seek.Index
		case p.Partition >= 0:
			if j := slices.IndexFunc(seek.Partitions, func(q subflowv1.PartitionIndex) bool { return q.Partition == p.Partition }); j >= 0 {
				positions[i].Index = seek.Partitions[j].Index
			}
		}
	}
}

// seekOutcome is what a finished seek moved and did not move, whatever its state: a seek of a
// partitioned topic can fail after some partitions moved. Bounded as the spec's partitions are.
func seekOutcome(s *protocol.SeekStatus) ([]subflowv1.SeekPosition, []subflowv1.SeekPartitionFailure) {
	var moved []subflowv1.SeekPosition
	for _, p := range s.Positions[:min(len(s.Positions), maxSeekPartitions)] {
		moved = append(moved, subflowv1.SeekPosition{Partition: p.Partition, Index: p.Index, MessageID: clip(p.MessageID, 128),
			Cursor: clip(p.Cursor, 64)})
	}
	var failed []subflowv1.SeekPartitionFailure
	for _, f := range s.Failed[:min(len(s.Failed), maxSeekPartitions)] {
		failed = append(failed, subflowv1.SeekPartitionFailure{Partition: f.Partition, Index: f.Index, Message: clip(f.Error, 256)})
	}
	return moved, failed
}

// maxSeekPartitions bounds what an agent can make the status hold: spec.seek.partitions has at
// most this many items.
const maxSeekPartitions = 1024

// seekReason is the reason an executor gave for a failed seek, or SeekFailed where it gave none
// or one that cannot be a condition's reason: the agent is a peer, and the API server refuses a
// whole status whose condition reason is not a word, so a newer agent's own word passes and
// anything else does not.
func seekReason(s *protocol.SeekStatus) string {
	if seekReasonPattern.MatchString(s.Reason) {
		return s.Reason
	}
	return subflowv1.ReasonSeekFailed
}

// seekReasonPattern is status.seek.reason's validation.
var seekReasonPattern = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9]{0,63}$`)

// recordedSeekReason is the reason of the failed seek status.seek records. A controller before
// status.seek.reason kept it in the message only, and in SeekCompleted, which still gives it
// after an upgrade (a seek dropped from the spec and added back lost it: SeekFailed).
func recordedSeekReason(st *subflowv1.SubscriptionFlowStatus) string {
	if st.Seek.Reason != "" {
		return st.Seek.Reason
	}
	if c := meta.FindStatusCondition(st.Conditions, subflowv1.ConditionSeekCompleted); c != nil && c.Status == metav1.ConditionFalse &&
		c.Reason != subflowv1.ReasonSeekPending && c.Reason != subflowv1.ReasonSeekIDReused {
		return c.Reason
	}
	return subflowv1.ReasonSeekFailed
}

func setSeekCondition(st *subflowv1.SubscriptionFlowStatus, flow *subflowv1.SubscriptionFlow, obs observation) {
	if flow.Spec.Seek == nil {
		meta.RemoveStatusCondition(&st.Conditions, subflowv1.ConditionSeekCompleted)
		return
	}
	seek := st.Seek
	switch {
	case seek.CompletionTime != nil && targetChanged(flow.Spec.Seek, seek):
		setCondition(st, subflowv1.ConditionSeekCompleted, metav1.ConditionFalse, subflowv1.ReasonSeekIDReused,
			fmt.Sprintf("Seek %s already ran (%s); spec.seek now asks for another target under the same id, which does not "+
				"run again: give the new target a new seek.id", seek.ID, describePositions(seek.Positions)))
	case seek.CompletionTime != nil && seek.Message == "":
		setCondition(st, subflowv1.ConditionSeekCompleted, metav1.ConditionTrue, subflowv1.ReasonSeekSucceeded,
			fmt.Sprintf("Seek %s executed by %s: %s", seek.ID, seek.Executor, describePositions(seek.Positions)))
	case seek.CompletionTime != nil && len(seek.Positions) > 0 && len(seek.FailedPartitions) > 0:
		setCondition(st, subflowv1.ConditionSeekCompleted, metav1.ConditionFalse, subflowv1.ReasonSeekPartiallyApplied,
			fmt.Sprintf("Seek %s on %s moved %s, but not %s; those are delivered from where they were. "+
				"To finish, seek them under a new id: kubectl subflow seek %s --retry",
				seek.ID, seek.Executor, describePositions(seek.Positions), describeFailures(seek.FailedPartitions), flow.Name))
	case seek.CompletionTime != nil:
		message := fmt.Sprintf("Seek %s failed on %s: %s", seek.ID, seek.Executor, seek.Message)
		if len(seek.Positions) > 0 {
			message += "; the cursors moved all the same: " + describePositions(seek.Positions)
		}
		setCondition(st, subflowv1.ConditionSeekCompleted, metav1.ConditionFalse, recordedSeekReason(st), message)
	case seek.Executor == "":
		setCondition(st, subflowv1.ConditionSeekCompleted, metav1.ConditionFalse, subflowv1.ReasonSeekPending,
			fmt.Sprintf("Seek %s waits for a reachable pod to execute it", seek.ID))
	default:
		setCondition(st, subflowv1.ConditionSeekCompleted, metav1.ConditionFalse, subflowv1.ReasonSeekPending,
			fmt.Sprintf("Seek %s pending on %s", seek.ID, seek.Executor))
	}
}

// targetChanged reports whether spec asks for other indexes than the seek that ran under its
// id (a seek dropped and added back with the same id and a new index; admission refuses a
// change in place).
func targetChanged(spec *subflowv1.SeekSpec, seek *subflowv1.SeekStatus) bool {
	ran := slices.Clone(seek.Positions)
	for _, f := range seek.FailedPartitions {
		ran = append(ran, subflowv1.SeekPosition{Partition: f.Partition, Index: f.Index})
	}
	if len(ran) == 0 {
		return false // a failed seek resolved nothing to compare with
	}
	want := map[int32]int64{}
	if spec.Index != nil {
		want[-1] = *spec.Index
	}
	for _, p := range spec.Partitions {
		want[p.Partition] = p.Index
	}
	for _, p := range ran {
		if index, ok := want[p.Partition]; !ok || index != p.Index {
			return true
		}
	}
	return len(want) != len(ran)
}

func describeFailures(failures []subflowv1.SeekPartitionFailure) string {
	parts := make([]string, 0, len(failures))
	for _, f := range failures {
		parts = append(parts, fmt.Sprintf("partition %d (index %d: %s)", f.Partition, f.Index, f.Message))
	}
	return strings.Join(parts, ", ")
}

func describePositions(positions []subflowv1.SeekPosition) string {
	parts := make([]string, 0, len(positions))
	for _, p := range positions {
		parts = append(parts, fmt.Sprintf("partition %d index %d at %s", p.Partition, p.Index, p.MessageID))
	}
	return strings.Join(parts, ", ")
}

// setCondition sets a condition; kstatus wants Reconciling and Stalled absent unless True.
func setCondition(st *subflowv1.SubscriptionFlowStatus, condType string, status metav1.ConditionStatus, reason, message string) {
	if status != metav1.ConditionTrue && (condType == subflowv1.ConditionReconciling || condType == subflowv1.ConditionStalled) {
		meta.RemoveStatusCondition(&st.Conditions, condType)
		return
	}
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: condType, Status: status, Reason: reason,
		Message: clip(message, maxConditionMessage), ObservedGeneration: st.ObservedGeneration})
}

func podsWhere(obs observation, pred func(podOutcome) bool) []string {
	var pods []string
	for _, o := range obs.Outcomes {
		if pred(o) {
			pods = append(pods, o.Pod)
		}
	}
	return pods
}

func describeUnreachable(obs observation) string {
	var parts []string
	for _, o := range obs.Outcomes {
		if unanswered(o) && !IsUnauthorized(o.Err) {
			parts = append(parts, fmt.Sprintf("%s (%s)", o.Pod, unreachableText(o)))
		}
	}
	return listNames(parts)
}

// laggingConsumers names consumers ("pod/consumer on topic") less restrictive than the effective
// state. A consumer more restrictive than this flow asks (another flow, the application's own
// Pause) is not lagging; the agent reports such conflicts.
func laggingConsumers(obs observation) []string {
	want := protocol.State(obs.Effective.State)
	var lagging []string
	for _, o := range obs.Outcomes {
		if o.Status == nil {
			continue
		}
		for _, c := range o.Status.Consumers {
			if protocol.MostRestrictive(c.State, want) != c.State {
				lagging = append(lagging, clip(fmt.Sprintf("%s/%s on %s (%s)", o.Pod, c.Name, c.Topic, c.State), maxAgentText))
			}
		}
	}
	return lagging
}

// heldAgentMessage is one agent's line in status.agents about the rules holding its consumers.
func heldAgentMessage(obs observation, refs []protocol.RuleRef) string {
	var names []string
	for _, ref := range refs {
		orphan := ""
		if obs.Orphaned[ref.UID] {
			orphan = ", orphaned: its flow no longer exists"
		}
		names = append(names, fmt.Sprintf("%s/%s (uid %s, %s%s)", ref.Namespace, ref.Name, ref.UID, ref.State, orphan))
	}
	return "held by " + strings.Join(names, "; ")
}

// heldConsumers returns the consumers more restrictive than the effective state, by pod.
func heldConsumers(obs observation) map[string][]string {
	want := protocol.State(obs.Effective.State)
	held := map[string][]string{}
	for _, o := range obs.Outcomes {
		if o.Status == nil {
			continue
		}
		for _, c := range o.Status.Consumers {
			if c.State != want {
				held[o.Pod] = append(held[o.Pod], fmt.Sprintf("%s (%s)", c.Name, c.State))
			}
		}
	}
	return held
}

// heldMessage names the held consumers and the rules holding them; for a rule whose flow is
// gone it gives the command that releases it.
func heldMessage(obs observation, held map[string][]string) string {
	var consumers, rules []string
	for _, o := range obs.Outcomes {
		if len(held[o.Pod]) == 0 {
			continue
		}
		consumers = append(consumers, clip(o.Pod+"/"+strings.Join(held[o.Pod], ", "), maxAgentText))
		for _, ref := range o.Status.HeldBy {
			if text := describeRule(obs, ref); !slices.Contains(rules, text) {
				rules = append(rules, text)
			}
		}
	}
	msg := listNames(consumers)
	if len(rules) > 0 {
		msg += "; held by " + listNames(rules)
	}
	return msg
}

// describeRule names a rule holding consumers: another flow, or an orphan with its release.
func describeRule(obs observation, ref protocol.RuleRef) string {
	name := clip(ref.Namespace+"/"+ref.Name, maxAgentText)
	if !obs.Orphaned[ref.UID] {
		return fmt.Sprintf("flow %s (%s)", name, ref.State)
	}
	return clip(fmt.Sprintf("the rule %s (uid %s, %s) of a flow that no longer exists (deleted with deletionPolicy Retain); "+
		"release it with: kubectl subflow release %s -n %s --selector %q", name, ref.UID, ref.State, ref.Name, ref.Namespace,
		obs.Selector), 2*maxAgentText)
}

// listNames joins names, eliding after ten so that messages stay readable.
func listNames(names []string) string {
	const shown = 10
	if len(names) > shown {
		return strings.Join(names[:shown], ", ") + fmt.Sprintf(" and %d more", len(names)-shown)
	}
	return strings.Join(names, ", ")
}

// unreachableText says why a pod's agent did not answer: its wiring problems first (the cause),
// then the error (the symptom), each keeping its beginning within maxAgentText.
func unreachableText(o podOutcome) string {
	return fit(maxAgentText, "; ", append(slices.Clone(o.Wiring), errorText(o.Err))...)
}

// fit joins the non-empty parts with sep in at most n bytes. When they do not fit, the room is
// shared out: a part shorter than its share is kept whole and the others are clipped to what
// is left, each keeping its beginning, where it says what it is about. A plain cut would drop
// the last parts whole (a note after a long list, a second cause after a long first one).
func fit(n int, sep string, parts ...string) string {
	parts = slices.DeleteFunc(slices.Clone(parts), func(p string) bool { return p == "" })
	size := make([]int, len(parts)) // 0: not decided yet (every part is at least 1 byte)
	room, undecided := n-len(sep)*max(len(parts)-1, 0), len(parts)
	for undecided > 0 {
		share, decided := max(room/undecided, len("…")), false
		for i, p := range parts {
			if size[i] == 0 && len(p) <= share {
				size[i], room, undecided, decided = len(p), room-len(p), undecided-1, true
			}
		}
		if !decided { // every part left is longer than its share: clip each to it
			for i := range parts {
				if size[i] == 0 {
					size[i] = share
				}
			}
			break
		}
	}
	for i := range parts {
		parts[i] = clip(parts[i], size[i])
	}
	return strings.Join(parts, sep)
}

func errorText(err error) string {
	if err == nil {
		return "no pod IP yet"
	}
	return clip(err.Error(), maxAgentText)
}
