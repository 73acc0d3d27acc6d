package controllers

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/controllers/pausewhen"
)

// A paused subscription's backlog grows on the broker, and a message TTL or a backlog quota with
// the consumer_backlog_eviction policy deletes waiting messages: a pause can lose data that no
// consumer ever saw. One agent per flow (the reporter) reads the backlog and the retention in
// force through the admin API; the controller predicts the first deletion and warns before it.

// DefaultBacklogLeadTime is how long before a predicted deletion BacklogAtRisk turns True.
const DefaultBacklogLeadTime = time.Hour

// sizeQuotaWarnRatio: a size quota evicts as soon as it is exceeded, at no predictable time, so
// the warning starts when the backlog reaches this share of it.
const sizeQuotaWarnRatio = 0.8

// backlogRecheck bounds how stale the backlog figures get while consumption is halted.
const backlogRecheck = time.Minute

// backlogReporter is the pod asked to read the backlog while consumption is halted (running
// consumers drain it, so nobody reads it then): one pod per flow, spread over the pods by the
// flow's UID so that many flows on the same pods do not all load one agent.
func backlogReporter(flow *subflowv1.SubscriptionFlow, state subflowv1.FlowState, pods []*corev1.Pod) string {
	if state == subflowv1.StateRunning {
		return ""
	}
	var candidates []string
	for _, pod := range pods {
		if pushable(pod) {
			candidates = append(candidates, pod.Name)
		}
	}
	if len(candidates) == 0 {
		return ""
	}
	return pickByUID(flow, candidates)
}

// backlogOfVersion is the first agent protocol that reads other subscriptions' backlogs
// (protocol.FlowRequest.BacklogOf).
const backlogOfVersion = 3

// backlogSubscriptions are the other subscriptions the flow's backlog conditions read, each
// once, in spec order (the API server refuses the flow's own).
func backlogSubscriptions(flow *subflowv1.SubscriptionFlow) []string {
	var subs []string
	for _, c := range flow.Spec.PauseWhen {
		if c.Backlog != nil && c.Backlog.Subscription != flow.Spec.Subscription && !slices.Contains(subs, c.Backlog.Subscription) {
			subs = append(subs, c.Backlog.Subscription)
		}
	}
	return subs[:min(len(subs), protocol.MaxBacklogOf)]
}

// backlogWatcher is the pod asked for the backlogs that the flow's backlog conditions read,
// whatever the flow's state (a paused flow must see the other subscription recover): one pod
// whose agent reported protocol 3 or later, picked by the flow's UID as backlogReporter picks,
// so that both are usually the same pod. An agent that never answered is not asked: a request
// it could not serve would be refused whole, state included. Empty, with the reason, when no
// pod can be asked.
func backlogWatcher(flow *subflowv1.SubscriptionFlow, pods []*corev1.Pod) (pod, missing string) {
	if len(backlogSubscriptions(flow)) == 0 {
		return "", ""
	}
	versions := map[string]int32{}
	for _, a := range flow.Status.Agents {
		versions[a.Pod] = a.ProtocolVersion
	}
	var candidates []string
	answered := 0
	for _, p := range pods {
		if !pushable(p) {
			continue
		}
		if v, ok := versions[p.Name]; ok {
			answered++
			if v >= backlogOfVersion {
				candidates = append(candidates, p.Name)
			}
		}
	}
	switch {
	case len(candidates) > 0:
		return pickByUID(flow, candidates), ""
	case answered == 0:
		return "", "waiting for an agent of the flow's pods to answer"
	}
	return "", fmt.Sprintf("no agent of the flow's pods speaks protocol %d or later, which reads other subscriptions' backlogs: "+
		"upgrade the agent library or the sidecar", backlogOfVersion)
}

// pickByUID spreads flows over pods: many flows on the same pods do not all load one agent.
func pickByUID(flow *subflowv1.SubscriptionFlow, names []string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(flow.UID))
	return names[h.Sum32()%uint32(len(names))]
}

// backlogFiguresOf is what the watcher answered, for the flow's backlog conditions.
func backlogFiguresOf(watcher, missing string, outcomes []podOutcome) pausewhen.BacklogFigures {
	if watcher == "" {
		return pausewhen.BacklogFigures{Missing: missing}
	}
	for _, o := range outcomes {
		if o.Pod != watcher {
			continue
		}
		if o.Status == nil {
			reason := "no answer yet"
			if o.Err != nil {
				reason = o.Err.Error()
			}
			return pausewhen.BacklogFigures{Pod: watcher, Missing: fmt.Sprintf("pod %s did not answer: %s", watcher, reason)}
		}
		return pausewhen.BacklogFigures{Pod: watcher, Entries: o.Status.Backlog}
	}
	return pausewhen.BacklogFigures{Pod: watcher, Missing: fmt.Sprintf("pod %s was not asked", watcher)}
}

// backlogRisk is the prediction made from one reporter's answer.
type backlogRisk struct {
	status  *subflowv1.BacklogStatus
	atRisk  bool   // within the lead time, or a size quota nearly full
	unknown string // why nothing could be read
	warning string // what will delete what, and when
	stall   string // a Key_Shared dispatch stall, for Ready's message and the event
}

// keySharedStallNote starts the note of a Key_Shared dispatch stall in Ready's message; the
// event is emitted when a note with it appears.
const keySharedStallNote = "Key_Shared dispatch stalled"

// stallNote explains a Key_Shared stall the reporter saw on one topic, with the advice.
func stallNote(b protocol.BacklogStatus) string {
	s := b.KeySharedStall
	return fmt.Sprintf("%s on %s: %s take no messages, and the running %s get none while %d entries wait "+
		"(the broker's replay queue holds %d entries of the halted consumers' keys and stops reading for every "+
		"consumer at its look-ahead limit); pause every consumer of a Key_Shared subscription together, "+
		"or set the halted ones to Stopped so that their keys move to the running ones",
		keySharedStallNote, b.Topic, countedNames(s.Halted, s.HaltedCount, "consumer", "consumers"),
		countedNames(s.Starved, s.StarvedCount, "consumer", "consumers"), s.Waiting, s.InReplay)
}

// countedNames lists names, saying how many more the agent left out of its bounded list.
func countedNames(names []string, total int, one, many string) string {
	noun := many
	if total == 1 {
		noun = one
	}
	text := noun + " " + strings.Join(names, ", ")
	if more := total - len(names); more > 0 {
		text += fmt.Sprintf(" and %d more", more)
	}
	return text
}

// assessBacklog sums the reporter's figures of the flow's own subscription and predicts the
// first deletion. The answer may also hold other subscriptions' figures (a backlog condition's,
// backlogWatcher): an entry naming none is an older agent's, of the flow's own.
func assessBacklog(reporter, subscription string, all []protocol.BacklogStatus, now time.Time, lead time.Duration) *backlogRisk {
	entries := slices.DeleteFunc(slices.Clone(all), func(b protocol.BacklogStatus) bool {
		return b.Subscription != "" && b.Subscription != subscription
	})
	if len(entries) == 0 {
		return nil
	}
	st := &subflowv1.BacklogStatus{Reporter: reporter}
	risk := &backlogRisk{status: st}
	var unknown, retentionUnknown []string
	for _, b := range entries {
		if b.Unknown != "" {
			unknown = append(unknown, fmt.Sprintf("%s: %s", b.Topic, b.Unknown))
			continue
		}
		if b.RetentionUnknown != "" {
			retentionUnknown = append(retentionUnknown, fmt.Sprintf("%s: %s", b.Topic, b.RetentionUnknown))
		}
		st.Messages += b.Messages
		st.Bytes += b.Bytes
		st.ReadTime = laterTime(st.ReadTime, b.ReadAt)
		if b.OldestPublishTime != nil && (st.OldestPublishTime == nil || b.OldestPublishTime.Before(st.OldestPublishTime.Time)) {
			st.OldestPublishTime = &metav1.Time{Time: *b.OldestPublishTime}
		}
		for _, d := range deletions(b, now) {
			if st.DeletionTime == nil || d.at.Before(st.DeletionTime.Time) {
				st.DeletionTime, st.DeletedBy = &metav1.Time{Time: d.at}, d.by
			}
		}
		if note := sizeQuotaNote(b); note != "" {
			risk.atRisk, risk.warning = true, note
		}
		if b.KeySharedStall != nil {
			risk.stall = strings.TrimPrefix(risk.stall+"; "+stallNote(b), "; ")
		}
	}
	if len(unknown) == len(entries) {
		risk.unknown = strings.Join(unknown, "; ")
		st.Message = risk.unknown
		return risk
	}
	if st.DeletionTime != nil && st.DeletionTime.Sub(now) <= lead {
		risk.atRisk = true
		risk.warning = fmt.Sprintf("%s deletes waiting messages from %s (%s); %d messages wait",
			st.DeletedBy, st.DeletionTime.UTC().Format(time.RFC3339), until(now, st.DeletionTime.Time), st.Messages)
		if st.OldestPublishTime != nil {
			risk.warning += ", the oldest since " + st.OldestPublishTime.UTC().Format(time.RFC3339)
		}
	}
	if len(unknown) > 0 {
		st.Message = "not read for " + strings.Join(unknown, "; ")
	}
	if len(retentionUnknown) > 0 && !risk.atRisk {
		// The backlog is known but not what may delete it: no warning can be given either way.
		risk.unknown = "the retention policies could not be read: " + strings.Join(retentionUnknown, "; ")
		st.Message = strings.TrimPrefix(st.Message+"; "+risk.unknown, "; ")
	}
	return risk
}

type deletion struct {
	at time.Time
	by string
}

// deletions lists when each retention of one topic deletes its oldest waiting message.
func deletions(b protocol.BacklogStatus, now time.Time) []deletion {
	if b.Messages == 0 {
		return nil
	}
	var out []deletion
	if ttl := b.MessageTTLSeconds; ttl != nil && *ttl > 0 && b.OldestPublishTime != nil {
		out = append(out, deletion{at: b.OldestPublishTime.Add(time.Duration(*ttl) * time.Second),
			by: fmt.Sprintf("messageTTL %ds on %s", *ttl, b.Topic)})
	}
	for _, q := range b.Quotas {
		if q.Policy != "consumer_backlog_eviction" {
			continue
		}
		switch {
		case q.Type == "message_age" && q.LimitSeconds > 0 && b.OldestPublishTime != nil:
			// A broker with the precise time-based check evicts from 90% of the limit.
			out = append(out, deletion{at: b.OldestPublishTime.Add(time.Duration(q.LimitSeconds) * time.Second * 9 / 10),
				by: fmt.Sprintf("backlog quota message_age %ds (consumer_backlog_eviction) on %s", q.LimitSeconds, b.Topic)})
		case q.Type == "destination_storage" && q.LimitBytes > 0 && b.Bytes >= q.LimitBytes:
			out = append(out, deletion{at: now, by: fmt.Sprintf("backlog quota destination_storage %d bytes (consumer_backlog_eviction) on %s",
				q.LimitBytes, b.Topic)})
		}
	}
	return out
}

// sizeQuotaNote warns of a size quota nearly full: its eviction has no predictable time.
func sizeQuotaNote(b protocol.BacklogStatus) string {
	for _, q := range b.Quotas {
		if q.Policy == "consumer_backlog_eviction" && q.Type == "destination_storage" && q.LimitBytes > 0 &&
			float64(b.Bytes) >= sizeQuotaWarnRatio*float64(q.LimitBytes) {
			return fmt.Sprintf("the backlog of %s holds %d of the %d bytes its consumer_backlog_eviction quota allows; the broker "+
				"deletes the oldest waiting messages once it is exceeded", b.Topic, b.Bytes, q.LimitBytes)
		}
	}
	return ""
}

func laterTime(a *metav1.Time, b time.Time) *metav1.Time {
	if b.IsZero() || (a != nil && !b.After(a.Time)) {
		return a
	}
	return &metav1.Time{Time: b}
}

// until says how far t is: to the minute (the message then changes once a minute, not at
// every reconcile), but to the second in the last minute, which rounding to the minute would
// call "0s".
func until(now, t time.Time) string {
	d := t.Sub(now)
	switch {
	case d <= 0:
		return "already due"
	case d < time.Minute:
		return "in " + max(d.Round(time.Second), time.Second).String()
	default:
		return "in " + d.Round(time.Minute).String()
	}
}

// setBacklogCondition reports the risk: only a halted flow is at risk, since running consumers
// drain the backlog.
func setBacklogCondition(st *subflowv1.SubscriptionFlowStatus, risk *backlogRisk, state subflowv1.FlowState, lead time.Duration) {
	if risk == nil {
		// No report this time (no reporter reachable): keep what was known, but a running flow
		// is no longer at risk.
		if state == subflowv1.StateRunning {
			st.Backlog = nil // nobody reads it while consumers run: old figures would mislead
			if findCondition(st, subflowv1.ConditionBacklogAtRisk) != nil {
				setCondition(st, subflowv1.ConditionBacklogAtRisk, metav1.ConditionFalse, subflowv1.ReasonBacklogSafe,
					"Consumers run and drain the backlog")
			}
		}
		return
	}
	st.Backlog = risk.status
	switch {
	case risk.unknown != "":
		setCondition(st, subflowv1.ConditionBacklogAtRisk, metav1.ConditionUnknown, subflowv1.ReasonBacklogUnknown,
			"The backlog or its retention could not be read: "+risk.unknown)
	case state == subflowv1.StateRunning:
		setCondition(st, subflowv1.ConditionBacklogAtRisk, metav1.ConditionFalse, subflowv1.ReasonBacklogSafe,
			"Consumers run and drain the backlog")
	case risk.atRisk:
		setCondition(st, subflowv1.ConditionBacklogAtRisk, metav1.ConditionTrue, subflowv1.ReasonRetentionDeletesBacklog, risk.warning)
	default:
		setCondition(st, subflowv1.ConditionBacklogAtRisk, metav1.ConditionFalse, subflowv1.ReasonBacklogSafe,
			fmt.Sprintf("No retention deletes waiting messages within %s", lead))
	}
}

func findCondition(st *subflowv1.SubscriptionFlowStatus, condType string) *metav1.Condition {
	return meta.FindStatusCondition(st.Conditions, condType)
}
