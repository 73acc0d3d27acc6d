package main

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

func (p *plugin) listCommand() *cobra.Command {
	var (
		allNamespaces bool
		selector      string
		output        *outputFlags
	)
	cmd := &cobra.Command{
		Use:     "list [-A | -n NAMESPACE] [-l SELECTOR] [-o json|yaml|wide|name|...]",
		Aliases: []string{"ls"},
		Short:   "List flows with their desired and effective state, like kubectl get",
		Example: "  kubectl subflow list -A -l db=orders -o wide\n  kubectl subflow list -n shop -o name",
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("list takes no arguments, got: %v", args)
			}
			printer, err := output.printer()
			if err != nil {
				return err
			}
			var opts []client.ListOption
			if selector != "" {
				s, err := labels.Parse(selector)
				if err != nil {
					return fmt.Errorf("-l %q is not a label selector: %v", selector, err)
				}
				opts = append(opts, client.MatchingLabelsSelector{Selector: s})
			}
			c, namespace, err := p.connect()
			if err != nil {
				return err
			}
			if !allNamespaces {
				opts = append(opts, client.InNamespace(namespace))
			}
			var flows subflowv1.SubscriptionFlowList
			if err := c.List(cmd.Context(), &flows, opts...); err != nil {
				return err
			}
			if printer != nil {
				return printFlows(p.stdout, printer, flows.Items)
			}
			if len(flows.Items) == 0 {
				if allNamespaces {
					fmt.Fprintln(p.stderr, "No resources found")
				} else {
					fmt.Fprintf(p.stderr, "No resources found in %s namespace.\n", namespace)
				}
				return nil
			}
			return printList(p.stdout, flows.Items, allNamespaces, output.wide(), p.now())
		},
	}
	cmd.Flags().BoolVarP(&allNamespaces, "all-namespaces", "A", false, "list the flows of every namespace")
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "list only the flows with these labels, e.g. -l db=orders")
	output = newOutputFlags(cmd)
	return cmd
}

// printList prints kubectl get's columns for the CRD plus the state source; wide adds the
// subscription, the topic, the pods synced of those matched and the pod selector.
func printList(out io.Writer, flows []subflowv1.SubscriptionFlow, withNamespace, wide bool, now time.Time) error {
	w := printers.GetNewTabWriter(out)
	header := "NAME\tSTATE\tEFFECTIVE\tPAUSED\tREADY\tSOURCE\tAGE"
	if withNamespace {
		header = "NAMESPACE\t" + header
	}
	if wide {
		header += "\tSUBSCRIPTION\tTOPIC\tPODS\tSELECTOR"
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
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s", f.Name, f.Spec.State, f.Status.EffectiveState,
			f.Status.Consumers.Halted, ready, f.Status.StateSource, age(f.CreationTimestamp, now))
		if wide {
			fmt.Fprintf(w, "\t%s\t%s\t%d/%d\t%s", oneWord(f.Spec.Subscription), orDefault(oneWord(f.Spec.Topic), "<all>"),
				f.Status.Pods.Synced, f.Status.Pods.Matched, metav1.FormatLabelSelector(&f.Spec.Selector))
		}
		fmt.Fprintln(w)
	}
	return w.Flush()
}
