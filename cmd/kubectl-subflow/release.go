package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// releaseAnnotation marks the short-lived flow that release creates.
const releaseAnnotation = "subflow.dev/release"

// releaseSubscription is the subscription of that flow: it must match no consumer, so that
// while it exists it changes no consumer's state.
const releaseSubscription = "subflow-release-matches-no-consumer"

func (p *plugin) releaseCommand() *cobra.Command {
	var (
		selector string
		timeout  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "release NAME --selector SELECTOR [--timeout 60s]",
		Short: "Release the rule a deleted flow NAME left in its pods (deletionPolicy Retain)",
		Long: `Release the rule that a SubscriptionFlow NAME, deleted with deletionPolicy Retain, left in
the agents of the pods SELECTOR matches; the controller names such a rule, and this command,
in the status of any flow whose consumers it holds (reason HeldByOtherRule).

The agents know a rule by namespace/name: release creates a flow NAME with deletionPolicy
Resume, state Running and a subscription no consumer has, waits until the controller pushed it
to every matched pod (replacing the old rule there), then deletes it, and the controller
releases it in every pod. NAME must not be an existing flow.`,
		Example: `  kubectl subflow release orders-ingest-old --selector app=orders -n shop`,
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := oneName(args)
			if err != nil {
				return err
			}
			labels, err := metav1.ParseToLabelSelector(selector)
			if err != nil || selector == "" {
				return fmt.Errorf("--selector must select the pods holding the rule, e.g. app=orders (got %q)", selector)
			}
			if timeout <= 0 {
				return fmt.Errorf("--timeout must be a positive duration such as 60s, got %s", timeout)
			}
			c, namespace, err := p.connect()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			return p.release(ctx, c, releaseFlow(namespace, name, *labels))
		},
	}
	cmd.Flags().StringVar(&selector, "selector", "", "label selector of the pods holding the rule, e.g. app=orders")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "give up after this long")
	return cmd
}

func releaseFlow(namespace, name string, selector metav1.LabelSelector) *subflowv1.SubscriptionFlow {
	return &subflowv1.SubscriptionFlow{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name,
			Annotations: map[string]string{releaseAnnotation: "created by kubectl subflow release to release an orphaned rule"}},
		Spec: subflowv1.SubscriptionFlowSpec{Selector: selector, Subscription: releaseSubscription,
			State: subflowv1.StateRunning, DeletionPolicy: subflowv1.DeletionResume},
	}
}

// release creates flow, waits until every matched pod holds it, deletes it and waits until the
// controller released it everywhere.
func (p *plugin) release(ctx context.Context, c client.Client, flow *subflowv1.SubscriptionFlow) error {
	if err := c.Create(ctx, flow); apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("a SubscriptionFlow %s exists in %s: its rule is not orphaned; change the flow, or delete it "+
			"with deletionPolicy Resume", flow.Name, flow.Namespace)
	} else if err != nil {
		return err
	}
	synced, err := waitPushed(ctx, c, flow)
	if delErr := c.Delete(context.WithoutCancel(ctx), flow); delErr != nil && !apierrors.IsNotFound(delErr) {
		return errors.Join(err, delErr)
	}
	if err != nil {
		return err
	}
	if err := waitGone(ctx, c, flow); err != nil {
		return err
	}
	fmt.Fprintf(p.stdout, "released the rule %s/%s in %d pods\n", flow.Namespace, flow.Name, synced)
	return nil
}

// waitPushed waits until the controller reports the flow's current generation pushed to every
// matched pod, and returns how many.
func waitPushed(ctx context.Context, c client.Client, flow *subflowv1.SubscriptionFlow) (int32, error) {
	var got subflowv1.SubscriptionFlow
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(flow), &got); err != nil {
			return false, err
		}
		st := got.Status
		if st.ObservedGeneration == got.Generation && st.Pods.Matched == 0 {
			return false, fmt.Errorf("--selector matches no running pod in %s: nothing released", flow.Namespace)
		}
		return st.ObservedGeneration == got.Generation && st.Pods.Synced == st.Pods.Matched, nil
	})
	switch {
	case err == nil:
		return got.Status.Pods.Synced, nil
	case !wait.Interrupted(err):
		return 0, err
	default:
		return 0, fmt.Errorf("the controller did not reach every matched pod (%d of %d synced): %w",
			got.Status.Pods.Synced, got.Status.Pods.Matched, err)
	}
}

func waitGone(ctx context.Context, c client.Client, flow *subflowv1.SubscriptionFlow) error {
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		err := c.Get(ctx, client.ObjectKeyFromObject(flow), &subflowv1.SubscriptionFlow{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	if err != nil {
		return fmt.Errorf("the controller has not released the rule in every pod yet (the flow %s is still terminating): %w", flow.Name, err)
	}
	return nil
}
