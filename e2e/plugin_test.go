package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestPluginSeekFleetAndWait: an on-call engineer's kubectl subflow on real Deployments. A seek
// by broker-entry index replays from that message; the fleet switch pauses the flows of two
// namespaces by label and kubectl wait sees both Paused; clear lets both run again.
func TestPluginSeekFleetAndWait(t *testing.T) {
	a := startIncident(t, "shop-fleet-a", goAgent, 1)
	b := startIncident(t, "shop-fleet-b", pythonSidecar, 1)
	for _, in := range []*incident{a, b} {
		kubectl(t, "label", "sf", in.sub, "-n", in.ns, "db=orders")
		in.resume(t)
	}

	// Seek a back to the 6th message produced (broker-entry indexes start at 0): the consumer
	// processes before-5 and every later message a second time.
	out := kubectl(t, "subflow", "seek", a.sub, "-n", a.ns, "--index", "5", "--id", "replay-1")
	if !strings.Contains(out, "seek requested: id replay-1") {
		t.Errorf("kubectl subflow seek printed %q", out)
	}
	eventually(t, 90*time.Second, "the seek is reported done and replayed from index 5", func() error {
		status := kubectl(t, "get", "sf", a.sub, "-n", a.ns, "-o", "jsonpath={.status.seek.id} {.status.seek.phase}")
		counts := printed(t, a.ns, a.selector, "app")
		if counts["before-5"] < 2 || counts["during-19"] < 2 {
			return fmt.Errorf("status.seek %q; before-5 processed %d times, during-19 %d times", status, counts["before-5"], counts["during-19"])
		}
		if counts["before-4"] != 1 {
			return fmt.Errorf("before-4 (below the index) processed %d times, want once", counts["before-4"])
		}
		return nil
	})
	if status := kubectl(t, "subflow", "status", a.sub, "-n", a.ns); !strings.Contains(status, "replay-1") {
		t.Errorf("kubectl subflow status does not name the seek:\n%s", status)
	}

	// The fleet switch, across both namespaces, and kubectl wait on both.
	kubectl(t, "subflow", "pause", "-l", "db=orders", "-A", "--reason", "INC-42")
	kubectl(t, "wait", "sf", "-l", "db=orders", "-A", "--for=condition=Paused", "--timeout=60s")
	kubectl(t, "subflow", "wait", "-l", "db=orders", "-A", "--for", "paused", "--timeout", "60s")
	list := kubectl(t, "get", "sf", "-A", "-l", "db=orders", "-o", "custom-columns=NS:.metadata.namespace,EFFECTIVE:.status.effectiveState", "--no-headers")
	if n := strings.Count(list, "Paused"); n != 2 {
		t.Errorf("after kubectl subflow pause -l db=orders -A, %d flows are Paused:\n%s", n, list)
	}
	extra := produce(t, a.topic, "fleet", 5)
	assertNothingProcessed(t, a.ns, a.selector, extra, 3*time.Second)
	kubectl(t, "subflow", "clear", "-l", "db=orders", "-A")
	a.waitProcessed(t, extra)
}
