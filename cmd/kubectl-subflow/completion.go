package main

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// namedFlowCommands take the NAME of an existing flow; release takes a deleted flow's name.
var namedFlowCommands = []string{"pause", "resume", "stop", "clear", "seek", "status", "wait"}

// registerCompletions completes flow names and fixed flag values, for `completion SHELL`
// scripts and for kubectl_complete-subflow alike (both ask `__complete`).
func (p *plugin) registerCompletions(root *cobra.Command) {
	for _, cmd := range root.Commands() {
		if slices.Contains(namedFlowCommands, cmd.Name()) {
			cmd.ValidArgsFunction = p.completeFlowNames
		}
	}
	root.InitDefaultCompletionCmd()
	if cmd, _, err := root.Find([]string{"completion"}); err == nil && cmd != root {
		// Without a Run, `completion` alone would print the help and exit 0.
		cmd.RunE = func(*cobra.Command, []string) error {
			return errors.New("completion needs a shell: bash, zsh, fish or powershell")
		}
	}
	if cmd, _, err := root.Find([]string{"wait"}); err == nil {
		_ = cmd.RegisterFlagCompletionFunc("for", cobra.FixedCompletions([]string{"paused", "stopped", "running"},
			cobra.ShellCompDirectiveNoFileComp))
	}
}

// completeFlowNames offers the names of the flows in the namespace (-n, or the context's)
// that start with what was typed; none once NAME is given or -l is used.
func (p *plugin) completeFlowNames(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 || (cmd.Flags().Lookup("selector") != nil && cmd.Flags().Lookup("selector").Changed) {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	c, namespace, err := p.connect()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	// A shell waits for the answer: an unreachable server must not hang the prompt.
	ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Second)
	defer cancel()
	var flows subflowv1.SubscriptionFlowList
	if err := c.List(ctx, &flows, client.InNamespace(namespace)); err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var names []cobra.Completion
	for _, f := range flows.Items {
		if strings.HasPrefix(f.Name, toComplete) {
			names = append(names, f.Name)
		}
	}
	return names, cobra.ShellCompDirectiveNoFileComp
}
