package main

import (
	"context"
	"fmt"
	"io"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// version is the plugin's version, set by a release build with -ldflags "-X main.version=1.2.3"
// (make release: its VERSION, the images' tag); otherwise the module's version from the build
// information.
var version string

// The controller's Deployment carries these labels in both the chart and config/manager.
const (
	componentLabel   = "app.kubernetes.io/component"
	controllerLabels = componentLabel + "=controller"
	partOfLabel      = "app.kubernetes.io/part-of"
	nameLabel        = "app.kubernetes.io/name"
	controllerName   = "manager" // the controller's container
)

func (p *plugin) versionCommand() *cobra.Command {
	var (
		allNamespaces       bool
		clientOnly          bool
		controllerNamespace string
	)
	cmd := &cobra.Command{
		Use:   "version [--client] [-A | -n NAMESPACE] [--controller-namespace NAMESPACE]",
		Short: "Show the plugin's, the controller's and the agents' versions",
		Long: `Show the plugin's version, the controller's (the image tag of its Deployment, found by the
labels app.kubernetes.io/component=controller and app.kubernetes.io/part-of=subflow or
app.kubernetes.io/name=subflow, in every namespace unless --controller-namespace names one),
and the versions the agents reported in the status of the flows of the namespace (-A: of
every namespace), counted per pod. A pod whose agent has not answered counts under "-".
--client shows the plugin's version alone, without reaching the cluster.`,
		Example: "  kubectl subflow version -A",
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("version takes no arguments, got: %v", args)
			}
			fmt.Fprintf(p.stdout, "Plugin:     %s\n", pluginVersion())
			if clientOnly {
				return nil
			}
			c, namespace, err := p.connect()
			if err != nil {
				return err
			}
			if err := p.printControllers(cmd.Context(), c, controllerNamespace); err != nil {
				return err
			}
			where := "namespace " + namespace
			opts := []client.ListOption{client.InNamespace(namespace)}
			if allNamespaces {
				where, opts = "all namespaces", nil
			}
			var flows subflowv1.SubscriptionFlowList
			if err := c.List(cmd.Context(), &flows, opts...); err != nil {
				return err
			}
			return printAgentVersions(p.stdout, flows.Items, where)
		},
	}
	cmd.Flags().BoolVarP(&allNamespaces, "all-namespaces", "A", false, "count the agents of the flows of every namespace")
	cmd.Flags().BoolVar(&clientOnly, "client", false, "show the plugin's version only, without reaching the cluster")
	cmd.Flags().StringVar(&controllerNamespace, "controller-namespace", "",
		"look for the controller's Deployment only in this namespace (default: every namespace)")
	return cmd
}

// pluginVersion is the release's version, a module version (go install ...@v1.2.3), or
// "(devel) <revision>" for a build from a checkout, as the agents report theirs.
func pluginVersion() string {
	if version != "" {
		return version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" {
			return "(devel) " + s.Value
		}
	}
	return "(devel)"
}

// printControllers names each controller Deployment found with its version; finding none, or
// being refused the list, is said plainly and is no error (flows and agents still print).
func (p *plugin) printControllers(ctx context.Context, c client.Client, namespace string) error {
	where := "any namespace"
	opts := []client.ListOption{client.HasLabels{componentLabel}}
	if namespace != "" {
		where = "namespace " + namespace
		opts = append(opts, client.InNamespace(namespace))
	}
	var deployments appsv1.DeploymentList
	err := c.List(ctx, &deployments, opts...)
	switch {
	case apierrors.IsForbidden(err):
		fmt.Fprintf(p.stdout, "Controller: unknown: you may not list Deployments in %s (give --controller-namespace "+
			"with the controller's namespace)\n", where)
		return nil
	case err != nil:
		return err
	}
	found := 0
	for _, d := range deployments.Items {
		l := d.Labels
		if l[componentLabel] != "controller" || (l[partOfLabel] != "subflow" && l[nameLabel] != "subflow") {
			continue
		}
		found++
		fmt.Fprintf(p.stdout, "Controller: %s\n", describeController(&d))
	}
	if found == 0 {
		fmt.Fprintf(p.stdout, "Controller: not found: no Deployment in %s is labelled %s and %s=subflow or %s=subflow "+
			"(is subflow installed, or in a namespace you may not read?)\n", where, controllerLabels, partOfLabel, nameLabel)
	}
	return nil
}

// describeController says the version of the controller's image with where it runs.
func describeController(d *appsv1.Deployment) string {
	containers := d.Spec.Template.Spec.Containers
	image := ""
	if i := slices.IndexFunc(containers, func(c corev1.Container) bool { return c.Name == controllerName }); i >= 0 {
		image = containers[i].Image
	} else if len(containers) > 0 {
		image = containers[0].Image
	}
	replicas := int32(1)
	if d.Spec.Replicas != nil {
		replicas = *d.Spec.Replicas
	}
	return fmt.Sprintf("%s (image %s; Deployment %s/%s, %d/%d replicas ready)", imageVersion(image), oneWord(image),
		d.Namespace, d.Name, d.Status.ReadyReplicas, replicas)
}

// imageVersion is an image reference's tag, else its digest, else "latest" as a runtime reads it.
func imageVersion(image string) string {
	name, digest, hasDigest := strings.Cut(image, "@")
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		return oneWord(name[i+1:])
	}
	if hasDigest {
		return oneWord(digest)
	}
	if image == "" {
		return "(no image)"
	}
	return "latest"
}

// agentKey groups pods by what their agents reported.
type agentKey struct{ version, kind, protocol string }

// printAgentVersions counts the pods (each once, however many flows select it) per agent
// version, kind and protocol, with how many flows they serve.
func printAgentVersions(out io.Writer, flows []subflowv1.SubscriptionFlow, where string) error {
	pods := map[types.NamespacedName]agentKey{}
	flowsOf := map[agentKey]map[types.NamespacedName]bool{}
	for _, f := range flows {
		for _, a := range f.Status.Agents {
			pod := types.NamespacedName{Namespace: f.Namespace, Name: a.Pod}
			key := agentKey{version: orDefault(oneWord(a.AgentVersion), "-"), kind: orDefault(oneWord(a.Kind), "-"), protocol: "-"}
			if a.ProtocolVersion > 0 {
				key.protocol = fmt.Sprint(a.ProtocolVersion)
			}
			if seen, ok := pods[pod]; !ok || seen.version == "-" {
				pods[pod] = key // a flow whose push the agent answered knows more than one it did not
			}
			if flowsOf[key] == nil {
				flowsOf[key] = map[types.NamespacedName]bool{}
			}
			flowsOf[key][types.NamespacedName{Namespace: f.Namespace, Name: f.Name}] = true
		}
	}
	fmt.Fprintf(out, "Agents:     %d %s in %d %s in %s\n", len(pods), plural(len(pods), "pod", "pods"), len(flows),
		plural(len(flows), "flow", "flows"), where)
	if len(pods) == 0 {
		return nil
	}
	count := map[agentKey]int{}
	for _, key := range pods {
		count[key]++
	}
	keys := make([]agentKey, 0, len(count))
	for key := range count {
		keys = append(keys, key)
	}
	// Most pods first; "-" (not answered) last.
	slices.SortFunc(keys, func(a, b agentKey) int {
		switch {
		case (a.version == "-") != (b.version == "-"):
			if a.version == "-" {
				return 1
			}
			return -1
		case count[a] != count[b]:
			return count[b] - count[a]
		}
		return strings.Compare(a.version+a.kind+a.protocol, b.version+b.kind+b.protocol)
	})
	w := printers.GetNewTabWriter(out)
	fmt.Fprintln(w, "  VERSION\tKIND\tPROTOCOL\tPODS\tFLOWS")
	for _, key := range keys {
		fmt.Fprintf(w, "  %s\t%s\t%s\t%d\t%d\n", key.version, key.kind, key.protocol, count[key], len(flowsOf[key]))
	}
	return w.Flush()
}
