package control

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// watchHost records the backlog watches the server keeps; the rest of Host is not used.
type watchHost struct {
	Host
	mu      sync.Mutex
	watched []watchKey
}

func (h *watchHost) WatchBacklog(topic, subscription string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if k := (watchKey{topic, subscription}); !slices.Contains(h.watched, k) {
		h.watched = append(h.watched, k)
	}
}

func (h *watchHost) StopWatchingBacklog(topic, subscription string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.watched = slices.DeleteFunc(h.watched, func(k watchKey) bool { return k == watchKey{topic, subscription} })
}

func (h *watchHost) LatestBacklog(topic, _ string) []protocol.BacklogStatus {
	return []protocol.BacklogStatus{{Topic: topic}}
}

func (h *watchHost) has(keys ...watchKey) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	sorted := slices.Clone(h.watched)
	slices.SortFunc(sorted, compareKeys)
	keys = slices.Clone(keys)
	slices.SortFunc(keys, compareKeys)
	return slices.Equal(sorted, keys)
}

func compareKeys(a, b watchKey) int {
	return cmp.Or(strings.Compare(a.topic, b.topic), strings.Compare(a.subscription, b.subscription))
}

// A watch of another subscription lasts while some rule names it: two rules share one, and
// it stops when the last of them drops it.
func TestBacklogOfWatchesLastWhileARuleNeedsThem(t *testing.T) {
	h := &watchHost{}
	w := newBacklogWatches(h)
	a := newRule("ns", "a", protocol.FlowRequest{Subscription: "sub", Topic: "t", ReportBacklog: true, BacklogOf: []string{"hi"}})
	b := newRule("ns", "b", protocol.FlowRequest{Subscription: "low", Topic: "t", BacklogOf: []string{"hi"}})
	w.set(a.key, backlogKeys(a, nil))
	w.set(b.key, backlogKeys(b, nil))
	if !h.has(watchKey{"t", "sub"}, watchKey{"t", "hi"}) {
		t.Fatalf("watched %v, want sub and hi on t", h.watched)
	}
	a.BacklogOf = nil
	w.set(a.key, backlogKeys(a, nil))
	if !h.has(watchKey{"t", "sub"}, watchKey{"t", "hi"}) {
		t.Fatalf("watched %v after a dropped hi: b still needs it", h.watched)
	}
	w.set(b.key, nil)
	if !h.has(watchKey{"t", "sub"}) {
		t.Fatalf("watched %v after b was released, want sub only", h.watched)
	}
	if got := w.latest(backlogKeys(a, nil)); len(got) != 1 || got[0].Subscription != "sub" {
		t.Fatalf("latest %+v, want one entry naming sub", got)
	}
}

type topicsConsumer struct {
	Consumer
	opts pulsar.ConsumerOptions
}

func (c topicsConsumer) Options() pulsar.ConsumerOptions { return c.opts }

// A rule's report covers its topics times its own subscription and each other one, at most
// 1 + protocol.MaxBacklogOf per topic; its own subscription named again is read once.
func TestBacklogKeysAreTopicsTimesSubscriptions(t *testing.T) {
	others := []string{"sub"}
	for i := range protocol.MaxBacklogOf - 1 {
		others = append(others, fmt.Sprint("s", i))
	}
	r := newRule("ns", "a", protocol.FlowRequest{Subscription: "sub", ReportBacklog: true, BacklogOf: others})
	consumers := []Consumer{
		topicsConsumer{opts: pulsar.ConsumerOptions{Topic: "t1"}},
		topicsConsumer{opts: pulsar.ConsumerOptions{Topics: []string{"t1", "t2", "t3"}}},
		topicsConsumer{opts: pulsar.ConsumerOptions{TopicsPattern: "t.*"}},
	}
	keys := backlogKeys(r, consumers)
	if len(keys) != 3*protocol.MaxBacklogOf || keys[0] != (watchKey{"t1", "sub"}) || keys[3] != (watchKey{"t1", "s0"}) {
		t.Fatalf("keys %v, want t1..t3 for sub and s0..s6", keys)
	}
	r.ReportBacklog, r.BacklogOf = false, nil
	if keys := backlogKeys(r, consumers); keys != nil {
		t.Fatalf("a rule asking for no backlog watches %v", keys)
	}
}
