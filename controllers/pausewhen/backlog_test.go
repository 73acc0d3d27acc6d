package pausewhen

import (
	"strings"
	"testing"
	"time"

	"github.com/subflow-dev/subflow/agent/protocol"
)

func TestBacklogJudgesTheOtherSubscriptionsSum(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	above, resume := 100.0, 10.0
	fast := Backlog{Subscription: "orders-fast", Thresholds: Thresholds{Above: &above, ResumeBelow: &resume}}
	entry := func(topic, sub string, messages int64, age time.Duration) protocol.BacklogStatus {
		return protocol.BacklogStatus{Topic: topic, Subscription: sub, Messages: messages, ReadAt: now.Add(-age)}
	}
	const stale = time.Minute
	tests := []struct {
		name    string
		figures BacklogFigures
		verdict Verdict
		seen    string
		err     string
	}{
		{"summed over partitions, the flow's own left out", BacklogFigures{Pod: "w-0", Entries: []protocol.BacklogStatus{
			entry("t-partition-0", "orders-fast", 60, 0), entry("t-partition-1", "orders-fast", 50, 5*time.Second),
			entry("t-partition-0", "orders-slow", 5000, 0)}}, Unhealthy, "110 messages wait", ""},
		{"between the thresholds", BacklogFigures{Pod: "w-0", Entries: []protocol.BacklogStatus{entry("t", "orders-fast", 50, 0)}}, Between, "50 messages wait", ""},
		{"at the resume threshold", BacklogFigures{Pod: "w-0", Entries: []protocol.BacklogStatus{entry("t", "orders-fast", 10, 0)}}, Healthy, "10 messages wait", ""},
		{"no agent could be asked", BacklogFigures{Missing: "no agent speaks protocol 3"}, Unknown, "", "no agent speaks protocol 3"},
		{"not read yet", BacklogFigures{Pod: "w-0", Entries: []protocol.BacklogStatus{entry("t", "orders-slow", 5, 0)}}, Unknown, "",
			"pod w-0 has not read it yet"},
		{"one partition unreadable is not an empty one", BacklogFigures{Pod: "w-0", Entries: []protocol.BacklogStatus{
			entry("t-partition-0", "orders-fast", 5, 0), {Topic: "t-partition-1", Subscription: "orders-fast", Unknown: "HTTP 403"}}},
			Unknown, "", "could not read t-partition-1: HTTP 403"},
		{"stale figures", BacklogFigures{Pod: "w-0", Entries: []protocol.BacklogStatus{entry("t", "orders-fast", 5, 2*time.Minute)}},
			Unknown, "", "read it 2m0s ago, more than 1m0s"},
		{"figures from a clock ahead are not stale", BacklogFigures{Pod: "w-0", Entries: []protocol.BacklogStatus{entry("t", "orders-fast", 500, -30*time.Second)}},
			Unhealthy, "500 messages wait", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := fast.Judge(tt.figures, stale, now)
			if r.Verdict != tt.verdict || r.Seen != tt.seen {
				t.Fatalf("verdict %v seen %q, want %v %q (err %v)", r.Verdict, r.Seen, tt.verdict, tt.seen, r.Err)
			}
			if (tt.err == "") != (r.Err == nil) || (r.Err != nil && !strings.Contains(r.Err.Error(), tt.err)) {
				t.Fatalf("error %v, want one with %q", r.Err, tt.err)
			}
			if !r.At.Equal(now) {
				t.Fatalf("reading at %s, want %s", r.At, now)
			}
		})
	}
}
