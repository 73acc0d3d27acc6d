package main

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

func (p *plugin) listCommand() *cobra.Command {
	var allNamespaces bool
	cmd := &cobra.Command{
		Use:     "list [-A | -n NAMESPACE]",
		Aliases: []string{"ls"},
		Short:   "List flows with their desired and effective state, like kubectl get",
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("list takes no arguments, got: %v", args)
			}
			c, namespace, err := p.connect()
			if err != nil {
				return err
			}
			var opts []client.ListOption
			if !allNamespaces {
				opts = append(opts, client.InNamespace(namespace))
			}
			var flows subflowv1.SubscriptionFlowList
			if err := c.List(cmd.Context(), &flows, opts...); err != nil {
				return err
			}
			if len(flows.Items) == 0 {
				if allNamespaces {
					fmt.Fprintln(p.stderr, "No resources found")
				} else {
					fmt.Fprintf(p.stderr, "No resources found in %s namespace.\n", namespace)
				}
				return nil
			}
			return printList(p.stdout, flows.Items, allNamespaces, p.now())
		},
	}
	cmd.Flags().BoolVarP(&allNamespaces, "all-namespaces", "A", false, "list the flows of every namespace")
	return cmd
}

// printList prints kubectl get's columns for the CRD plus the state source.
func printList(out io.Writer, flows []subflowv1.SubscriptionFlow, withNamespace bool, now time.Time) error {
	w := printers.GetNewTabWriter(out)
	header := "NAME\tSTATE\tEFFECTIVE\tPAUSED\tREADY\tSOURCE\tAGE"
	if withNamespace {
		header = "NAMESPACE\t" + header
	}
	fmt.Fprintln(w, header)
	for _, f := range flows {
		if withNamespace {
			fmt.Fprintf(w, "%s\t", f.Namespace)
		}
		ready := ""
		if c := meta.FindStatusCondition(f.Status.Conditions, subflowv1.ConditionReady); c != nil {
			ready = string(c.Status)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", f.Name, f.Spec.State, f.Status.EffectiveState,
			f.Status.Consumers.Halted, ready, f.Status.StateSource, age(f.CreationTimestamp, now))
	}
	return w.Flush()
}
