package control

import (
	"slices"
	"sync"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// backlogWatches keeps the agent's backlog watches in line with the rules that ask for a
// backlog report (FlowRequest.ReportBacklog): a (topic, subscription) is watched while some rule
// needs it. A push answers with the latest values at once and never waits on the admin API.
type backlogWatches struct {
	host Host

	mu     sync.Mutex
	byRule map[string][]watchKey // rule key -> what it needs watched
}

type watchKey struct{ topic, subscription string }

func newBacklogWatches(h Host) *backlogWatches {
	return &backlogWatches{host: h, byRule: map[string][]watchKey{}}
}

// set records what a rule needs watched (nil: nothing), starting and stopping watches.
func (w *backlogWatches) set(rule string, keys []watchKey) {
	w.mu.Lock()
	defer w.mu.Unlock()
	old := w.byRule[rule]
	if len(keys) == 0 {
		delete(w.byRule, rule)
	} else {
		w.byRule[rule] = keys
	}
	for _, k := range keys {
		w.host.WatchBacklog(k.topic, k.subscription) // a no-op when already watched
	}
	for _, k := range old {
		if !slices.Contains(keys, k) && !w.neededLocked(k) {
			w.host.StopWatchingBacklog(k.topic, k.subscription)
		}
	}
}

func (w *backlogWatches) neededLocked(k watchKey) bool {
	for _, keys := range w.byRule {
		if slices.Contains(keys, k) {
			return true
		}
	}
	return false
}

// latest returns the last values read for keys; empty until the first reads complete.
func (w *backlogWatches) latest(keys []watchKey) []protocol.BacklogStatus {
	var out []protocol.BacklogStatus
	for _, k := range keys {
		out = append(out, w.host.LatestBacklog(k.topic, k.subscription)...)
	}
	return out
}

// backlogKeys are the topics whose backlog a rule's report covers: the rule's topic, else every
// topic its consumers name (a pattern consumer's topics cannot be listed and are left out).
func backlogKeys(r *rule, consumers []Consumer) []watchKey {
	if r.Topic != "" {
		return []watchKey{{topic: r.Topic, subscription: r.Subscription}}
	}
	var keys []watchKey
	add := func(topic string) {
		k := watchKey{topic: topic, subscription: r.Subscription}
		if topic != "" && !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	for _, c := range consumers {
		opts := c.Options()
		add(opts.Topic)
		for _, t := range opts.Topics {
			add(t)
		}
	}
	return keys
}
