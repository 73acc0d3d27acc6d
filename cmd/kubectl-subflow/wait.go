package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// A waitGoal says whether a flow's reported status has reached a target; when not, why not.
type waitGoal func(flow *subflowv1.SubscriptionFlow, now time.Time) (bool, string)

var waitGoals = map[string]waitGoal{
	"paused":  haltedGoal(subflowv1.StatePaused, subflowv1.StateStopped),
	"stopped": haltedGoal(subflowv1.StateStopped),
	"running": runningGoal,
}

func (p *plugin) waitCommand() *cobra.Command {
	var (
		target  string
		timeout time.Duration
		which   targets
	)
	cmd := &cobra.Command{
		Use:   "wait (NAME | -l SELECTOR [-A]) --for paused|stopped|running [--timeout 60s]",
		Short: "Wait until the controller reports the flow paused (or stopped) or running",
		Long: `Wait until the flow's status reports the target:
  paused   the Paused condition is True: every matched consumer is paused or stopped
  stopped  as paused, with the effective state Stopped
  running  the effective state is Running and Ready is True
The status must describe the current generation, and while an override is in force the
effective state must be the override's. With -l it waits for every flow whose labels match
(in the namespace, or with -A in all) and at the timeout names those that are not there yet.
Exits 1 when --timeout passes first.`,
		Example: "  kubectl subflow pause orders-ingest --for 30m && kubectl subflow wait orders-ingest --for paused",
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := which.check(args)
			if err != nil {
				return err
			}
			goal, ok := waitGoals[strings.ToLower(target)]
			if !ok {
				return fmt.Errorf("--for must be paused, stopped or running, got %q", target)
			}
			if timeout <= 0 {
				return fmt.Errorf("--timeout must be a positive duration such as 60s, got %s", timeout)
			}
			if which.selector != "" {
				return p.waitForAll(cmd.Context(), which, strings.ToLower(target), goal, timeout)
			}
			return p.waitFor(cmd.Context(), name, strings.ToLower(target), goal, timeout)
		},
	}
	cmd.Flags().StringVar(&target, "for", "", "paused, stopped or running")
	cmd.Flags().DurationVar(&timeout, "timeout", 60*time.Second, "give up after this long")
	which.addFlags(cmd)
	return cmd
}

// waitForAll polls the flows -l selects until every one meets the goal; at the timeout it
// names those that do not, with why.
func (p *plugin) waitForAll(ctx context.Context, which targets, target string, goal waitGoal, timeout time.Duration) error {
	c, namespace, err := p.connect()
	if err != nil {
		return err
	}
	interrupted := ctx.Done()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var behind []string
	count := 0
	err = wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		flows, err := which.list(ctx, c, namespace)
		var status apierrors.APIStatus
		if errors.As(err, &status) || errors.Is(err, errNoMatch) {
			return false, err // the server's answer, or nothing to wait for: say it now
		} else if err != nil {
			return false, nil // a call cut short by the deadline, or a network error: poll on
		}
		behind, count = nil, len(flows)
		for i := range flows {
			if done, why := goal(&flows[i], p.now()); !done {
				key := types.NamespacedName{Namespace: flows[i].Namespace, Name: flows[i].Name}
				behind = append(behind, fmt.Sprintf("%s: %s", which.flowRef(key), why))
			}
		}
		return len(behind) == 0, nil
	})
	switch {
	case isClosed(interrupted):
		return fmt.Errorf("interrupted while waiting for %d flows to be %s; %d are not:\n  %s", count, target,
			len(behind), strings.Join(behind, "\n  "))
	case wait.Interrupted(err) || ctx.Err() != nil:
		return fmt.Errorf("timed out after %s waiting for %d flows to be %s; %d are not:\n  %s", timeout, count, target,
			len(behind), strings.Join(behind, "\n  "))
	case err != nil:
		return err
	}
	fmt.Fprintf(p.stdout, "%d flows condition met: %s\n", count, target)
	return nil
}

// waitFor watches the one flow (list + watch, re-listing if the watch breaks) until the goal
// holds, the flow is deleted or the timeout passes.
func (p *plugin) waitFor(ctx context.Context, name, target string, goal waitGoal, timeout time.Duration) error {
	c, namespace, err := p.connect()
	if err != nil {
		return err
	}
	interrupted := ctx.Done()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// A missing flow is an error at once, as with kubectl wait.
	var flow subflowv1.SubscriptionFlow
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &flow); err != nil {
		return err
	}
	why, announced := "", false
	_, err = watchtools.UntilWithSync(ctx, singleFlowWatch(ctx, c, namespace, name), &subflowv1.SubscriptionFlow{}, nil,
		func(ev watch.Event) (bool, error) {
			if ev.Type == watch.Deleted {
				return false, fmt.Errorf("%s/%s was deleted while waiting for it to be %s", resourceName, name, target)
			}
			f, ok := ev.Object.(*subflowv1.SubscriptionFlow)
			if !ok {
				return false, nil
			}
			var done bool
			done, why = goal(f, p.now())
			if !done && !announced {
				// Once, so that a person (or a script) sees what is being waited for.
				fmt.Fprintf(p.stderr, "Waiting for %s/%s to be %s: %s\n", resourceName, name, target, why)
				announced = true
			}
			return done, nil
		})
	switch {
	case isClosed(interrupted):
		return fmt.Errorf("interrupted while waiting for %s/%s to be %s: %s", resourceName, name, target, why)
	case wait.Interrupted(err) || errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("timed out after %s waiting for %s/%s to be %s: %s", timeout, resourceName, name, target, why)
	case err != nil:
		return err
	}
	fmt.Fprintf(p.stdout, "%s/%s condition met: %s\n", resourceName, name, target)
	return nil
}

// isClosed says whether done (a context's Done, nil for one never cancelled) is closed: Ctrl-C
// rather than --timeout ended a wait.
func isClosed(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

func singleFlowWatch(ctx context.Context, c client.WithWatch, namespace, name string) cache.ListerWatcher {
	only := func(opts metav1.ListOptions) *client.ListOptions {
		opts.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		return &client.ListOptions{Namespace: namespace, Raw: &opts}
	}
	return &cache.ListWatch{
		ListFunc: func(opts metav1.ListOptions) (runtime.Object, error) {
			var list subflowv1.SubscriptionFlowList
			return &list, c.List(ctx, &list, only(opts))
		},
		WatchFunc: func(opts metav1.ListOptions) (watch.Interface, error) {
			return c.Watch(ctx, &subflowv1.SubscriptionFlowList{}, only(opts))
		},
	}
}

func haltedGoal(states ...subflowv1.FlowState) waitGoal {
	return func(flow *subflowv1.SubscriptionFlow, now time.Time) (bool, string) {
		if ok, why := reportsCurrentState(flow, now); !ok {
			return false, why
		}
		st := flow.Status
		if !containsState(states, st.EffectiveState) {
			return false, fmt.Sprintf("the effective state is %s", orDefault(string(st.EffectiveState), "not reported"))
		}
		return conditionTrue(st.Conditions, subflowv1.ConditionPaused)
	}
}

func runningGoal(flow *subflowv1.SubscriptionFlow, now time.Time) (bool, string) {
	if ok, why := reportsCurrentState(flow, now); !ok {
		return false, why
	}
	if st := flow.Status.EffectiveState; st != subflowv1.StateRunning {
		return false, fmt.Sprintf("the effective state is %s", orDefault(string(st), "not reported"))
	}
	return conditionTrue(flow.Status.Conditions, subflowv1.ConditionReady)
}

// reportsCurrentState refuses a status written for an older generation or before an override
// in force took effect, so that `pause` followed by `wait` does not read the old state.
func reportsCurrentState(flow *subflowv1.SubscriptionFlow, now time.Time) (bool, string) {
	st := flow.Status
	if st.ObservedGeneration != flow.Generation {
		return false, fmt.Sprintf("the status describes generation %d, the flow is at %d", st.ObservedGeneration, flow.Generation)
	}
	if want, ok := overrideInForce(flow.Annotations, now); ok && st.EffectiveState != want {
		return false, fmt.Sprintf("the override asks for %s, the effective state is %s", want, orDefault(string(st.EffectiveState), "not reported"))
	}
	return true, ""
}

// overrideInForce reads the override annotations as the controller does (any letter case;
// an end in the past means no override).
func overrideInForce(annotations map[string]string, now time.Time) (subflowv1.FlowState, bool) {
	value := annotations[subflowv1.OverrideStateAnnotation]
	var state subflowv1.FlowState
	for _, s := range []subflowv1.FlowState{subflowv1.StateRunning, subflowv1.StatePaused, subflowv1.StateStopped} {
		if strings.EqualFold(value, string(s)) {
			state = s
		}
	}
	if state == "" {
		return "", false
	}
	if until, err := time.Parse(time.RFC3339, annotations[subflowv1.OverrideUntilAnnotation]); err == nil && !now.Before(until) {
		return "", false
	}
	return state, true
}

func conditionTrue(conditions []metav1.Condition, condType string) (bool, string) {
	c := meta.FindStatusCondition(conditions, condType)
	if c == nil {
		return false, condType + " is not reported"
	}
	if c.Status != metav1.ConditionTrue {
		return false, fmt.Sprintf("%s=%s (%s): %s", condType, c.Status, c.Reason, oneLine(c.Message))
	}
	return true, ""
}

func containsState(states []subflowv1.FlowState, s subflowv1.FlowState) bool {
	for _, want := range states {
		if s == want {
			return true
		}
	}
	return false
}
