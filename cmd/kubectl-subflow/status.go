package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/cli-runtime/pkg/printers"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// conditionOrder lists the known condition types first; others follow in the order reported.
var conditionOrder = []string{
	subflowv1.ConditionReady, subflowv1.ConditionPaused, subflowv1.ConditionAutoPaused, subflowv1.ConditionReconciling,
	subflowv1.ConditionStalled, subflowv1.ConditionSeekCompleted,
}

func (p *plugin) statusCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "status NAME",
		Short: "Show the flow's effective state, conditions, seek result and each pod's agent",
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := oneName(args)
			if err != nil {
				return err
			}
			_, flow, err := p.getFlow(cmd.Context(), name)
			if err != nil {
				return err
			}
			return printStatus(p.stdout, flow, p.now())
		},
	}
}

func printStatus(out io.Writer, flow *subflowv1.SubscriptionFlow, now time.Time) error {
	st := flow.Status
	field := func(label, value string) {
		if label != "" {
			label += ":"
		}
		fmt.Fprintf(out, "%-17s%s\n", label, value)
	}
	field("Name", flow.Name)
	field("Namespace", flow.Namespace)
	field("Subscription", oneLine(flow.Spec.Subscription))
	field("Topic", orDefault(oneLine(flow.Spec.Topic), "(every topic of the subscription)"))
	field("Desired state", orDefault(string(flow.Spec.State), string(subflowv1.StateRunning))+" (spec.state)")
	field("Override", describeOverride(flow.Annotations, now))
	field("Effective state", describeEffective(st))
	field("Next transition", describeTime(st.NextTransitionTime, now))
	if st.ObservedGeneration != flow.Generation {
		field("Observed", fmt.Sprintf("generation %d of %d: the controller has not caught up yet", st.ObservedGeneration, flow.Generation))
	}
	pods := fmt.Sprintf("%d matched, %d synced, %d unreachable", st.Pods.Matched, st.Pods.Synced, st.Pods.Unreachable)
	if st.Pods.Refused > 0 {
		pods += fmt.Sprintf(", %d refused the flow", st.Pods.Refused)
	}
	field("Pods", pods)
	field("Consumers", fmt.Sprintf("%d total, %d running, %d paused, %d stopped",
		st.Consumers.Total, st.Consumers.Running, st.Consumers.Paused, st.Consumers.Stopped))
	field("Seek", describeSeek(flow, now))
	for _, pos := range seekPositions(st.Seek) {
		field("", pos)
	}
	if len(flow.Spec.PauseWhen) > 0 {
		field("Pause when", "")
		for _, line := range describePauseWhen(flow, now) {
			field("", line)
		}
	}

	fmt.Fprintln(out, "Conditions:")
	if err := printConditions(out, st.Conditions, now); err != nil {
		return err
	}
	fmt.Fprintln(out, "Agents:")
	return printAgents(out, st.Agents, now)
}

func describeOverride(annotations map[string]string, now time.Time) string {
	state, ok := annotations[subflowv1.OverrideStateAnnotation]
	if !ok {
		return "<none>"
	}
	text := oneLine(state)
	if until, ok := annotations[subflowv1.OverrideUntilAnnotation]; ok {
		t, err := time.Parse(time.RFC3339, until)
		switch {
		case err != nil:
			text += fmt.Sprintf(" until %q (unreadable: the override has no end)", oneLine(until))
		case !now.Before(t):
			text += fmt.Sprintf(" until %s (expired %s ago; ignored)", until, duration.HumanDuration(now.Sub(t)))
		default:
			text += fmt.Sprintf(" until %s (in %s)", until, duration.HumanDuration(t.Sub(now)))
		}
	} else {
		text += " until cleared"
	}
	if reason := annotations[subflowv1.OverrideReasonAnnotation]; reason != "" {
		text += ", reason: " + oneLine(reason)
	}
	return text
}

func describeEffective(st subflowv1.SubscriptionFlowStatus) string {
	if st.EffectiveState == "" {
		return "<not reported yet>"
	}
	return fmt.Sprintf("%s (source: %s)", st.EffectiveState, st.StateSource)
}

// describePauseWhen says, per spec.pauseWhen condition, what it watches, whether it holds
// and since when, and what was last read: why a flow paused itself.
func describePauseWhen(flow *subflowv1.SubscriptionFlow, now time.Time) []string {
	var lines []string
	for _, c := range flow.Spec.PauseWhen {
		line := oneLine(c.Name) + " (" + describeSource(c) + "): "
		i := slices.IndexFunc(flow.Status.PauseWhen, func(s subflowv1.PauseConditionStatus) bool { return s.Name == c.Name })
		if i < 0 {
			lines = append(lines, line+"not evaluated yet")
			continue
		}
		st := flow.Status.PauseWhen[i]
		if st.Holds {
			line += "HOLDS"
		} else {
			line += "does not hold"
		}
		if st.Since != nil {
			line += " since " + duration.HumanDuration(now.Sub(st.Since.Time)) + " ago"
		}
		if st.Seen != "" {
			line += ", seen " + oneLine(st.Seen)
		}
		if st.Error != "" {
			line += ", last reading failed: " + oneLine(st.Error)
		}
		line += ", read every " + durationOf(c.Interval, "10s")
		lines = append(lines, line)
	}
	return lines
}

func durationOf(d *metav1.Duration, fallback string) string {
	if d == nil {
		return fallback
	}
	return d.Duration.String()
}

func describeSource(c subflowv1.PauseCondition) string {
	switch {
	case c.Kubernetes != nil:
		k := c.Kubernetes
		return fmt.Sprintf("%s %s %s=%s", k.Kind, k.Name, k.ConditionType, k.Status)
	case c.Prometheus != nil:
		p := c.Prometheus
		switch {
		case p.Above != nil:
			return fmt.Sprintf("%s > %s", oneLine(p.Query), p.Above.String())
		case p.Below != nil:
			return fmt.Sprintf("%s < %s", oneLine(p.Query), p.Below.String())
		}
		return oneLine(p.Query)
	}
	return "no source"
}

func describeTime(t *metav1.Time, now time.Time) string {
	if t == nil {
		return "<none>"
	}
	text := t.UTC().Format(time.RFC3339)
	if d := t.Sub(now); d > 0 {
		return text + " (in " + duration.HumanDuration(d) + ")"
	}
	return text + " (" + duration.HumanDuration(now.Sub(t.Time)) + " ago)"
}

// describeSeek joins the requested seek (spec) with what the controller reported for it.
func describeSeek(flow *subflowv1.SubscriptionFlow, now time.Time) string {
	requested := flow.Spec.Seek
	if requested == nil {
		return "<none>"
	}
	text := fmt.Sprintf("id %s (%s): ", oneLine(requested.ID), describeTargets(requested))
	cond := meta.FindStatusCondition(flow.Status.Conditions, subflowv1.ConditionSeekCompleted)
	reported := flow.Status.Seek
	switch {
	case cond == nil || reported == nil || reported.ID != requested.ID:
		return text + "requested, not reported yet"
	case cond.Status == metav1.ConditionTrue:
		text += "Succeeded"
		if reported.CompletionTime != nil {
			text += " " + describeTime(reported.CompletionTime, now)
		}
	case cond.Reason == subflowv1.ReasonSeekPending:
		text += "Pending"
	case cond.Reason == subflowv1.ReasonSeekIDReused:
		text += "Not run (SeekIDReused): " + oneLine(cond.Message)
	default:
		text += fmt.Sprintf("Failed (%s): %s", cond.Reason, oneLine(cond.Message))
	}
	if reported.Executor != "" {
		text += ", executor " + reported.Executor
	}
	return text
}

func seekPositions(seek *subflowv1.SeekStatus) []string {
	if seek == nil {
		return nil
	}
	var lines []string
	for _, pos := range seek.Positions {
		where := fmt.Sprintf("partition %d", pos.Partition)
		if pos.Partition < 0 {
			where = "topic"
		}
		lines = append(lines, fmt.Sprintf("  %s: index %d -> message %s", where, pos.Index, orDefault(pos.MessageID, "?")))
	}
	return lines
}

func printConditions(out io.Writer, conditions []metav1.Condition, now time.Time) error {
	sorted := slices.Clone(conditions)
	slices.SortStableFunc(sorted, func(a, b metav1.Condition) int { return conditionRank(a.Type) - conditionRank(b.Type) })
	w := printers.GetNewTabWriter(out)
	fmt.Fprintln(w, "  TYPE\tSTATUS\tREASON\tAGE\tMESSAGE")
	for _, c := range sorted {
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\n", c.Type, c.Status, c.Reason, age(c.LastTransitionTime, now), oneLine(c.Message))
	}
	return w.Flush()
}

func conditionRank(condType string) int {
	if i := slices.Index(conditionOrder, condType); i >= 0 {
		return i
	}
	return len(conditionOrder)
}

func printAgents(out io.Writer, agents []subflowv1.AgentStatus, now time.Time) error {
	if len(agents) == 0 {
		fmt.Fprintln(out, "  <no pod matched>")
		return nil
	}
	w := printers.GetNewTabWriter(out)
	fmt.Fprintln(w, "  POD\tKIND\tVERSION\tPROTOCOL\tSTATE\tCONSUMERS\tHELD\tLAST SYNC\tMESSAGE")
	for _, a := range agents {
		lastSync := "<never>"
		if a.LastSyncTime != nil {
			lastSync = age(*a.LastSyncTime, now) + " ago"
		}
		protocol := "-"
		if a.ProtocolVersion > 0 {
			protocol = fmt.Sprint(a.ProtocolVersion)
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", a.Pod, orDefault(a.Kind, "-"), orDefault(oneWord(a.AgentVersion), "-"), protocol,
			orDefault(a.State, "<unknown>"), a.Consumers, a.HeldMessages, lastSync, oneLine(a.Message))
	}
	return w.Flush()
}

// age is kubectl's AGE column: a short human duration, "<unknown>" for a zero time.
func age(t metav1.Time, now time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t.Time))
}

// oneWord is oneLine for a column's value, which must not split the column: a development
// build's version, "(devel) <revision>", reads "(devel)-<revision>".
func oneWord(s string) string {
	return strings.Join(strings.Fields(oneLine(s)), "-")
}

func orDefault(value, fallback string) string {
	if value == "" {
		return fallback
	}
	return value
}

// oneLine keeps text written by others (messages, annotations) from breaking the layout or
// sending control sequences to the terminal.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
}
