package control

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/subflow-dev/subflow/agent"
	"github.com/subflow-dev/subflow/agent/protocol"
)

// retiredPerAgent bounds the memory of replaced flow UIDs.
const retiredPerAgent = 1024

// tombstonesPerAgent bounds the memory of released rules (one per namespace/name).
const tombstonesPerAgent = 1024

// backgroundApplyTimeout bounds a re-apply that a push could not finish in time.
const backgroundApplyTimeout = 2 * time.Minute

// rule is one SubscriptionFlow as the controller last pushed it.
type rule struct {
	key string // namespace/name
	protocol.FlowRequest
}

func newRule(namespace, name string, req protocol.FlowRequest) *rule {
	return &rule{key: namespace + "/" + name, FlowRequest: req}
}

// matches reports whether the rule applies to consumer c.
func (r *rule) matches(c Consumer) bool {
	if c.Subscription() != r.Subscription {
		return false
	}
	return r.Topic == "" || consumesTopic(c.Options(), r.Topic)
}

// errStale is returned when a push carries a revision lower than the one applied, or than
// the one released.
type errStale struct {
	requested, applied int64
	released           bool
}

func (e *errStale) Error() string {
	if e.released {
		return fmt.Sprintf("revision %d is older than revision %d, which was released", e.requested, e.applied)
	}
	return fmt.Sprintf("revision %d is older than the applied revision %d", e.requested, e.applied)
}

// errStaleUID is returned when a push names a flow UID that a newer flow of the same
// namespace/name replaced.
type errStaleUID struct{ key, uid string }

func (e *errStaleUID) Error() string {
	return fmt.Sprintf("flow uid %s of %s was replaced by a newer flow with the same name", e.uid, e.key)
}

// errTooManyFlows is returned when a push of a new flow finds the agent holding maxFlows rules.
type errTooManyFlows struct{ key string }

func (e *errTooManyFlows) Error() string {
	return fmt.Sprintf("this agent holds as many flow rules as it may; %s is not one of them: release a flow first", e.key)
}

// rules holds every flow rule of the agent and turns them into consumer states.
//
// UIDs: a push with another UID than the rule held for its namespace/name replaces that rule
// at any revision (the flow was deleted and created again, and starts over), and the replaced
// UID is retired: later pushes naming it are refused, so a late retry from the deleted flow
// cannot come back. A DELETE retires nothing: a pod relabelled away and back gets the same
// flow again.
//
// Tombstones: a DELETE leaves the released rule's UID and revision behind, so that an older
// revision of it arriving late (a retry, a previous leader's push) is refused as it would be
// while the rule was held, instead of restoring it; the same revision is accepted (the pod was
// relabelled away and back). A push of another UID retires the tombstone's UID, as it would
// the rule's. Tombstones are bounded, oldest release forgotten first: a forgotten one fences
// nothing, as before tombstones.
type rules struct {
	host        Host
	log         logr.Logger
	seekTimeout time.Duration
	maxFlows    int

	mu         sync.Mutex
	byKey      map[string]*rule
	bySub      map[string]map[string]*rule // subscription -> key -> rule: a rule only matches its subscription
	generation int64                       // grows with every state computation, for Consumer.SetState
	retired    map[retiredUID]bool
	retiredFIF []retiredUID // oldest first, at most retiredPerAgent
	tombstones map[string]tombstone
	tombOrder  []string // tombstones' keys, oldest release first, at most tombstonesPerAgent
	seeks      *seekBook
	applying   bool // a background re-apply runs
	applyAgain bool // and must run once more
}

type retiredUID struct{ key, uid string }

// tombstone is what a DELETE leaves of a rule.
type tombstone struct {
	uid      string
	revision int64
}

func newRules(h Host, log logr.Logger, seekTimeout time.Duration, maxFlows int) *rules {
	rs := &rules{host: h, log: log, seekTimeout: seekTimeout, maxFlows: maxFlows, byKey: map[string]*rule{},
		bySub: map[string]map[string]*rule{}, retired: map[retiredUID]bool{}, tombstones: map[string]tombstone{},
		seeks: newSeekBook()}
	// A consumer created later (a new subscription, a restarted app component) gets the state
	// the rules already in force give it, before its first subscribe.
	h.OnSubscribe(func(c Consumer) {
		state, gen := rs.desired(c)
		_ = c.SetState(context.Background(), state, gen)
	})
	return rs
}

// put stores r unless a newer revision of the same flow is in force or was released, its UID
// was replaced, or r is a new flow and the agent holds maxFlows rules.
func (rs *rules) put(r *rule) error {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.retired[retiredUID{r.key, r.UID}] {
		return &errStaleUID{key: r.key, uid: r.UID}
	}
	old, held := rs.byKey[r.key]
	if !held {
		old = rs.releasedLocked(r.key)
	}
	if old != nil && old.UID == r.UID && r.Revision < old.Revision {
		return &errStale{requested: r.Revision, applied: old.Revision, released: !held}
	}
	if !held && len(rs.byKey) >= rs.maxFlows {
		return &errTooManyFlows{key: r.key}
	}
	if held {
		rs.unindexLocked(old)
	}
	if old != nil && old.UID != r.UID {
		rs.retireLocked(retiredUID{old.key, old.UID})
	}
	rs.byKey[r.key] = r
	if rs.bySub[r.Subscription] == nil {
		rs.bySub[r.Subscription] = map[string]*rule{}
	}
	rs.bySub[r.Subscription][r.key] = r
	rs.pruneSeeksLocked()
	return nil
}

// releasedLocked returns what the tombstone of key fences, as a rule, or nil.
func (rs *rules) releasedLocked(key string) *rule {
	t, ok := rs.tombstones[key]
	if !ok {
		return nil
	}
	return &rule{key: key, FlowRequest: protocol.FlowRequest{UID: t.uid, Revision: t.revision}}
}

// buryLocked leaves the tombstone of a released rule, the latest release of a key last in line.
func (rs *rules) buryLocked(r *rule) {
	if _, ok := rs.tombstones[r.key]; ok {
		rs.tombOrder = slices.DeleteFunc(rs.tombOrder, func(k string) bool { return k == r.key })
	}
	rs.tombstones[r.key] = tombstone{uid: r.UID, revision: r.Revision}
	rs.tombOrder = append(rs.tombOrder, r.key)
	if len(rs.tombOrder) > tombstonesPerAgent {
		delete(rs.tombstones, rs.tombOrder[0])
		rs.tombOrder = rs.tombOrder[1:]
	}
}

func (rs *rules) retireLocked(id retiredUID) {
	rs.retired[id] = true
	rs.retiredFIF = append(rs.retiredFIF, id)
	if len(rs.retiredFIF) > retiredPerAgent {
		delete(rs.retired, rs.retiredFIF[0])
		rs.retiredFIF = rs.retiredFIF[1:]
	}
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
	if old.UID != uid {
		return true, fmt.Errorf("the rule for %s belongs to flow uid %s, not %s", key, old.UID, uid)
	}
	rs.unindexLocked(old)
	rs.buryLocked(old)
	rs.pruneSeeksLocked()
	return true, nil
}

// pruneSeeksLocked keeps the seek records the rules in force name, plus a bounded history.
func (rs *rules) pruneSeeksLocked() {
	live := make(map[seekKey]bool, len(rs.byKey))
	for _, r := range rs.byKey {
		if r.Seek != nil {
			live[seekKey{uid: r.UID, id: r.Seek.ID}] = true
		}
	}
	rs.seeks.prune(live)
}

// desired computes the most restrictive state of every rule matching c, with a fresh generation.
func (rs *rules) desired(c Consumer) (protocol.State, int64) {
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
	for _, c := range rs.host.Consumers() {
		state, gen := rs.desired(c)
		err := c.SetState(ctx, state, gen)
		var stale *agent.StaleGenerationError
		if err != nil && !errors.As(err, &stale) && !errors.Is(err, agent.ErrConsumerClosed) {
			errs = append(errs, fmt.Errorf("consumer %s on %s: %w", c.Name(), c.Topic(), err))
		}
	}
	return errors.Join(errs...)
}

// applyInBackground re-applies the rules without a caller waiting: after a push that gave up
// waiting for a busy consumer (a seek holds it), and after a seek. At most one runs; a request
// while it runs makes it run once more, so the newest rules always end up applied.
func (rs *rules) applyInBackground() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.applying {
		rs.applyAgain = true
		return
	}
	rs.applying = true
	go func() {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), backgroundApplyTimeout)
			if err := rs.applyAll(ctx); err != nil {
				rs.log.Error(err, "Applying flow rules in the background failed")
			}
			cancel()
			rs.mu.Lock()
			again := rs.applyAgain
			rs.applying, rs.applyAgain = again, false
			rs.mu.Unlock()
			if !again {
				return
			}
		}
	}()
}

// matched returns the consumers r applies to, in a stable order.
func (rs *rules) matched(r *rule) []Consumer {
	var out []Consumer
	for _, c := range rs.host.Consumers() {
		if r.matches(c) {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
	return out
}

// conflicts names the other flows matching r's consumers with a different state.
func (rs *rules) conflicts(r *rule, consumers []Consumer) string {
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

// heldBy returns the other rules matching r's consumers with a more restrictive state than
// r's, which therefore decide those consumers' state; at most protocol.MaxHeldBy, by key.
func (rs *rules) heldBy(r *rule, consumers []Consumer) []protocol.RuleRef {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var out []protocol.RuleRef
	for _, other := range rs.bySub[r.Subscription] {
		if other.key == r.key || protocol.MostRestrictive(r.State, other.State) == r.State {
			continue
		}
		if slices.ContainsFunc(consumers, other.matches) {
			namespace, name, _ := strings.Cut(other.key, "/")
			out = append(out, protocol.RuleRef{Namespace: namespace, Name: name, UID: other.UID, State: other.State})
		}
	}
	slices.SortFunc(out, func(a, b protocol.RuleRef) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	if len(out) > protocol.MaxHeldBy {
		out = out[:protocol.MaxHeldBy]
	}
	return out
}

// takeSeek handles the seek part of r (see seekBook.take): it drops at once what a finished
// seek made stale, so that a push which also resumes delivers none of it, and tells what
// startSeek does once the state is applied.
func (rs *rules) takeSeek(r *rule, consumers []Consumer) *seekAction {
	if r.Seek == nil {
		return nil
	}
	rs.mu.Lock()
	action := rs.seeks.take(r.UID, r.Seek, len(consumers), time.Now())
	rs.mu.Unlock()
	action.drop.apply(consumers)
	return &action
}

// startSeek starts the seek takeSeek decided to run, and reports the seek. It never waits for
// the seek: an executor's seek runs in the background under its own deadline, holding no
// lock of ours, so pushes keep applying states meanwhile.
func (rs *rules) startSeek(r *rule, action *seekAction, consumers []Consumer) *protocol.SeekStatus {
	if action == nil {
		return nil
	}
	if action.run != nil {
		go rs.runSeek(action.run, *r.Seek, consumers)
	}
	return &action.status
}

// runSeek executes a seek with the first matched consumer. The pod's other matched consumers
// drop what they held from before it of the partitions it moved; then the rules are applied again, as
// pushes that came meanwhile may have given up waiting for the seeking consumer.
func (rs *rules) runSeek(rec *seekRecord, req protocol.SeekRequest, consumers []Consumer) {
	ctx, cancel := context.WithTimeout(context.Background(), rs.seekTimeout)
	status := executeSeek(ctx, &req, consumers[0])
	cancel()
	rs.mu.Lock()
	drop := rs.seeks.finish(rec, status)
	rs.pruneSeeksLocked()
	rs.mu.Unlock()
	drop.apply(consumers[1:])
	rs.applyInBackground()
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

// seekCount is the number of seek records held (bounded; for tests).
func (rs *rules) seekCount() int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return len(rs.seeks.records)
}
