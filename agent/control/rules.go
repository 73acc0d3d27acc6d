package control

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/subflow-dev/subflow/agent"
	"github.com/subflow-dev/subflow/agent/protocol"
)

// rule is one SubscriptionFlow as the controller last pushed it.
type rule struct {
	key string // namespace/name
	protocol.FlowRequest
}

func newRule(namespace, name string, req protocol.FlowRequest) *rule {
	return &rule{key: namespace + "/" + name, FlowRequest: req}
}

// matches reports whether the rule applies to consumer c.
func (r *rule) matches(c *agent.Consumer) bool {
	if c.Subscription() != r.Subscription {
		return false
	}
	return r.Topic == "" || consumesTopic(c.Options(), r.Topic)
}

// errStale is returned when a push carries a revision lower than the one applied.
type errStale struct{ requested, applied int64 }

func (e *errStale) Error() string {
	return fmt.Sprintf("revision %d is older than the applied revision %d", e.requested, e.applied)
}

// rules holds every flow rule of the agent and turns them into consumer states.
type rules struct {
	agent *agent.Agent

	mu         sync.Mutex
	byKey      map[string]*rule
	bySub      map[string]map[string]*rule    // subscription -> key -> rule: a rule only matches its subscription
	generation int64                          // grows with every state computation, for agent.Consumer.SetState
	seeks      map[string]protocol.SeekStatus // by flow UID + "/" + seek id: each id runs once
}

func newRules(a *agent.Agent) *rules {
	rs := &rules{agent: a, byKey: map[string]*rule{}, bySub: map[string]map[string]*rule{}, seeks: map[string]protocol.SeekStatus{}}
	// A consumer created later (a new subscription, a restarted app component) gets the state
	// the rules already in force give it, before its first subscribe.
	a.OnSubscribe(func(c *agent.Consumer) {
		state, gen := rs.desired(c)
		_ = c.SetState(context.Background(), state, gen)
	})
	return rs
}

// put stores r unless a newer revision of the same flow is in force.
func (rs *rules) put(r *rule) error {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	old, ok := rs.byKey[r.key]
	if ok && old.UID == r.UID && r.Revision < old.Revision {
		return &errStale{requested: r.Revision, applied: old.Revision}
	}
	if ok {
		rs.unindexLocked(old)
	}
	rs.byKey[r.key] = r
	if rs.bySub[r.Subscription] == nil {
		rs.bySub[r.Subscription] = map[string]*rule{}
	}
	rs.bySub[r.Subscription][r.key] = r
	return nil
}

func (rs *rules) unindexLocked(r *rule) {
	delete(rs.byKey, r.key)
	delete(rs.bySub[r.Subscription], r.key)
	if len(rs.bySub[r.Subscription]) == 0 {
		delete(rs.bySub, r.Subscription)
	}
}

// remove deletes the rule of a flow; uid guards against deleting a recreated flow's rule.
func (rs *rules) remove(key, uid string) (bool, error) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	old, ok := rs.byKey[key]
	if !ok {
		return false, nil
	}
	if uid != "" && old.UID != uid {
		return true, fmt.Errorf("the rule for %s belongs to flow uid %s, not %s", key, old.UID, uid)
	}
	rs.unindexLocked(old)
	return true, nil
}

// desired computes the most restrictive state of every rule matching c, with a fresh generation.
func (rs *rules) desired(c *agent.Consumer) (protocol.State, int64) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	state := protocol.Running
	for _, r := range rs.bySub[c.Subscription()] {
		if r.matches(c) {
			state = protocol.MostRestrictive(state, r.State)
		}
	}
	rs.generation++
	return state, rs.generation
}

// applyAll brings every consumer to the state the rules give it. A stale generation means a
// newer computation already applied, which is fine.
func (rs *rules) applyAll(ctx context.Context) error {
	var errs []error
	for _, c := range rs.agent.Consumers() {
		state, gen := rs.desired(c)
		err := c.SetState(ctx, state, gen)
		var stale *agent.StaleGenerationError
		if err != nil && !errors.As(err, &stale) && !errors.Is(err, agent.ErrConsumerClosed) {
			errs = append(errs, fmt.Errorf("consumer %s on %s: %w", c.Name(), c.Topic(), err))
		}
	}
	return errors.Join(errs...)
}

// matched returns the consumers r applies to, in a stable order.
func (rs *rules) matched(r *rule) []*agent.Consumer {
	var out []*agent.Consumer
	for _, c := range rs.agent.Consumers() {
		if r.matches(c) {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
	return out
}

// conflicts names the other flows matching r's consumers with a different state.
func (rs *rules) conflicts(r *rule, consumers []*agent.Consumer) string {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var names []string
	for _, other := range rs.bySub[r.Subscription] {
		if other.key == r.key || other.State == r.State {
			continue
		}
		for _, c := range consumers {
			if other.matches(c) {
				names = append(names, fmt.Sprintf("%s (%s)", other.key, other.State))
				break
			}
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		return ""
	}
	return "also matched by " + strings.Join(names, ", ") + "; the most restrictive state applies"
}

// seek runs r's seek once per id: the executor moves the cursors, the other agents drop the
// messages they hold from before it.
func (rs *rules) seek(ctx context.Context, r *rule, consumers []*agent.Consumer) *protocol.SeekStatus {
	if r.Seek == nil {
		return nil
	}
	key := r.UID + "/" + r.Seek.ID
	rs.mu.Lock()
	done, ok := rs.seeks[key]
	rs.mu.Unlock()
	if ok && (done.State != protocol.SeekObserved || !r.Seek.Execute) {
		return &done
	}
	status := protocol.SeekStatus{ID: r.Seek.ID, State: protocol.SeekObserved}
	if r.Seek.Execute {
		status = executeSeek(ctx, r.Seek, consumers)
	} else {
		for _, c := range consumers {
			c.DropHeld(time.Now())
		}
	}
	rs.mu.Lock()
	rs.seeks[key] = status
	rs.mu.Unlock()
	return &status
}

func executeSeek(ctx context.Context, seek *protocol.SeekRequest, consumers []*agent.Consumer) protocol.SeekStatus {
	status := protocol.SeekStatus{ID: seek.ID}
	if len(consumers) == 0 {
		status.State, status.Reason = protocol.SeekFailed, "NoConsumer"
		status.Error = "no consumer in this pod matches the flow's subscription and topic"
		return status
	}
	targets := seek.Partitions
	if seek.Index != nil {
		targets = []protocol.PartitionIndex{{Partition: -1, Index: *seek.Index}}
	}
	result, err := consumers[0].SeekPartitionsByIndex(ctx, targets)
	if err != nil {
		status.State, status.Reason, status.Error = protocol.SeekFailed, "SeekFailed", err.Error()
		if errors.Is(err, agent.ErrIndexMetadataDisabled) {
			status.Reason = "IndexMetadataDisabled"
		}
		return status
	}
	status.State, status.Positions = protocol.SeekSucceeded, result.Positions
	return status
}

// summary lists every rule, for GET /state.
func (rs *rules) summary() []protocol.FlowSummary {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	out := make([]protocol.FlowSummary, 0, len(rs.byKey))
	for _, r := range rs.byKey {
		namespace, name, _ := strings.Cut(r.key, "/")
		out = append(out, protocol.FlowSummary{Namespace: namespace, Name: name, UID: r.UID,
			AppliedRevision: r.Revision, State: r.State})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Namespace+out[i].Name < out[j].Namespace+out[j].Name })
	return out
}
