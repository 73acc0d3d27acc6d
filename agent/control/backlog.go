package control

import (
	"slices"
	"sync"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// backlogWatches keeps the agent's backlog watches in line with the rules that ask for a
// backlog report (FlowRequest.ReportBacklog: their own subscription) or for other subscriptions'
// backlogs (FlowRequest.BacklogOf): a (topic, subscription) is watched while some rule needs
// it. A push answers with the latest values at once and never waits on the admin API.
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

// latest returns the last values read for keys, each entry naming its subscription; empty
// until the first reads complete.
func (w *backlogWatches) latest(keys []watchKey) []protocol.BacklogStatus {
	var out []protocol.BacklogStatus
	for _, k := range keys {
		for _, b := range w.host.LatestBacklog(k.topic, k.subscription) {
			b.Subscription = k.subscription // a Host of another make may leave it out
			out = append(out, b)
		}
	}
	return out
}

// backlogKeys are what a rule's report covers: on each of its topics, its own subscription
// when it asks for a backlog report (ReportBacklog), and every subscription of BacklogOf.
// There are at most len(ruleTopics) x (1 + protocol.MaxBacklogOf) of them.
func backlogKeys(r *rule, consumers []Consumer) []watchKey {
	subscriptions := r.BacklogOf
	if r.ReportBacklog {
		subscriptions = append([]string{r.Subscription}, r.BacklogOf...)
	}
	if len(subscriptions) == 0 {
		return nil
	}
	topics := ruleTopics(r, consumers)
	var keys []watchKey
	for _, s := range subscriptions {
		for _, topic := range topics {
			if k := (watchKey{topic: topic, subscription: s}); !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		}
	}
	return keys
}

// ruleTopics are the topics a rule's backlog report covers: the rule's topic, else every topic
// its consumers name (a pattern consumer's topics cannot be listed and are left out).
func ruleTopics(r *rule, consumers []Consumer) []string {
	if r.Topic != "" {
		return []string{r.Topic}
	}
	var topics []string
	add := func(topic string) {
		if topic != "" && !slices.Contains(topics, topic) {
			topics = append(topics, topic)
		}
	}
	for _, c := range consumers {
		opts := c.Options()
		add(opts.Topic)
		for _, t := range opts.Topics {
			add(t)
		}
	}
	return topics
}
