package main

import (
	"context"
	"errors"
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
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/cli-runtime/pkg/printers"
	watchtools "k8s.io/client-go/tools/watch"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// conditionOrder lists the known condition types first; others follow in the order reported.
var conditionOrder = []string{
	subflowv1.ConditionReady, subflowv1.ConditionPaused, subflowv1.ConditionAutoPaused, subflowv1.ConditionReconciling,
	subflowv1.ConditionStalled, subflowv1.ConditionSeekCompleted,
}

func (p *plugin) statusCommand() *cobra.Command {
	var (
		watchFlow bool
		timeout   time.Duration
		output    *outputFlags
	)
	cmd := &cobra.Command{
		Use:   "status NAME [-o json|yaml|wide|name|...] [--watch [--timeout DURATION]]",
		Short: "Show the flow's effective state, conditions, seek result and each pod's agent",
		Long: `Show the flow's effective state, conditions, seek result and each pod's agent.

-o wide adds each condition's transition time and each pod's messages received while paused;
-o json, yaml, name, jsonpath and go-template print the flow as kubectl get does.
--watch prints the flow again each time it changes, until Ctrl-C, --timeout or its deletion.`,
		Example: "  kubectl subflow status orders-ingest -n shop --watch\n  kubectl subflow status orders-ingest -n shop -o yaml",
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := oneName(args)
			if err != nil {
				return err
			}
			printer, err := output.printer()
			if err != nil {
				return err
			}
			switch {
			case timeout < 0:
				return fmt.Errorf("--timeout must be a positive duration such as 10m, got %s", timeout)
			case timeout > 0 && !watchFlow:
				return errors.New("--timeout needs --watch: it ends the watch")
			}
			shown := 0
			show := func(flow *subflowv1.SubscriptionFlow) error {
				shown++
				if printer != nil {
					return printer.PrintObj(flow, p.stdout) // yaml separates documents with ---
				}
				if shown > 1 {
					fmt.Fprintln(p.stdout) // a blank line between two descriptions
				}
				return printStatus(p.stdout, flow, output.wide(), p.now())
			}
			if watchFlow {
				return p.watchStatus(cmd.Context(), name, timeout, show)
			}
			_, flow, err := p.getFlow(cmd.Context(), name)
			if err != nil {
				return err
			}
			return show(flow)
		},
	}
	cmd.Flags().BoolVarP(&watchFlow, "watch", "w", false, "print the flow again each time it changes, until Ctrl-C or --timeout")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "with --watch, stop watching after this long (default: until Ctrl-C)")
	output = newOutputFlags(cmd)
	return cmd
}

// watchStatus shows the flow, then again at each change (list + watch, re-listing if the
// watch breaks), until ctx ends, the timeout passes (both a normal end) or the flow is deleted.
func (p *plugin) watchStatus(ctx context.Context, name string, timeout time.Duration,
	show func(*subflowv1.SubscriptionFlow) error) error {
	c, flow, err := p.getFlow(ctx, name) // a missing flow is an error at once
	if err != nil {
		return err
	}
	if err := show(flow); err != nil {
		return err
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	shown := flow.ResourceVersion
	_, err = watchtools.UntilWithSync(ctx, singleFlowWatch(ctx, c, flow.Namespace, name), &subflowv1.SubscriptionFlow{}, nil,
		func(ev watch.Event) (bool, error) {
			f, ok := ev.Object.(*subflowv1.SubscriptionFlow)
			switch {
			case ev.Type == watch.Deleted:
				fmt.Fprintf(p.stdout, "%s/%s deleted\n", resourceName, name)
				return true, nil
			case !ok || f.ResourceVersion == shown:
				return false, nil
			}
			shown = f.ResourceVersion
			return false, show(f)
		})
	if ctx.Err() != nil {
		return nil // Ctrl-C or --timeout: the watch ends as asked
	}
	return err
}

func printStatus(out io.Writer, flow *subflowv1.SubscriptionFlow, wide bool, now time.Time) error {
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
	if err := printConditions(out, st.Conditions, wide, now); err != nil {
		return err
	}
	fmt.Fprintln(out, "Agents:")
	return printAgents(out, st.Agents, wide, now)
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
			line += " since " + sinceText(st.Since.Time, now)
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

// sinceText is how long ago t was; a t after now (the controller's clock ahead of this
// machine's) is printed as a time, not as a negative age.
func sinceText(t, now time.Time) string {
	if t.After(now) {
		return t.UTC().Format(time.RFC3339)
	}
	return duration.HumanDuration(now.Sub(t)) + " ago"
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
	case c.HTTP != nil:
		h := c.HTTP
		healthy := "200-399"
		if h.HealthyStatus != nil {
			healthy = fmt.Sprintf("%d-%d", h.HealthyStatus.Min, h.HealthyStatus.Max)
		}
		scheme := "http"
		if h.Scheme == "HTTPS" {
			scheme = "https"
		}
		return fmt.Sprintf("%s Service %s:%s%s not %s", scheme, h.Service.Name, h.Service.Port.String(), oneLine(h.Service.Path), healthy)
	case c.Backlog != nil:
		return fmt.Sprintf("backlog of %s > %d", oneLine(c.Backlog.Subscription), c.Backlog.Above)
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

// printConditions prints the conditions in a fixed order; wide adds when each last changed
// and the generation it describes.
func printConditions(out io.Writer, conditions []metav1.Condition, wide bool, now time.Time) error {
	sorted := slices.Clone(conditions)
	slices.SortStableFunc(sorted, func(a, b metav1.Condition) int { return conditionRank(a.Type) - conditionRank(b.Type) })
	w := printers.GetNewTabWriter(out)
	header := "  TYPE\tSTATUS\tREASON\tAGE\t"
	if wide {
		header += "LAST TRANSITION\tGENERATION\t"
	}
	fmt.Fprintln(w, header+"MESSAGE")
	for _, c := range sorted {
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t", c.Type, c.Status, c.Reason, age(c.LastTransitionTime, now))
		if wide {
			fmt.Fprintf(w, "%s\t%d\t", c.LastTransitionTime.UTC().Format(time.RFC3339), c.ObservedGeneration)
		}
		fmt.Fprintln(w, oneLine(c.Message))
	}
	return w.Flush()
}

func conditionRank(condType string) int {
	if i := slices.Index(conditionOrder, condType); i >= 0 {
		return i
	}
	return len(conditionOrder)
}

// printAgents prints each pod's agent; wide adds the messages its clients pushed to a
// closed gate (held, never handed over: a reconnect while paused).
func printAgents(out io.Writer, agents []subflowv1.AgentStatus, wide bool, now time.Time) error {
	if len(agents) == 0 {
		fmt.Fprintln(out, "  <no pod matched>")
		return nil
	}
	w := printers.GetNewTabWriter(out)
	received := ""
	if wide {
		received = "RECEIVED WHILE PAUSED\t"
	}
	fmt.Fprintln(w, "  POD\tKIND\tVERSION\tPROTOCOL\tSTATE\tCONSUMERS\tHELD\t"+received+"LAST SYNC\tMESSAGE")
	for _, a := range agents {
		lastSync := "<never>"
		if a.LastSyncTime != nil {
			lastSync = age(*a.LastSyncTime, now) + " ago"
		}
		protocol := "-"
		if a.ProtocolVersion > 0 {
			protocol = fmt.Sprint(a.ProtocolVersion)
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\t%d\t%d\t", a.Pod, orDefault(a.Kind, "-"), orDefault(oneWord(a.AgentVersion), "-"), protocol,
			orDefault(a.State, "<unknown>"), a.Consumers, a.HeldMessages)
		if wide {
			fmt.Fprintf(w, "%d\t", a.ReceivedWhilePaused)
		}
		fmt.Fprintf(w, "%s\t%s\n", lastSync, oneLine(a.Message))
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
