package controllers

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

func TestBacklogRisk(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	oldest := now.Add(-50 * time.Minute)
	ttl := int64(3600)
	evict := func(typ string, bytes, seconds int64) protocol.BacklogQuota {
		return protocol.BacklogQuota{Type: typ, LimitBytes: bytes, LimitSeconds: seconds, Policy: "consumer_backlog_eviction"}
	}
	entry := func(mutate func(*protocol.BacklogStatus)) []protocol.BacklogStatus {
		b := protocol.BacklogStatus{Topic: "t", Messages: 10, Bytes: 1000, OldestPublishTime: &oldest, ReadAt: now}
		mutate(&b)
		return []protocol.BacklogStatus{b}
	}
	tests := []struct {
		name      string
		entries   []protocol.BacklogStatus
		state     subflowv1.FlowState
		want      metav1.ConditionStatus
		deletion  time.Time
		inMessage string
	}{
		{"TTL due within the lead time", entry(func(b *protocol.BacklogStatus) { b.MessageTTLSeconds = &ttl }),
			subflowv1.StatePaused, metav1.ConditionTrue, oldest.Add(time.Hour), "messageTTL 3600s"},
		{"TTL due in 29 s says so", entry(func(b *protocol.BacklogStatus) {
			minute, justBefore := int64(60), now.Add(-31*time.Second)
			b.MessageTTLSeconds, b.OldestPublishTime = &minute, &justBefore
		}), subflowv1.StatePaused, metav1.ConditionTrue, now.Add(29 * time.Second), "(in 29s)"},
		{"TTL due within the hour, to the minute", entry(func(b *protocol.BacklogStatus) { b.MessageTTLSeconds = &ttl }),
			subflowv1.StatePaused, metav1.ConditionTrue, oldest.Add(time.Hour), "(in 10m0s)"},
		{"TTL beyond the lead time", entry(func(b *protocol.BacklogStatus) { t := int64(86400); b.MessageTTLSeconds = &t }),
			subflowv1.StatePaused, metav1.ConditionFalse, oldest.Add(24 * time.Hour), "No retention"},
		{"running flows drain", entry(func(b *protocol.BacklogStatus) { b.MessageTTLSeconds = &ttl }),
			subflowv1.StateRunning, metav1.ConditionFalse, oldest.Add(time.Hour), "drain"},
		{"age quota evicts from 90% of its limit", entry(func(b *protocol.BacklogStatus) {
			b.Quotas = []protocol.BacklogQuota{evict("message_age", 0, 36000)}
		}), subflowv1.StatePaused, metav1.ConditionFalse, oldest.Add(9 * time.Hour), "No retention"},
		{"a hold quota deletes nothing", entry(func(b *protocol.BacklogStatus) {
			b.Quotas = []protocol.BacklogQuota{{Type: "message_age", LimitSeconds: 60, Policy: "producer_request_hold"}}
		}), subflowv1.StatePaused, metav1.ConditionFalse, time.Time{}, "No retention"},
		{"size quota nearly full", entry(func(b *protocol.BacklogStatus) {
			b.Quotas = []protocol.BacklogQuota{evict("destination_storage", 1100, 0)}
		}), subflowv1.StatePaused, metav1.ConditionTrue, time.Time{}, "1000 of the 1100 bytes"},
		{"size quota exceeded deletes now", entry(func(b *protocol.BacklogStatus) {
			b.Quotas = []protocol.BacklogQuota{evict("destination_storage", 900, 0)}
		}), subflowv1.StatePaused, metav1.ConditionTrue, now, "destination_storage"},
		{"retention unreadable", entry(func(b *protocol.BacklogStatus) { b.RetentionUnknown = "HTTP 403" }),
			subflowv1.StatePaused, metav1.ConditionUnknown, time.Time{}, "HTTP 403"},
		{"nothing readable", []protocol.BacklogStatus{{Topic: "t", Unknown: "unreachable"}},
			subflowv1.StatePaused, metav1.ConditionUnknown, time.Time{}, "unreachable"},
		{"an empty backlog is safe", entry(func(b *protocol.BacklogStatus) {
			b.Messages, b.Bytes, b.OldestPublishTime, b.MessageTTLSeconds = 0, 0, nil, &ttl
		}), subflowv1.StatePaused, metav1.ConditionFalse, time.Time{}, "No retention"},
		{"another subscription's figures are not the flow's", append(entry(func(b *protocol.BacklogStatus) {
			b.Subscription = "ingest"
		}), protocol.BacklogStatus{Topic: "t", Subscription: "orders-fast", Messages: 10, Bytes: 1000, OldestPublishTime: &oldest,
			ReadAt: now, Quotas: []protocol.BacklogQuota{evict("destination_storage", 900, 0)}}),
			subflowv1.StatePaused, metav1.ConditionFalse, time.Time{}, "No retention"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var st subflowv1.SubscriptionFlowStatus
			setBacklogCondition(&st, assessBacklog("pod-0", "ingest", tt.entries, now, time.Hour), tt.state, time.Hour)
			c := findCondition(&st, subflowv1.ConditionBacklogAtRisk)
			if c == nil || c.Status != tt.want || !strings.Contains(c.Message, tt.inMessage) {
				t.Fatalf("condition %+v, want %s with %q", c, tt.want, tt.inMessage)
			}
			got := time.Time{}
			if st.Backlog.DeletionTime != nil {
				got = st.Backlog.DeletionTime.Time
			}
			if !got.Equal(tt.deletion) {
				t.Fatalf("deletion %s, want %s", got, tt.deletion)
			}
		})
	}
}

// The pod asked for another subscription's backlog is one whose agent said it speaks protocol 3:
// an older agent would refuse the whole request, its state included.
func TestBacklogWatcherAsksOnlyAgentsThatCanRead(t *testing.T) {
	pod := func(name, ip string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.PodStatus{PodIP: ip}}
	}
	flow := &subflowv1.SubscriptionFlow{ObjectMeta: metav1.ObjectMeta{UID: "3f1c"}, Spec: subflowv1.SubscriptionFlowSpec{
		Subscription: "orders-slow", PauseWhen: []subflowv1.PauseCondition{
			{Name: "a", Backlog: &subflowv1.BacklogSource{Subscription: "orders-fast", Above: 1}},
			{Name: "b", Backlog: &subflowv1.BacklogSource{Subscription: "orders-fast", Above: 9}},
			{Name: "c", Backlog: &subflowv1.BacklogSource{Subscription: "audit", Above: 9}}}}}
	if got := backlogSubscriptions(flow); !slices.Equal(got, []string{"orders-fast", "audit"}) {
		t.Fatalf("subscriptions %v, want each once in spec order", got)
	}
	pods := []*corev1.Pod{pod("w-0", "10.0.0.1"), pod("w-1", "10.0.0.2"), pod("w-2", "")}
	agents := func(versions ...int32) []subflowv1.AgentStatus {
		var out []subflowv1.AgentStatus
		for i, v := range versions {
			out = append(out, subflowv1.AgentStatus{Pod: pods[i].Name, ProtocolVersion: v})
		}
		return out
	}
	tests := []struct {
		name    string
		agents  []subflowv1.AgentStatus
		want    string
		missing string
	}{
		{"no agent answered yet", nil, "", "waiting for an agent"},
		{"only older agents", agents(1, 2), "", "no agent of the flow's pods speaks protocol 3 or later"},
		{"the one that can", agents(2, 3), "w-1", ""},
		{"a pod without an IP is not asked", agents(1, 2, 3), "", "speaks protocol 3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := flow.DeepCopy()
			f.Status.Agents = tt.agents
			got, missing := backlogWatcher(f, pods)
			if got != tt.want || !strings.Contains(missing, tt.missing) || (tt.missing == "") != (missing == "") {
				t.Fatalf("watcher %q (%q), want %q (%q)", got, missing, tt.want, tt.missing)
			}
			if req := (protocol.FlowRequest{BacklogOf: backlogSubscriptions(f)}); !slices.Equal(requiredFeatures(req), []string{"backlogOf"}) {
				t.Fatalf("a request with backlogOf requires %v, want backlogOf", requiredFeatures(req))
			}
		})
	}
	f := flow.DeepCopy()
	f.Spec.PauseWhen = nil
	if got, missing := backlogWatcher(f, pods); got != "" || missing != "" {
		t.Fatalf("a flow without backlog conditions asks %q (%q)", got, missing)
	}
	if features := requiredFeatures(protocol.FlowRequest{}); features != nil {
		t.Fatalf("a request without backlogOf requires %v", features)
	}
}
