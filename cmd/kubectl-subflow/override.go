package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

const (
	// maxOverrideFor keeps override-until a time every RFC 3339 reader accepts; an override
	// meant to last longer belongs in spec.state.
	maxOverrideFor = 366 * 24 * time.Hour
	// maxReasonLength keeps the reason short enough for an event message and a status line.
	maxReasonLength = 1024
)

var pastTense = map[subflowv1.FlowState]string{
	subflowv1.StatePaused:  "paused",
	subflowv1.StateRunning: "resumed",
	subflowv1.StateStopped: "stopped",
}

// overrideCommand builds pause, resume or stop: each sets the override annotations, which win
// over spec.state and maintenance windows until they expire or are cleared.
func (p *plugin) overrideCommand(verb string, state subflowv1.FlowState) *cobra.Command {
	var (
		lasting time.Duration
		reason  string
	)
	cmd := &cobra.Command{
		Use:   verb + " NAME [--for DURATION] [--reason TEXT]",
		Short: fmt.Sprintf("Override the flow's state with %s (annotation %s)", state, subflowv1.OverrideStateAnnotation),
		Long: fmt.Sprintf(`Set the override annotation %s=%s on the SubscriptionFlow.

The override wins over spec.state and maintenance windows. With --for it ends by itself
(annotation %s = now + DURATION, RFC 3339); without --for it lasts until "kubectl subflow clear".
--reason (annotation %s) is shown by the controller in events and status.`,
			subflowv1.OverrideStateAnnotation, state, subflowv1.OverrideUntilAnnotation, subflowv1.OverrideReasonAnnotation),
		Example: fmt.Sprintf("  kubectl subflow %s orders-ingest --for 30m --reason INC-4711 -n shop", verb),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := oneName(args)
			if err != nil {
				return err
			}
			var until *time.Time
			if cmd.Flags().Changed("for") {
				end, err := overrideEnd(p.now(), lasting)
				if err != nil {
					return err
				}
				until = &end
			}
			if err := checkReason(reason); err != nil {
				return err
			}
			return p.setOverride(cmd, name, state, until, reason)
		},
	}
	cmd.Flags().DurationVar(&lasting, "for", 0, "end the override after this long, e.g. 30m or 2h (default: until cleared)")
	cmd.Flags().StringVar(&reason, "reason", "", "why, e.g. an incident id; shown in the flow's events and status")
	return cmd
}

func (p *plugin) clearCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "clear NAME",
		Short: "Remove the override so that spec.state and maintenance windows decide again",
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := oneName(args)
			if err != nil {
				return err
			}
			if _, err := p.patchAnnotations(cmd, name, overrideAnnotations("", nil, "")); err != nil {
				return err
			}
			fmt.Fprintf(p.stdout, "%s/%s override cleared: spec.state and maintenance windows decide\n", resourceName, name)
			return nil
		},
	}
}

// overrideEnd is now + lasting, whole seconds, in UTC.
func overrideEnd(now time.Time, lasting time.Duration) (time.Time, error) {
	switch {
	case lasting <= 0:
		return time.Time{}, fmt.Errorf("--for must be a positive duration such as 30m or 2h, got %s", lasting)
	case lasting > maxOverrideFor:
		return time.Time{}, fmt.Errorf("--for must be at most %s; set spec.state for a lasting change", maxOverrideFor)
	}
	return now.Add(lasting).UTC().Truncate(time.Second), nil
}

func checkReason(reason string) error {
	if len(reason) > maxReasonLength {
		return fmt.Errorf("--reason is %d bytes long, at most %d are allowed", len(reason), maxReasonLength)
	}
	if strings.IndexFunc(reason, func(r rune) bool { return unicode.IsControl(r) }) >= 0 {
		return errors.New("--reason must be one line of printable text")
	}
	return nil
}

func (p *plugin) setOverride(cmd *cobra.Command, name string, state subflowv1.FlowState, until *time.Time, reason string) error {
	namespace, err := p.patchAnnotations(cmd, name, overrideAnnotations(state, until, reason))
	if err != nil {
		return err
	}
	line := fmt.Sprintf("%s/%s %s", resourceName, name, pastTense[state])
	if until != nil {
		line += " until " + until.Format(time.RFC3339)
	} else {
		line += fmt.Sprintf(" until cleared (kubectl subflow clear %s -n %s)", name, namespace)
	}
	if reason != "" {
		line += fmt.Sprintf(" (reason: %s)", reason)
	}
	fmt.Fprintln(p.stdout, line)
	return nil
}

// overrideAnnotations maps each override annotation to its new value; nil removes it, so that
// an until or a reason from an earlier override never sticks to a new one. An empty state
// removes all three.
func overrideAnnotations(state subflowv1.FlowState, until *time.Time, reason string) map[string]any {
	values := map[string]any{
		subflowv1.OverrideStateAnnotation:  nil,
		subflowv1.OverrideUntilAnnotation:  nil,
		subflowv1.OverrideReasonAnnotation: nil,
	}
	if state == "" {
		return values
	}
	values[subflowv1.OverrideStateAnnotation] = string(state)
	if until != nil {
		values[subflowv1.OverrideUntilAnnotation] = until.Format(time.RFC3339)
	}
	if reason != "" {
		values[subflowv1.OverrideReasonAnnotation] = reason
	}
	return values
}

// patchAnnotations changes only the given annotations, in one JSON merge patch, so nothing
// else on the object (spec, other annotations) can be overwritten by a stale copy.
// It returns the namespace the flow is in.
func (p *plugin) patchAnnotations(cmd *cobra.Command, name string, annotations map[string]any) (string, error) {
	c, namespace, err := p.connect()
	if err != nil {
		return "", err
	}
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if err != nil {
		return "", err
	}
	flow := &subflowv1.SubscriptionFlow{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	return namespace, c.Patch(cmd.Context(), flow, client.RawPatch(types.MergePatchType, body))
}
