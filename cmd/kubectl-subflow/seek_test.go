package main

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

func TestSeekByIndexGeneratesAnID(t *testing.T) {
	ns := namespace(t, "seek-index")
	newFlow(t, ns, "orders", nil)

	r := mustSucceed(t, "seek", "orders", "--index", "120034", "-n", ns)

	seek := getFlow(t, ns, "orders").Spec.Seek
	if seek == nil || seek.Index == nil || *seek.Index != 120034 || seek.Partitions != nil {
		t.Fatalf("spec.seek = %+v, want index 120034", seek)
	}
	if !regexp.MustCompile(`^seek-\d{8}-\d{6}-[0-9a-f]{6}$`).MatchString(seek.ID) {
		t.Errorf("generated id %q", seek.ID)
	}
	want := "subscriptionflow.subflow.dev/orders seek requested: id " + seek.ID + ", index 120034 (follow it with: kubectl subflow status orders -n seek-index)\n"
	if r.stdout != want {
		t.Errorf("stdout %q, want %q", r.stdout, want)
	}

	// A second seek without --id gets its own id, so it runs again.
	mustSucceed(t, "seek", "orders", "--index", "120034", "-n", ns)
	if again := getFlow(t, ns, "orders").Spec.Seek; again.ID == seek.ID {
		t.Errorf("second seek reused id %q", seek.ID)
	}
}

// Switching between index and partitions replaces spec.seek whole: a merge patch would
// otherwise keep the other form and the API server would refuse both together.
func TestSeekSwitchesBetweenIndexAndPartitions(t *testing.T) {
	ns := namespace(t, "seek-partitions")
	newFlow(t, ns, "orders", func(f *subflowv1.SubscriptionFlow) { f.Spec.Topic = "persistent://shop/orders/events" })

	mustSucceed(t, "seek", "orders", "--index", "5", "--id", "first", "-n", ns)
	r := mustSucceed(t, "seek", "orders", "--partition", "0=5000", "--partition", "1=7100", "--id", "replay-2026-11-29", "-n", ns)
	if !strings.Contains(r.stdout, "id replay-2026-11-29, partitions 0=5000, 1=7100") {
		t.Errorf("stdout %q", r.stdout)
	}
	seek := getFlow(t, ns, "orders").Spec.Seek
	want := []subflowv1.PartitionIndex{{Partition: 0, Index: 5000}, {Partition: 1, Index: 7100}}
	if seek.ID != "replay-2026-11-29" || seek.Index != nil || !slices.Equal(seek.Partitions, want) {
		t.Fatalf("spec.seek = %+v", seek)
	}

	mustSucceed(t, "seek", "orders", "--index", "9", "--id", "third", "-n", ns)
	seek = getFlow(t, ns, "orders").Spec.Seek
	if seek.ID != "third" || seek.Index == nil || *seek.Index != 9 || seek.Partitions != nil {
		t.Fatalf("spec.seek = %+v", seek)
	}
}

// A seek runs once per id, so reusing the current id would silently do nothing.
func TestSeekRefusesTheCurrentID(t *testing.T) {
	ns := namespace(t, "seek-same-id")
	newFlow(t, ns, "orders", nil)
	mustSucceed(t, "seek", "orders", "--index", "1", "--id", "once", "-n", ns)
	before := getFlow(t, ns, "orders")

	r := subflow("seek", "orders", "--index", "2", "--id", "once", "-n", ns)

	want := "error: spec.seek.id is already \"once\": a seek runs once per id; give a new --id or leave it out\n"
	if r.code != 1 || r.stderr != want {
		t.Errorf("%s, want stderr %q", r, want)
	}
	if after := getFlow(t, ns, "orders"); after.ResourceVersion != before.ResourceVersion || *after.Spec.Seek.Index != 1 {
		t.Errorf("refused seek changed the flow: %+v", after.Spec.Seek)
	}
}

// --retry seeks exactly the partitions the last seek did not move, to the same indexes, under
// a new id; with nothing to retry it says why and changes nothing.
func TestSeekRetryAsksForTheFailedPartitionsOnly(t *testing.T) {
	ns := namespace(t, "seek-retry")
	newFlow(t, ns, "orders", func(f *subflowv1.SubscriptionFlow) { f.Spec.Topic = "persistent://shop/orders/events" })
	mustSucceed(t, "seek", "orders", "--partition", "0=5000", "--partition", "1=7100", "--partition", "2=90", "--id", "replay", "-n", ns)

	refused := func(wantErr string) {
		t.Helper()
		before := getFlow(t, ns, "orders")
		r := subflow("seek", "orders", "--retry", "-n", ns)
		if r.code != 1 || !strings.Contains(r.stderr, wantErr) {
			t.Errorf("%s, want an error containing %q", r, wantErr)
		}
		if after := getFlow(t, ns, "orders"); after.ResourceVersion != before.ResourceVersion {
			t.Errorf("a refused retry changed the flow: %+v", after.Spec.Seek)
		}
	}
	refused("no seek has run: nothing to retry")
	setStatus(t, ns, "orders", func(f *subflowv1.SubscriptionFlow) { f.Status.Seek = &subflowv1.SeekStatus{ID: "replay"} })
	refused("seek replay has not finished yet")
	done := metav1.Now()
	setStatus(t, ns, "orders", func(f *subflowv1.SubscriptionFlow) {
		f.Status.Seek = &subflowv1.SeekStatus{ID: "replay", CompletionTime: &done,
			Positions:        []subflowv1.SeekPosition{{Partition: 0, Index: 5000, MessageID: "3:7:0:-1"}},
			FailedPartitions: []subflowv1.SeekPartitionFailure{{Partition: 1, Index: 7100, Message: "HTTP 500"}, {Partition: 2, Index: 90, Message: "HTTP 500"}},
			Message:          "SeekPartiallyApplied: ..."}
	})
	if r := subflow("seek", "orders", "--retry", "--index", "3", "-n", ns); r.code != 1 || !strings.Contains(r.stderr, "without --index or --partition") {
		t.Errorf("--retry with --index: %s", r)
	}

	r := mustSucceed(t, "seek", "orders", "--retry", "--id", "replay-rest", "-n", ns)
	if !strings.Contains(r.stdout, "id replay-rest, partitions 1=7100, 2=90") {
		t.Errorf("stdout %q", r.stdout)
	}
	seek := getFlow(t, ns, "orders").Spec.Seek
	want := []subflowv1.PartitionIndex{{Partition: 1, Index: 7100}, {Partition: 2, Index: 90}}
	if seek.ID != "replay-rest" || seek.Index != nil || !slices.Equal(seek.Partitions, want) {
		t.Fatalf("spec.seek = %+v, want partitions 1 and 2 under id replay-rest", seek)
	}

	setStatus(t, ns, "orders", func(f *subflowv1.SubscriptionFlow) {
		f.Status.Seek = &subflowv1.SeekStatus{ID: "replay-rest", CompletionTime: &done,
			Positions: []subflowv1.SeekPosition{{Partition: 1, Index: 7100}, {Partition: 2, Index: 90}}}
	})
	refused("seek replay-rest moved every partition: nothing to retry")
}
