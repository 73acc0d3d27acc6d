package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// The README's "An incident in five minutes", command by command as printed there, against
// the interactive demo once its walk-through is over: each must succeed (kubectl's exit
// codes), the pause must really pause (wait --for paused returns) and the flow must run again
// at the end. This is what a newcomer tries first.
func TestREADMEIncidentWalkThroughOnTheInteractiveDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole demo")
	}
	commands := incidentCommands(t)
	plugin := filepath.Join(t.TempDir(), "kubectl-subflow")
	if out, err := exec.Command("go", "build", "-o", plugin, "../../cmd/kubectl-subflow").CombinedOutput(); err != nil {
		t.Fatalf("building the plugin: %v\n%s", err, out)
	}
	d := startInteractive(t)
	go func() {
		for range d.lines { // the demo keeps printing its table; never let it block
		}
	}()
	for _, args := range commands {
		if slices.Contains(args, "-w") || slices.Contains(args, "--watch") {
			args = append(args, "--timeout", "3s") // a watch runs until Ctrl-C: end it as a user would
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, plugin, args...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+d.kubeconfig)
		out, err := cmd.CombinedOutput()
		cancel()
		t.Logf("kubectl subflow %s\n%s", strings.Join(args, " "), out)
		if err != nil {
			t.Fatalf("kubectl subflow %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// incidentCommands reads the `kubectl subflow ...` commands of the README's incident section,
// in order.
func incidentCommands(t *testing.T) [][]string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	start := strings.Index(text, "## An incident in five minutes")
	if start < 0 {
		t.Fatal("README has no section \"An incident in five minutes\"")
	}
	section := text[start:]
	// The walk-through ends at the next heading; the plugin's reference follows it.
	if end := regexp.MustCompile("\n##+ ").FindStringIndex(section[3:]); end != nil {
		section = section[:end[0]+3]
	}
	var commands [][]string
	for _, m := range regexp.MustCompile("`kubectl subflow ([^`]+)`").FindAllStringSubmatch(section, -1) {
		commands = append(commands, strings.Fields(m[1]))
	}
	if len(commands) < 8 {
		t.Fatalf("found %d commands in the README's incident section, want the 8 steps' commands: %v", len(commands), commands)
	}
	return commands
}
