// Command kubectl-subflow is the `kubectl subflow` plugin: one command for each move an on-call
// engineer makes on a SubscriptionFlow (pause, resume, stop, clear, seek, status, wait, list,
// release), for one flow or, with -l, for every flow a label selector picks.
//
// Install it from a checkout with `go install ./cmd/kubectl-subflow` (the module is not
// published); kubectl finds any kubectl-* binary on PATH. It takes kubectl's connection flags (--kubeconfig,
// --context, -n/--namespace, --as, ...) and prints errors the way kubectl does. kubectl 1.26 and later
// complete `kubectl subflow` through the script kubectl_complete-subflow beside this file.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// resourceName is how kubectl names the kind in its messages.
const resourceName = "subscriptionflow.subflow.dev"

func main() {
	// Ctrl-C ends the command's context: status --watch ends cleanly and release deletes the
	// flow it created. A second Ctrl-C kills the plugin as usual.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop)
	os.Exit(runContext(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run executes one plugin invocation and returns its exit code: 0 on success, 1 on any error
// (after printing it to stderr as kubectl would).
func run(args []string, stdout, stderr io.Writer) int {
	return runContext(context.Background(), args, stdout, stderr)
}

// runContext is run until ctx ends, as Ctrl-C ends it.
func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	silenceLibraryLogs.Do(func() {
		// client-go and controller-runtime would otherwise log to stderr behind our messages.
		ctrllog.SetLogger(logr.Discard())
		klog.SetLogger(logr.Discard())
	})
	p := &plugin{stdout: stdout, stderr: stderr, flags: genericclioptions.NewConfigFlags(true), now: time.Now}
	root := p.rootCommand()
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(stderr, kubectlMessage(err))
		return 1
	}
	return 0
}

var silenceLibraryLogs sync.Once

// plugin holds what every subcommand shares.
type plugin struct {
	stdout, stderr io.Writer
	flags          *genericclioptions.ConfigFlags
	now            func() time.Time
}

func (p *plugin) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:         "kubectl-subflow",
		Annotations: map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl subflow"},
		Short:       "Pause, resume, stop and seek Pulsar subscriptions declared by SubscriptionFlows",
		Long: `Pause, resume, stop and seek Pulsar subscriptions declared by SubscriptionFlows.

pause, resume and stop set the on-call override annotations, which win over spec.state and
maintenance windows until they expire (--for) or are removed (clear). seek asks for a one-shot
seek by broker-entry index. status, wait and list read what the controller reported; version
names the plugin's, the controller's and the agents' versions.`,
		SilenceErrors: true,
		SilenceUsage:  true,
		// completion bash|zsh|fish|powershell completes kubectl-subflow run by itself; kubectl
		// completes `kubectl subflow` through kubectl_complete-subflow, which calls __complete.
	}
	root.SetOut(p.stdout) // before the completion command, which keeps the writer it is built with
	root.SetErr(p.stderr)
	p.flags.AddFlags(root.PersistentFlags())
	root.AddCommand(
		p.overrideCommand("pause", subflowv1.StatePaused),
		p.overrideCommand("resume", subflowv1.StateRunning),
		p.overrideCommand("stop", subflowv1.StateStopped),
		p.clearCommand(),
		p.seekCommand(),
		p.statusCommand(),
		p.waitCommand(),
		p.listCommand(),
		p.releaseCommand(),
		p.versionCommand(),
	)
	p.registerCompletions(root)
	return root
}

// connect builds an API client and resolves the namespace the way kubectl does (-n, then the
// kubeconfig context's namespace, then "default").
func (p *plugin) connect() (client.WithWatch, string, error) {
	namespace, _, err := p.flags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return nil, "", err
	}
	cfg, err := p.flags.ToRESTConfig()
	if err != nil {
		return nil, "", err
	}
	// client-go's default (5 requests/s, bursts of 10) makes the fleet switch's 2 requests per
	// flow take 40 s for 100 flows; the API server's priority and fairness protects it instead.
	cfg.QPS, cfg.Burst = 100, 200
	c, err := newClient(cfg)
	return c, namespace, err
}

// getFlow reads the named flow in the current namespace, with the client that read it.
func (p *plugin) getFlow(ctx context.Context, name string) (client.WithWatch, *subflowv1.SubscriptionFlow, error) {
	c, namespace, err := p.connect()
	if err != nil {
		return nil, nil, err
	}
	var flow subflowv1.SubscriptionFlow
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &flow); err != nil {
		return nil, nil, err
	}
	return c, &flow, nil
}

func newClient(cfg *rest.Config) (client.WithWatch, error) {
	return client.NewWithWatch(cfg, client.Options{Scheme: scheme})
}

// scheme knows SubscriptionFlows and the built-in kinds the plugin reads (Deployments).
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(subflowv1.AddToScheme(s))
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	return s
}()

// oneName checks the single NAME argument before anything talks to the server.
func oneName(args []string) (string, error) {
	switch {
	case len(args) == 0:
		return "", errors.New("NAME is required: give the SubscriptionFlow's name")
	case len(args) > 1:
		return "", fmt.Errorf("exactly one NAME is expected, got %d: %s", len(args), strings.Join(args, " "))
	case args[0] == "":
		return "", errors.New("NAME must not be empty")
	}
	return args[0], nil
}

// kubectlMessage renders an error the way kubectl's CheckErr does: API errors as
// "Error from server (Reason): message", everything else as "error: message".
func kubectlMessage(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		s := status.Status()
		reason := string(s.Reason)
		if reason == "" {
			reason = fmt.Sprintf("%d", s.Code)
		}
		return fmt.Sprintf("Error from server (%s): %s", reason, s.Message)
	}
	if meta.IsNoMatchError(err) {
		return `error: the server doesn't have a resource type "subscriptionflows" (is the subflow CRD installed?)`
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "error: timed out talking to the API server"
	}
	return "error: " + err.Error()
}
