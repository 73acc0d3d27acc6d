package chaos

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestShortRun is the CI run: a fixed seed (CHAOS_SEED overrides it), at least 10k messages
// and 100 operations over every consumer kind and fault, every invariant checked.
func TestShortRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane and runs for minutes")
	}
	seed := uint64(1)
	if s := os.Getenv("CHAOS_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	var out strings.Builder
	cfg := Config{Seed: seed, Ops: 120, Messages: 10000, Pods: 10, Duration: 80 * time.Second, Out: &out}
	if testing.Verbose() {
		cfg.Verbose = os.Stdout
	}
	rep, err := Run(context.Background(), cfg)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Produced < 10000 || sum(rep.Ops) < 100 {
		t.Fatalf("run too small: %d messages, %d operations", rep.Produced, sum(rep.Ops))
	}
	if rep.Failed() {
		t.Fatalf("invariants violated with seed %d: %v", seed, rep.ViolationCounts)
	}
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
