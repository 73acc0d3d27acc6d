package pulsartest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
)

// Options change how the broker behaves. The zero value is a current 4.x
// broker with its default configuration, plus index metadata and
// getMessageIdByIndex enabled; each field names the broker setting it models.
type Options struct {
	EntriesPerLedger     int  // ledger rollover; 0 means 10000
	DisableIndexMetadata bool // model a broker without AppendIndexMetadataInterceptor (no broker-entry index, Message.Index() nil; admin getMessageIdByIndex answers 412)
	DisableIndexLookup   bool // model a broker before PIP-415: getMessageIdByIndex answers 404

	// ReadBatchSize is dispatcherMaxReadBatchSize: the most ENTRIES one
	// dispatcher read takes, whatever each batch entry holds; 0 means 100.
	ReadBatchSize int
	// PreciseDispatcherFlowControl is preciseDispatcherFlowControl (default
	// false): reads are sized by messages instead of entries, so a grant of N
	// permits delivers about N messages even when producers batch.
	PreciseDispatcherFlowControl bool
	// KeySharedLookAheadPerConsumer and KeySharedLookAheadPerSubscription are
	// keySharedLookAheadMsgInReplayThresholdPerConsumer (2000) and
	// ...PerSubscription (20000): once the replay queue of a Key_Shared
	// subscription holds min(perConsumer x consumers, perSubscription) entries,
	// normal reads stop for every consumer. 0 means the default; negative
	// disables that limit (both disabled: the unacked-message limits apply).
	KeySharedLookAheadPerConsumer     int
	KeySharedLookAheadPerSubscription int
	// MaxUnackedPerConsumer and MaxUnackedPerSubscription are
	// maxUnackedMessagesPerConsumer (50000) and maxUnackedMessagesPerSubscription
	// (200000): Shared and Key_Shared dispatch stops at the limit and resumes
	// at half of it. 0 means the default; negative means unlimited.
	MaxUnackedPerConsumer     int
	MaxUnackedPerSubscription int
	// Deduplication is brokerDeduplicationEnabled (default false): when on,
	// a resend with a sequence id at or below the producer's last stored one
	// is acknowledged but not stored again.
	Deduplication bool
	// ActiveConsumerFailoverDelay is activeConsumerFailoverDelayTimeMillis:
	// a Failover subscription whose active consumer changes sends
	// ACTIVE_CONSUMER_CHANGE and dispatches again only after it. 0 means the
	// default 1s; negative means no delay.
	ActiveConsumerFailoverDelay time.Duration
	// MaxMessageSize is maxMessageSize (default 5 MiB): CONNECTED announces it, and clients
	// refuse to send a larger message (pulsar-client-go: ErrMessageTooLarge). A frame longer
	// than it plus 10 KiB (MESSAGE_SIZE_FRAME_PADDING) closes the connection unanswered, as
	// the broker's frame decoder does. 0 means the default.
	MaxMessageSize int
	// KeySharedHashRanges is subscriptionKeySharedUseConsistentHashing=false: Key_Shared
	// subscriptions (AUTO_SPLIT mode) split hash ranges between consumers
	// (HashRangeAutoSplitStickyKeyConsumerSelector) instead of placing them on a consistent
	// hashing ring, the 4.x default.
	KeySharedHashRanges bool
	// AdvertisedURL is what lookups answer as the broker service URL (a
	// broker's advertisedAddress); empty means ServiceURL. Point it at a
	// proxy to put the proxy between the client and the broker.
	AdvertisedURL string
	// Clock gives the time for message TTL, backlog quotas and broker
	// timestamps; nil means time.Now. Tests move it to expire messages
	// without sleeping, then call RunExpiryCheck or CheckBacklogQuotas.
	Clock func() time.Time

	// DefaultMessageTTL is ttlDurationDefaultInSeconds (default 0: no TTL),
	// used where neither the topic nor its namespace sets messageTTL.
	DefaultMessageTTL time.Duration
	// DefaultBacklogQuota is backlogQuotaDefaultLimitBytes,
	// backlogQuotaDefaultLimitSecond and backlogQuotaDefaultRetentionPolicy;
	// nil means no limit (-1, -1, producer_request_hold).
	DefaultBacklogQuota *BacklogQuota
	// PreciseTimeBasedBacklogQuotaCheck is preciseTimeBasedBacklogQuotaCheck
	// (default false): a message_age quota then expires messages older than
	// 90% of limitTime instead of skipping whole closed ledgers.
	PreciseTimeBasedBacklogQuotaCheck bool
	// MessageExpiryCheckInterval is messageExpiryCheckIntervalInMinutes (5m)
	// and BacklogQuotaCheckInterval is backlogQuotaCheckIntervalInSeconds
	// (60s): how often the broker runs the checks by itself. 0 means the
	// default; negative means never (tests call the checks explicitly).
	MessageExpiryCheckInterval time.Duration
	BacklogQuotaCheckInterval  time.Duration

	// AdminToken, when set, secures the admin API: a call needs
	// "Authorization: Bearer <token>" (401 otherwise). AdminToken is the
	// application's role, with produce and consume rights; it gets 403 on
	// policies (message TTL, backlog quotas) and partition changes, which
	// need tenant admin rights. AdminSuperToken is a superuser's.
	AdminToken      string
	AdminSuperToken string
}

// withDefaults resolves zero values to the 4.x defaults.
func (o Options) withDefaults() Options {
	if o.EntriesPerLedger <= 0 {
		o.EntriesPerLedger = 10000
	}
	if o.MaxMessageSize <= 0 {
		o.MaxMessageSize = pb.DefaultMaxMessageSize
	}
	if o.ReadBatchSize <= 0 {
		o.ReadBatchSize = 100
	}
	if o.KeySharedLookAheadPerConsumer == 0 {
		o.KeySharedLookAheadPerConsumer = 2000
	}
	if o.KeySharedLookAheadPerSubscription == 0 {
		o.KeySharedLookAheadPerSubscription = 20000
	}
	if o.MaxUnackedPerConsumer == 0 {
		o.MaxUnackedPerConsumer = 50000
	}
	if o.MaxUnackedPerSubscription == 0 {
		o.MaxUnackedPerSubscription = 200000
	}
	if o.ActiveConsumerFailoverDelay == 0 {
		o.ActiveConsumerFailoverDelay = time.Second
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if o.MessageExpiryCheckInterval == 0 {
		o.MessageExpiryCheckInterval = 5 * time.Minute
	}
	if o.BacklogQuotaCheckInterval == 0 {
		o.BacklogQuotaCheckInterval = time.Minute
	}
	return o
}

// Broker is a running test broker.
type Broker struct {
	opts      Options
	st        *store // shared with the other brokers of a cluster
	binary    net.Listener
	admin     *http.Server
	adminAddr string
	latency   atomic.Int64 // nanoseconds added before handling each command

	mu     sync.Mutex // guards conns and closed
	conns  map[*conn]struct{}
	closed bool
	stop   chan struct{} // ends the periodic checks

	// legacyPermitRemoval models the broker before the permit-accounting
	// fix: removing a consumer subtracts all its permits from the dispatcher
	// total, including those whose FLOW update is still pending.
	legacyPermitRemoval bool

	wg sync.WaitGroup
}

// store is what the brokers of a cluster share, as Pulsar brokers share
// BookKeeper and the metadata store: topics with their ledgers and cursors,
// partition metadata, policies, topic ownership and the FLOW record. Its
// mutex is never held while taking a topic's mutex.
type store struct {
	mu          sync.Mutex
	topics      map[string]*topic // by full name; partitions have their own entry
	partitioned map[string]int    // base full name -> partitions
	// partitionProps are the properties a partitioned topic was created with.
	partitionProps map[string]map[string]string
	brokers        []*Broker // the cluster, leader first; a lone broker is a cluster of one
	owner          map[string]*Broker
	assigned       map[string]int // broker index chosen by a test for a topic (partition)
	policies       policies

	nextLedger   atomic.Uint64
	nextConnID   atomic.Uint64
	nextProducer atomic.Uint64

	flowMu sync.Mutex
	flows  []Flow
	// unmodelled counts the commands received that this broker does not model, by type.
	unmodelled map[string]int
}

func newStore() *store {
	st := &store{
		topics:         map[string]*topic{},
		partitioned:    map[string]int{},
		partitionProps: map[string]map[string]string{},
		owner:          map[string]*Broker{},
		assigned:       map[string]int{},
		policies:       newPolicies(),
	}
	st.nextLedger.Store(10) // ledger ids look like BookKeeper's: small, unique, increasing
	return st
}

// Flow is one FLOW command as the broker received it.
type Flow struct {
	Time         time.Time
	Topic        string // full name of the (partition) topic
	Subscription string
	ConsumerName string
	ConsumerID   uint64
	Conn         uint64
	Permits      uint32
}

// Start starts a broker for a test and closes it when the test ends.
func Start(tb testing.TB, opts ...Options) *Broker {
	tb.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	b, err := New(o)
	if err != nil {
		tb.Fatalf("start pulsar test broker: %v", err)
	}
	tb.Cleanup(func() { _ = b.Close() })
	return b
}

// New starts a broker on 127.0.0.1 random ports.
func New(opts Options) (*Broker, error) {
	st := newStore()
	b, err := newBroker(opts.withDefaults(), st)
	if err != nil {
		return nil, err
	}
	st.brokers = []*Broker{b}
	b.startPeriodicChecks()
	return b, nil
}

func newBroker(opts Options, st *store) (*Broker, error) {
	bin, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = bin.Close()
		return nil, err
	}
	b := &Broker{
		opts:      opts,
		st:        st,
		binary:    bin,
		adminAddr: adminLn.Addr().String(),
		conns:     map[*conn]struct{}{},
		stop:      make(chan struct{}),
	}
	b.admin = &http.Server{Handler: b.adminHandler(), ReadHeaderTimeout: 10 * time.Second}
	b.wg.Add(2)
	go func() { defer b.wg.Done(); b.acceptLoop() }()
	go func() { defer b.wg.Done(); _ = b.admin.Serve(adminLn) }()
	return b, nil
}

// ServiceURL is the binary protocol URL for pulsar.ClientOptions.URL.
func (b *Broker) ServiceURL() string { return "pulsar://" + b.binary.Addr().String() }

// advertisedURL is the service URL that lookups answer.
func (b *Broker) advertisedURL() string {
	if b.opts.AdvertisedURL != "" {
		return b.opts.AdvertisedURL
	}
	return b.ServiceURL()
}

func (b *Broker) now() time.Time { return b.opts.Clock() }

// AdminURL is the base URL of the admin REST API.
func (b *Broker) AdminURL() string { return "http://" + b.adminAddr }

// Close stops both listeners and drops every connection.
func (b *Broker) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	close(b.stop)
	b.mu.Unlock()
	err := b.binary.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = errors.Join(err, b.admin.Shutdown(ctx))
	b.DropConnections()
	b.wg.Wait()
	return err
}

func (b *Broker) acceptLoop() {
	for {
		nc, err := b.binary.Accept()
		if err != nil {
			return
		}
		c := b.newConn(nc)
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			_ = nc.Close()
			continue
		}
		b.conns[c] = struct{}{}
		b.mu.Unlock()
		b.wg.Add(2)
		go func() { defer b.wg.Done(); c.writeLoop() }()
		go func() { defer b.wg.Done(); c.readLoop(bufio.NewReaderSize(nc, 64*1024)) }()
	}
}

func (b *Broker) forgetConn(c *conn) {
	b.mu.Lock()
	delete(b.conns, c)
	b.mu.Unlock()
}

// CreatePartitionedTopic declares a partitioned topic; its partitions are
// created on first use like any topic.
func (b *Broker) CreatePartitionedTopic(topic string, partitions int) error {
	tn, err := parseTopic(topic)
	if err != nil {
		return err
	}
	if partitions < 1 || tn.partition >= 0 {
		return fmt.Errorf("cannot partition %q into %d", topic, partitions)
	}
	st := b.st
	st.mu.Lock()
	defer st.mu.Unlock()
	if _, ok := st.partitioned[tn.full]; ok {
		return fmt.Errorf("partitioned topic %q already exists", tn.full)
	}
	if _, ok := st.topics[tn.full]; ok {
		return fmt.Errorf("topic %q already exists as non-partitioned", tn.full)
	}
	st.partitioned[tn.full] = partitions
	return nil
}

// UpdatePartitionedTopic grows a partitioned topic to partitions, as
// `pulsar-admin topics update-partitioned-topic` does; clients find the new partitions when they
// next poll the partition metadata. Pulsar cannot shrink a topic, nor can this.
func (b *Broker) UpdatePartitionedTopic(topic string, partitions int) error {
	tn, err := parseTopic(topic)
	if err != nil {
		return err
	}
	st := b.st
	st.mu.Lock()
	defer st.mu.Unlock()
	old, ok := st.partitioned[tn.full]
	if !ok {
		return fmt.Errorf("partitioned topic %q does not exist", tn.full)
	}
	if partitions <= old {
		return fmt.Errorf("partitioned topic %q has %d partitions: it can only grow", tn.full, old)
	}
	st.partitioned[tn.full] = partitions
	return nil
}

func (b *Broker) partitionsOf(full string) int {
	b.st.mu.Lock()
	defer b.st.mu.Unlock()
	return b.st.partitioned[full]
}

// getTopic returns the topic, creating it unless create is false.
func (b *Broker) getTopic(full string, create bool) *topic {
	st := b.st
	st.mu.Lock()
	defer st.mu.Unlock()
	t := st.topics[full]
	if t == nil && create {
		tn, _ := parseTopic(full)
		t = newTopic(b, tn)
		st.topics[full] = t
	}
	return t
}

// topicsNamed returns the topic itself or, for a partitioned base name, its
// existing partitions.
func (b *Broker) topicsNamed(name string) []*topic {
	full := mustFull(name)
	st := b.st
	st.mu.Lock()
	defer st.mu.Unlock()
	if n, ok := st.partitioned[full]; ok {
		var out []*topic
		for i := 0; i < n; i++ {
			if t := st.topics[partitionName(full, i)]; t != nil {
				out = append(out, t)
			}
		}
		return out
	}
	if t := st.topics[full]; t != nil {
		return []*topic{t}
	}
	return nil
}

func (b *Broker) topicsInNamespace(namespace string) []string {
	prefix := "persistent://" + namespace + "/"
	st := b.st
	st.mu.Lock()
	defer st.mu.Unlock()
	names := map[string]bool{}
	for full := range st.topics {
		if strings.HasPrefix(full, prefix) {
			names[full] = true
		}
	}
	for base, n := range st.partitioned {
		if strings.HasPrefix(base, prefix) {
			for i := 0; i < n; i++ {
				names[partitionName(base, i)] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(names))
}

func (b *Broker) allTopics() []*topic {
	b.st.mu.Lock()
	defer b.st.mu.Unlock()
	out := make([]*topic, 0, len(b.st.topics))
	for _, t := range b.st.topics {
		out = append(out, t)
	}
	return out
}

func (b *Broker) recordFlow(f Flow) {
	b.st.flowMu.Lock()
	b.st.flows = append(b.st.flows, f)
	b.st.flowMu.Unlock()
}

// noteUnmodelled records and logs a command this broker does not model.
func (b *Broker) noteUnmodelled(typ string) {
	b.st.flowMu.Lock()
	if b.st.unmodelled == nil {
		b.st.unmodelled = map[string]int{}
	}
	b.st.unmodelled[typ]++
	first := b.st.unmodelled[typ] == 1
	b.st.flowMu.Unlock()
	if first {
		log.Printf("pulsartest: %s is not modelled: answered with an error", typ)
	}
}

// Unmodelled returns how many commands of each type this broker's cluster received and does
// not model (each was answered at once with an error, when it asked for an answer).
func (b *Broker) Unmodelled() map[string]int {
	b.st.flowMu.Lock()
	defer b.st.flowMu.Unlock()
	return maps.Clone(b.st.unmodelled)
}

// Flows returns every FLOW received from the subscription's consumers, in
// arrival order; a partitioned topic's base name includes all partitions.
func (b *Broker) Flows(topic, subscription string) []Flow {
	full := mustFull(topic)
	b.st.flowMu.Lock()
	defer b.st.flowMu.Unlock()
	var out []Flow
	for _, f := range b.st.flows {
		if f.Subscription != subscription {
			continue
		}
		if f.Topic == full || mustBase(f.Topic) == full {
			out = append(out, f)
		}
	}
	return out
}

func mustBase(full string) string {
	tn, err := parseTopic(full)
	if err != nil {
		return full
	}
	return tn.base()
}

// SetLatency delays the handling of every command received from now on.
func (b *Broker) SetLatency(d time.Duration) { b.latency.Store(int64(d)) }

// DropConnections closes every client connection; clients reconnect.
func (b *Broker) DropConnections() {
	b.mu.Lock()
	conns := make([]*conn, 0, len(b.conns))
	for c := range b.conns {
		conns = append(conns, c)
	}
	b.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
}

// UnloadTopic closes the producers and consumers of a topic (every partition
// of a partitioned one) and releases its ownership, as a broker does when a
// bundle is unloaded; clients look it up again and reconnect.
func (b *Broker) UnloadTopic(topic string) error {
	topics := b.topicsNamed(topic)
	if len(topics) == 0 {
		return fmt.Errorf("topic %q not found", topic)
	}
	for _, t := range topics {
		b.unload(t.name.full)
	}
	return nil
}

// CloseConsumer closes, from the broker side, the consumers with that name on
// the subscription; the client reconnects them.
func (b *Broker) CloseConsumer(topic, subscription, consumerName string) error {
	closed := 0
	for _, t := range b.topicsNamed(topic) {
		closed += t.closeConsumers(subscription, func(c *consumer) bool { return c.name == consumerName })
	}
	if closed == 0 {
		return fmt.Errorf("no consumer %q on %s/%s", consumerName, topic, subscription)
	}
	return nil
}
