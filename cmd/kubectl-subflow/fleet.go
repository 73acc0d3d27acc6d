package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// errNoMatch is a selector that matches no flow.
var errNoMatch = errors.New("no SubscriptionFlow")

// targets names the flows a command acts on: one NAME, or every flow whose labels match -l,
// in the namespace or, with -A, in every namespace (the fleet switch).
type targets struct {
	selector      string
	allNamespaces bool
}

func (t *targets) addFlags(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&t.selector, "selector", "l", "", "act on every flow with these labels instead of one NAME, e.g. -l db=orders")
	cmd.Flags().BoolVarP(&t.allNamespaces, "all-namespaces", "A", false, "with -l, act on the matching flows of every namespace")
}

// check validates the arguments before anything talks to the server.
func (t *targets) check(args []string) (name string, err error) {
	switch {
	case t.selector == "" && t.allNamespaces:
		return "", errors.New("-A needs -l SELECTOR: name the flows to act on by their labels")
	case t.selector == "":
		return oneName(args)
	case len(args) > 0:
		return "", fmt.Errorf("give NAME or -l SELECTOR, not both (got NAME %q)", args[0])
	}
	if _, err := labels.Parse(t.selector); err != nil {
		return "", fmt.Errorf("-l %q is not a label selector: %v", t.selector, err)
	}
	return "", nil
}

// resolve returns the flows to act on; with -l, matching none is an error.
func (t *targets) resolve(ctx context.Context, c client.Client, namespace, name string) ([]types.NamespacedName, error) {
	if t.selector == "" {
		return []types.NamespacedName{{Namespace: namespace, Name: name}}, nil
	}
	flows, err := t.list(ctx, c, namespace)
	if err != nil {
		return nil, fmt.Errorf("%w: nothing changed", err)
	}
	keys := make([]types.NamespacedName, 0, len(flows))
	for _, f := range flows {
		keys = append(keys, types.NamespacedName{Namespace: f.Namespace, Name: f.Name})
	}
	return keys, nil
}

// list returns the flows -l selects, by namespace and name; matching none is an error.
func (t *targets) list(ctx context.Context, c client.Client, namespace string) ([]subflowv1.SubscriptionFlow, error) {
	selector, _ := labels.Parse(t.selector) // checked
	opts := []client.ListOption{client.MatchingLabelsSelector{Selector: selector}}
	where := "namespace " + namespace
	if t.allNamespaces {
		where = "any namespace"
	} else {
		opts = append(opts, client.InNamespace(namespace))
	}
	var list subflowv1.SubscriptionFlowList
	if err := c.List(ctx, &list, opts...); err != nil {
		return nil, err
	}
	if len(list.Items) == 0 {
		return nil, fmt.Errorf("%w in %s matches -l %s", errNoMatch, where, t.selector)
	}
	sort.Slice(list.Items, func(i, j int) bool {
		a, b := list.Items[i], list.Items[j]
		return a.Namespace < b.Namespace || (a.Namespace == b.Namespace && a.Name < b.Name)
	})
	return list.Items, nil
}

// patchAnnotations changes only the given annotations of every flow, in one JSON merge patch
// each, so that nothing else on an object can be overwritten by a stale copy. Several flows are
// first patched as a server-side dry run, so that a refusal (RBAC, admission) of any of them
// changes none; done names each flow as it is changed, and the error every flow that refused.
func patchAnnotations(ctx context.Context, c client.Client, flows []types.NamespacedName, annotations map[string]any,
	done func(types.NamespacedName)) error {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if err != nil {
		return err
	}
	patch := func(key types.NamespacedName, opts ...client.PatchOption) error {
		flow := &subflowv1.SubscriptionFlow{}
		flow.Namespace, flow.Name = key.Namespace, key.Name
		return c.Patch(ctx, flow, client.RawPatch(types.MergePatchType, body), opts...)
	}
	if len(flows) == 1 {
		if err := patch(flows[0]); err != nil {
			return err // as kubectl says it
		}
		done(flows[0])
		return nil
	}
	dryRun := eachFlow(flows, func(key types.NamespacedName) error { return patch(key, client.DryRunAll) })
	if refused := refusals(flows, dryRun); len(refused) > 0 {
		return fmt.Errorf("none of the %d flows was changed: %d %s the change:\n%s", len(flows), len(refused),
			plural(len(refused), "refuses", "refuse"), strings.Join(refused, "\n"))
	}
	errs := eachFlow(flows, func(key types.NamespacedName) error { return patch(key) })
	for i, err := range errs {
		if err == nil {
			done(flows[i])
		}
	}
	if refused := refusals(flows, errs); len(refused) > 0 {
		return fmt.Errorf("%d of the %d flows were changed; %d refused the change:\n%s", len(flows)-len(refused), len(flows),
			len(refused), strings.Join(refused, "\n"))
	}
	return nil
}

// refusals names every flow whose change failed, with why, one to a line: an operator
// switching a fleet must see all the flows left behind, not only the first.
func refusals(flows []types.NamespacedName, errs []error) []string {
	var refused []string
	for i, err := range errs {
		if err != nil {
			refused = append(refused, fmt.Sprintf("  %s/%s: %v", flows[i].Namespace, flows[i].Name, err))
		}
	}
	return refused
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// fleetParallelism bounds the requests a fleet command has in flight: a hundred flows are
// changed in a few round trips' time instead of two hundred in a row.
const fleetParallelism = 16

// eachFlow calls do for every flow, at most fleetParallelism at once, and returns each flow's
// error in the flows' order.
func eachFlow(flows []types.NamespacedName, do func(types.NamespacedName) error) []error {
	errs := make([]error, len(flows))
	sem := make(chan struct{}, fleetParallelism)
	var wg sync.WaitGroup
	for i, key := range flows {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			errs[i] = do(key)
		}()
	}
	wg.Wait()
	return errs
}

// flowRef is how a changed flow is named in output: with its namespace when -A spans several.
func (t *targets) flowRef(key types.NamespacedName) string {
	if t.allNamespaces {
		return fmt.Sprintf("%s/%s -n %s", resourceName, key.Name, key.Namespace)
	}
	return resourceName + "/" + key.Name
}
