package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// completion SHELL prints cobra's script for each shell kubectl supports.
func TestCompletionScripts(t *testing.T) {
	for shell, want := range map[string]string{
		"bash":       "# bash completion V2 for kubectl-subflow",
		"zsh":        "#compdef kubectl-subflow",
		"fish":       "complete -c kubectl-subflow ",
		"powershell": "Register-ArgumentCompleter -CommandName 'kubectl-subflow'",
	} {
		r := mustSucceed(t, "completion", shell)
		if !strings.Contains(r.stdout, want) {
			t.Errorf("completion %s lacks %q:\n%.300s", shell, want, r.stdout)
		}
	}
	for _, tc := range []struct{ args, want string }{
		{"completion", "error: completion needs a shell: bash, zsh, fish or powershell\n"},
		{"completion tcsh", `error: unknown command "tcsh" for "kubectl subflow completion"` + "\n"},
	} {
		if r := subflow(strings.Fields(tc.args)...); r.code != 1 || r.stdout != "" || r.stderr != tc.want {
			t.Errorf("%s: %s, want stderr %q", tc.args, r, tc.want)
		}
	}
}

// What a shell asks through `__complete`: the flows of the namespace for NAME, the values of
// --for and -o.
func TestCompletionOffersFlowNamesAndFlagValues(t *testing.T) {
	ns := namespace(t, "completion")
	newFlow(t, ns, "orders", nil)
	newFlow(t, ns, "orders-audit", nil)
	newFlow(t, ns, "payments", nil)
	complete := func(args ...string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		// The word being completed comes last, after the connection flags.
		args = append([]string{"__complete", "--kubeconfig", kubeconfig}, args...)
		if code := run(args, &stdout, &stderr); code != 0 {
			t.Fatalf("%v: exit %d, stderr %q", args, code, stderr.String())
		}
		return stdout.String()
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "-n", ns, ""}, "orders\norders-audit\npayments\n:4\n"},
		{[]string{"pause", "-n", ns, "ord"}, "orders\norders-audit\n:4\n"},
		{[]string{"resume", "-n", ns, "orders", ""}, ":4\n"}, // one NAME only
		{[]string{"wait", "orders", "-n", ns, "--for", ""}, "paused\nstopped\nrunning\n:4\n"},
	} {
		if got := complete(tc.args...); got != tc.want {
			t.Errorf("completing %q: got %q, want %q", tc.args, got, tc.want)
		}
	}
	if got := complete("list", "-o", "ya"); !strings.Contains(got, "yaml\n") || !strings.HasSuffix(got, ":4\n") {
		t.Errorf("completing -o ya: %q", got)
	}
}

// kubectl completes `kubectl subflow` by running kubectl_complete-subflow from PATH with the
// words after "subflow": the script shipped beside the plugin answers with the flow names.
func TestKubectlCompleteScriptAsksThePlugin(t *testing.T) {
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(bin, "kubectl-subflow"), ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	script, err := os.ReadFile("kubectl_complete-subflow")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "kubectl_complete-subflow"), script, 0o755); err != nil {
		t.Fatal(err)
	}
	ns := namespace(t, "kubectl-complete")
	newFlow(t, ns, "orders", nil)

	cmd := exec.Command(filepath.Join(bin, "kubectl_complete-subflow"), "status", "-n", ns, "or")
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "KUBECONFIG="+kubeconfig)
	out, err := cmd.Output()
	if err != nil || string(out) != "orders\n:4\n" {
		t.Errorf("kubectl_complete-subflow status -n %s or: %v, stdout %q", ns, err, out)
	}
}
