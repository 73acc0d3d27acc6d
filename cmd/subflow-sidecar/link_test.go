package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The sidecar makes its admin calls through sidecar.Admin, not through an agent without
// consumers, so its binary links none of the agent's Agent and Consumer methods: their code
// (and the client code only they reach) is not in the pages the sidecar's RSS counts
// (BENCHMARKS.md, the sidecar's RSS target).
func TestBinaryLinksNoAgentConsumer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the sidecar binary")
	}
	bin := filepath.Join(t.TempDir(), "subflow-sidecar")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build the sidecar: %v: %s", err, out)
	}
	out, err := exec.Command("go", "tool", "nm", bin).Output()
	if err != nil {
		t.Fatalf("go tool nm: %v", err)
	}
	var linked []string
	for line := range strings.SplitSeq(string(out), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 3 {
			continue
		}
		name := fields[len(fields)-1]
		if strings.HasPrefix(name, "github.com/subflow-dev/subflow/agent.(*Consumer).") ||
			strings.HasPrefix(name, "github.com/subflow-dev/subflow/agent.(*Agent).") {
			linked = append(linked, name)
		}
	}
	if len(linked) > 0 {
		t.Fatalf("the sidecar links %d methods of agent.Agent and agent.Consumer, among them %s", len(linked), strings.Join(linked[:min(5, len(linked))], ", "))
	}
}
