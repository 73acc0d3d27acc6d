package pulsartest

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net/http"
	"net/url"
	"strconv"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// Cluster is several brokers sharing one storage, as Pulsar brokers share
// BookKeeper and the metadata store. Each topic (each partition) is owned by
// one broker at a time; broker 0 is the leader that assigns unowned topics.
type Cluster struct {
	brokers []*Broker
	st      *store
}

// StartCluster starts n brokers for a test and closes them when it ends.
func StartCluster(tb testing.TB, n int, opts ...Options) *Cluster {
	tb.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	c, err := NewCluster(n, o)
	if err != nil {
		tb.Fatalf("start pulsar test cluster: %v", err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// NewCluster starts n brokers with the same options. Each broker answers
// lookups with its own service URL, so Options.AdvertisedURL must be empty.
func NewCluster(n int, opts Options) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("a cluster needs at least one broker, not %d", n)
	}
	if opts.AdvertisedURL != "" {
		return nil, errors.New("AdvertisedURL names one broker; a cluster advertises each broker's own URL")
	}
	opts = opts.withDefaults()
	st := newStore()
	c := &Cluster{st: st}
	for range n {
		b, err := newBroker(opts, st)
		if err != nil {
			_ = c.Close()
			return nil, err
		}
		c.brokers = append(c.brokers, b)
	}
	st.brokers = c.brokers
	for _, b := range c.brokers {
		b.startPeriodicChecks()
	}
	return c, nil
}

// Broker returns broker i (0 is the leader).
func (c *Cluster) Broker(i int) *Broker { return c.brokers[i] }

// Brokers returns every broker, leader first.
func (c *Cluster) Brokers() []*Broker { return c.brokers }

// Close stops every broker.
func (c *Cluster) Close() error {
	var errs []error
	for _, b := range c.brokers {
		errs = append(errs, b.Close())
	}
	return errors.Join(errs...)
}

// Owner returns the index of the broker that owns the topic (a partition
// or a non-partitioned topic) now, or -1 while no broker has acquired it.
func (c *Cluster) Owner(topic string) int {
	full := mustFull(topic)
	c.st.mu.Lock()
	defer c.st.mu.Unlock()
	return c.indexOf(c.st.owner[full])
}

// AssignedBroker returns the index of the broker that the leader gives the
// topic (a partition or a non-partitioned topic) when it is next looked up.
func (c *Cluster) AssignedBroker(topic string) int {
	full := mustFull(topic)
	c.st.mu.Lock()
	defer c.st.mu.Unlock()
	return c.st.assignedIndex(full)
}

func (c *Cluster) indexOf(b *Broker) int {
	for i, x := range c.brokers {
		if x == b {
			return i
		}
	}
	return -1
}

// MoveTopic assigns the topic (every partition of a partitioned one) to
// broker `to` and unloads it, as `pulsar-admin topics unload` with a
// destination broker does: ownership is released, producers and consumers
// are closed, clients look the topic up again and reach the new owner. A
// topic that does not exist yet is only assigned.
func (c *Cluster) MoveTopic(topic string, to int) error {
	if to < 0 || to >= len(c.brokers) {
		return fmt.Errorf("no broker %d in a cluster of %d", to, len(c.brokers))
	}
	tn, err := parseTopic(topic)
	if err != nil {
		return err
	}
	names := []string{tn.full}
	if n := c.brokers[0].partitionsOf(tn.full); n > 0 {
		names = names[:0]
		for i := range n {
			names = append(names, partitionName(tn.full, i))
		}
	}
	c.st.mu.Lock()
	for _, name := range names {
		c.st.assigned[name] = to
	}
	c.st.mu.Unlock()
	for _, name := range names {
		c.brokers[0].unload(name)
	}
	return nil
}

// RunExpiryCheck runs every broker's message expiry check.
func (c *Cluster) RunExpiryCheck() {
	for _, b := range c.brokers {
		b.RunExpiryCheck()
	}
}

// CheckBacklogQuotas runs every broker's backlog quota check.
func (c *Cluster) CheckBacklogQuotas() {
	for _, b := range c.brokers {
		b.CheckBacklogQuotas()
	}
}

// assignedIndex is the load manager's decision for an unowned topic: the
// broker a test chose, else a hash of the name. st.mu is held.
func (st *store) assignedIndex(full string) int {
	if i, ok := st.assigned[full]; ok {
		return i
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(full))
	return int(h.Sum32() % uint32(len(st.brokers)))
}

// unload releases the ownership of one topic (partition) and closes its
// producers and consumers (NamespaceService.unloadNamespaceBundle).
func (b *Broker) unload(full string) {
	b.st.mu.Lock()
	delete(b.st.owner, full)
	t := b.st.topics[full]
	b.st.mu.Unlock()
	if t != nil {
		t.unload()
	}
}

// owns reports whether b serves the topic now; a lone broker serves all.
func (b *Broker) owns(full string) bool {
	b.st.mu.Lock()
	defer b.st.mu.Unlock()
	return len(b.st.brokers) <= 1 || b.st.owner[full] == b
}

func (b *Broker) isLeader() bool {
	b.st.mu.Lock()
	defer b.st.mu.Unlock()
	return len(b.st.brokers) > 0 && b.st.brokers[0] == b
}

// route says where a request for a topic goes.
type route struct {
	serve         bool    // b owns the topic (perhaps acquired just now)
	to            *Broker // otherwise: the owner, or the broker to ask next
	redirect      bool    // to has not acquired the topic: LOOKUP_RESPONSE Redirect rather than Connect
	authoritative bool    // the Redirect's authoritative flag
}

// route is NamespaceService.findBrokerServiceUrl and searchForCandidateBroker
// (modular load manager, which is centralised on the leader):
//   - an owned topic: its owner (LookupResult of type BrokerUrl, so a lookup
//     answers Connect to the owner, authoritative);
//   - unowned and authoritative: "the leader already assigned the current
//     broker as owner": b acquires it;
//   - unowned, not authoritative, b is not the leader: ask the leader,
//     authoritative=false (les.isLeader() of b);
//   - unowned, on the leader: the load manager's candidate; the leader
//     acquires it itself or redirects there with authoritative=true.
func (b *Broker) route(full string, authoritative bool) route {
	st := b.st
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.brokers) <= 1 {
		return route{serve: true}
	}
	if owner := st.owner[full]; owner != nil {
		return route{serve: owner == b, to: owner}
	}
	leader := st.brokers[0]
	switch {
	case authoritative:
	case b != leader:
		return route{to: leader, redirect: true}
	case st.brokers[st.assignedIndex(full)] != b:
		return route{to: st.brokers[st.assignedIndex(full)], redirect: true, authoritative: true}
	}
	st.owner[full] = b
	return route{serve: true}
}

// handleLookup is TopicLookupBase.lookupTopicAsync over the binary protocol.
func (c *conn) handleLookup(req *pb.CommandLookupTopic) {
	resp := &pb.CommandLookupTopicResponse{RequestId: proto.Uint64(req.GetRequestId())}
	tn, err := parseTopic(req.GetTopic())
	if err != nil {
		resp.Response = pb.CommandLookupTopicResponse_Failed.Enum()
		resp.Error = pb.ServerError_InvalidTopicName.Enum()
		resp.Message = proto.String(err.Error())
		c.send(&pb.BaseCommand{Type: pb.BaseCommand_LOOKUP_RESPONSE.Enum(), LookupTopicResponse: resp})
		return
	}
	r := c.b.route(tn.full, req.GetAuthoritative())
	resp.Response = pb.CommandLookupTopicResponse_Connect.Enum()
	resp.BrokerServiceUrl = proto.String(c.b.advertisedURL())
	resp.Authoritative = proto.Bool(true)
	resp.ProxyThroughServiceUrl = proto.Bool(false)
	if !r.serve {
		resp.BrokerServiceUrl = proto.String(r.to.advertisedURL())
		if r.redirect {
			resp.Response = pb.CommandLookupTopicResponse_Redirect.Enum()
			resp.Authoritative = proto.Bool(r.authoritative)
		}
	}
	c.send(&pb.BaseCommand{Type: pb.BaseCommand_LOOKUP_RESPONSE.Enum(), LookupTopicResponse: resp})
}

// notServedError is BrokerService.checkTopicNsOwnership's
// ServiceUnitNotReadyException, which the client gets as ServiceNotReady.
func (b *Broker) notServedError(tn topicName) string {
	return fmt.Sprintf("Namespace bundle for topic (%s) not served by this instance:%s. Please redo the lookup. Request is denied: namespace=%s/%s",
		tn.full, b.binary.Addr(), tn.tenant, tn.namespace)
}

// ownedTopic wraps an admin handler for one topic with
// PulsarWebResource.validateTopicOwnershipAsync: a broker that does not own
// the topic answers 307 Temporary Redirect to the owner's (or the next
// broker's) admin URL, same path and query with authoritative replaced by
// whether this broker is the leader. A partitioned topic's base name has no
// owner; its handlers act on the partitions.
func (b *Broker) ownedTopic(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		full := fullFromPath(r)
		if b.partitionsOf(full) == 0 {
			authoritative, _ := strconv.ParseBool(r.URL.Query().Get("authoritative"))
			if rt := b.route(full, authoritative); !rt.serve {
				http.Redirect(w, r, b.redirectURL(r, rt.to), http.StatusTemporaryRedirect)
				return
			}
		}
		h(w, r)
	}
}

func (b *Broker) redirectURL(r *http.Request, to *Broker) string {
	q := r.URL.Query()
	q.Set("authoritative", strconv.FormatBool(b.isLeader()))
	u := url.URL{Scheme: "http", Host: to.adminAddr, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: q.Encode()}
	return u.String()
}
