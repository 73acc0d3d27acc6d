package main

import (
	"fmt"
	"io"
	"slices"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/printers"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// outputFlags is -o: the plugin's own table or description (no -o, or -o wide with more
// columns), or kubectl's printers from cli-runtime for json, yaml, name, jsonpath and
// go-template, which print what `kubectl get subscriptionflows` prints with the same -o.
type outputFlags struct {
	print *genericclioptions.PrintFlags
}

func newOutputFlags(cmd *cobra.Command) *outputFlags {
	o := &outputFlags{print: genericclioptions.NewPrintFlags("").WithTypeSetter(scheme)}
	o.print.AddFlags(cmd)
	cmd.Flag("output").Usage = fmt.Sprintf("Output format. One of: (%s).", joinFormats(o.allowed()))
	_ = cmd.RegisterFlagCompletionFunc("output", func(*cobra.Command, []string, string) ([]cobra.Completion, cobra.ShellCompDirective) {
		return o.allowed(), cobra.ShellCompDirectiveNoFileComp
	})
	return o
}

func (o *outputFlags) allowed() []string {
	formats := append([]string{"wide"}, o.print.AllowedFormats()...)
	slices.Sort(formats)
	return formats
}

func joinFormats(formats []string) string {
	text := ""
	for i, f := range formats {
		if i > 0 {
			text += ", "
		}
		text += f
	}
	return text
}

// human says whether the plugin prints its own text; wide whether with more columns.
func (o *outputFlags) human() bool { return *o.print.OutputFormat == "" || o.wide() }
func (o *outputFlags) wide() bool  { return *o.print.OutputFormat == "wide" }

// printer is kubectl's printer for -o; an unknown format is refused as kubectl refuses it,
// before anything talks to the server.
func (o *outputFlags) printer() (printers.ResourcePrinter, error) {
	if o.human() {
		return nil, nil
	}
	p, err := o.print.ToPrinter()
	if genericclioptions.IsNoCompatiblePrinterError(err) {
		return nil, fmt.Errorf("unable to match a printer suitable for the output format %q, allowed formats are: %s",
			*o.print.OutputFormat, joinFormats(o.allowed()))
	}
	return p, err
}

// flowList is what kubectl get prints for several objects: a v1 List of them, each with its
// apiVersion and kind.
func flowList(flows []subflowv1.SubscriptionFlow) (*unstructured.UnstructuredList, error) {
	list := &unstructured.UnstructuredList{Object: map[string]any{"apiVersion": "v1", "kind": "List",
		"metadata": map[string]any{"resourceVersion": ""}}}
	for i := range flows {
		f := flows[i].DeepCopy()
		f.SetGroupVersionKind(subflowv1.GroupVersion.WithKind("SubscriptionFlow"))
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(f)
		if err != nil {
			return nil, err
		}
		list.Items = append(list.Items, unstructured.Unstructured{Object: obj})
	}
	return list, nil
}

// printFlows prints flows with kubectl's printer: a List for json, yaml and templates, a line
// per flow for name.
func printFlows(out io.Writer, printer printers.ResourcePrinter, flows []subflowv1.SubscriptionFlow) error {
	list, err := flowList(flows)
	if err != nil {
		return err
	}
	return printer.PrintObj(list, out)
}
