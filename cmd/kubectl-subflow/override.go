package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"

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
		which   targets
	)
	cmd := &cobra.Command{
		Use:   verb + " (NAME | -l SELECTOR [-A]) [--for DURATION] [--reason TEXT]",
		Short: fmt.Sprintf("Override the flow's state with %s (annotation %s)", state, subflowv1.OverrideStateAnnotation),
		Long: fmt.Sprintf(`Set the override annotation %s=%s on the SubscriptionFlow.

The override wins over spec.state and maintenance windows. With --for it ends by itself
(annotation %s = now + DURATION, RFC 3339); without --for it lasts until "kubectl subflow clear".
--reason (annotation %s) is shown by the controller in events and status.
With -l it acts on every flow whose labels match, in the namespace or with -A in all of them;
if any of them refuses the change (RBAC, admission), none is changed.`,
			subflowv1.OverrideStateAnnotation, state, subflowv1.OverrideUntilAnnotation, subflowv1.OverrideReasonAnnotation),
		Example: fmt.Sprintf("  kubectl subflow %s orders-ingest --for 30m --reason INC-4711 -n shop\n"+
			"  kubectl subflow %s -l db=orders -A --for 30m --reason INC-4711", verb, verb),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := which.check(args)
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
			return p.setOverride(cmd.Context(), which, name, state, until, reason)
		},
	}
	cmd.Flags().DurationVar(&lasting, "for", 0, "end the override after this long, e.g. 30m or 2h (default: until cleared)")
	cmd.Flags().StringVar(&reason, "reason", "", "why, e.g. an incident id; shown in the flow's events and status")
	which.addFlags(cmd)
	return cmd
}

func (p *plugin) clearCommand() *cobra.Command {
	var which targets
	cmd := &cobra.Command{
		Use:   "clear (NAME | -l SELECTOR [-A])",
		Short: "Remove the override so that spec.state and maintenance windows decide again",
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := which.check(args)
			if err != nil {
				return err
			}
			return p.changeOverride(cmd.Context(), which, name, overrideAnnotations("", nil, ""), func(types.NamespacedName) string {
				return "override cleared: spec.state and maintenance windows decide"
			})
		},
	}
	which.addFlags(cmd)
	return cmd
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

func (p *plugin) setOverride(ctx context.Context, which targets, name string, state subflowv1.FlowState, until *time.Time, reason string) error {
	return p.changeOverride(ctx, which, name, overrideAnnotations(state, until, reason), func(key types.NamespacedName) string {
		line := pastTense[state]
		if until != nil {
			line += " until " + until.Format(time.RFC3339)
		} else {
			line += fmt.Sprintf(" until cleared (kubectl subflow clear %s -n %s)", key.Name, key.Namespace)
		}
		if reason != "" {
			line += fmt.Sprintf(" (reason: %s)", reason)
		}
		return line
	})
}

// changeOverride patches the override annotations of the targeted flows and prints one line
// for each flow changed.
func (p *plugin) changeOverride(ctx context.Context, which targets, name string, annotations map[string]any,
	describe func(types.NamespacedName) string) error {
	c, namespace, err := p.connect()
	if err != nil {
		return err
	}
	flows, err := which.resolve(ctx, c, namespace, name)
	if err != nil {
		return err
	}
	return patchAnnotations(ctx, c, flows, annotations, func(key types.NamespacedName) {
		fmt.Fprintf(p.stdout, "%s %s\n", which.flowRef(key), describe(key))
	})
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
