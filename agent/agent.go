package agent

import (
	"context"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/subflow-dev/subflow/agent/internal/pulsaradmin"
	"github.com/subflow-dev/subflow/agent/internal/startgate"
	"github.com/subflow-dev/subflow/agent/protocol"
)

// DefaultSyncTimeout bounds the wait of StartGated consumers for the first desired state.
const DefaultSyncTimeout = 30 * time.Second

// DefaultBacklogRefresh is how often a watched subscription's backlog is read again.
const DefaultBacklogRefresh = protocol.DefaultBacklogRefresh

// Options configure an Agent.
type Options struct {
	// Name is how the agent reports itself (usually the pod name).
	Name string
	// AdminURL is the Pulsar admin REST root (http://host:8080), used by SeekByIndex.
	AdminURL string
	// AdminHTTPClient carries TLS settings for admin calls; nil means http.DefaultClient.
	AdminHTTPClient *http.Client
	// AdminAuth adds the application's own credentials to every admin request (for example an
	// Authorization header); seek resolution needs no more than consume-level rights. With
	// Pulsar's default authorization provider, the backlog reports the controller asks for need
	// lookup (produce or consume) permission on the topic, and tenant admin rights for the
	// message TTL and backlog quotas (topic policies): without them the backlog is reported
	// with its retention unknown, naming the refused read.
	AdminAuth func(*http.Request) error
	// AdminRedirectHosts lists the hosts, besides the AdminURL's host and its subdomains, to
	// which admin calls follow a broker's redirect (307 to the topic's owner) with AdminAuth
	// applied again: exact host names or IPs, or "*.example.com" for subdomains. Ports do not
	// matter (as for net/http's own rule): brokers sharing a host on other ports are trusted.
	// A redirect elsewhere, or from https to http, fails the call instead. A broker redirects to
	// the owner's advertised address: with the Helm chart's layout (AdminURL
	// http://pulsar-broker.pulsar.svc.cluster.local:8080, brokers advertising
	// pulsar-broker-N.pulsar-broker.pulsar.svc.cluster.local) no entry is needed; an AdminURL
	// with a short name ("pulsar-broker") or brokers advertising IPs need one.
	AdminRedirectHosts []string
	// Logger receives structured logs; the zero value discards them.
	Logger logr.Logger
	// Registerer receives the agent's metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// StartGated makes consumers start Paused until the controller's first push (through
	// agent/control) or SyncTimeout, after which FallbackState applies until that push. The
	// environment can only make the start stricter: SUBFLOW_START_GATED=true gates, and
	// SUBFLOW_FALLBACK_STATE sets a FallbackState left empty (subflow's webhook sets both for a
	// pod that a flow selects when it is created, so a pod born into a paused flow consumes
	// nothing).
	StartGated bool
	// SyncTimeout bounds the StartGated wait; zero means DefaultSyncTimeout.
	SyncTimeout time.Duration
	// FallbackState applies when SyncTimeout passes unsynced; empty means Running.
	FallbackState protocol.State
	// BacklogRefresh is how often the agent reads again, in the background, a backlog the
	// controller asks it to report (a halted flow's, a backlog pause condition's); zero means
	// DefaultBacklogRefresh.
	BacklogRefresh time.Duration
}

// Agent creates gated consumers and holds the agent-wide start-up gate.
type Agent struct {
	opts    Options
	log     logr.Logger
	metrics *metrics
	admin   *pulsaradmin.Client  // nil without an AdminURL
	backlog *pulsaradmin.Watches // subscriptions whose backlog is read in the background

	mu         sync.Mutex
	consumers  []*Consumer
	hooks      []func(*Consumer)
	startGate  *startgate.Gate // the start-up gate's wish: Paused while unsynced, then Running
	closedOnce sync.Once
}

// New returns an agent. With StartGated it starts the bounded wait for the controller's first
// push at once.
func New(opts Options) (*Agent, error) {
	seamRegistered.Do(registerSeam)
	opts = startFromEnv(opts, os.Getenv)
	if opts.SyncTimeout <= 0 {
		opts.SyncTimeout = DefaultSyncTimeout
	}
	if opts.BacklogRefresh <= 0 {
		opts.BacklogRefresh = DefaultBacklogRefresh
	}
	if opts.FallbackState == "" {
		opts.FallbackState = protocol.Running
	}
	if !opts.FallbackState.Valid() {
		return nil, &invalidStateError{state: opts.FallbackState}
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	a := &Agent{opts: opts, log: opts.Logger, metrics: m}
	if opts.AdminURL != "" {
		a.admin = pulsaradmin.New(opts.AdminURL, opts.AdminHTTPClient, opts.AdminAuth, opts.AdminRedirectHosts)
	}
	a.backlog = pulsaradmin.NewWatches(a.admin, opts.BacklogRefresh)
	a.startGate = startgate.New(opts.StartGated, opts.SyncTimeout, opts.FallbackState, opts.Logger, a.regate)
	return a, nil
}

// startFromEnv applies the webhook's start choice: it may gate an ungated agent and fill an empty
// FallbackState, never loosen what the application chose. An unknown fallback is left to New's
// validation, which names it.
func startFromEnv(opts Options, getenv func(string) string) Options {
	if getenv(protocol.StartGatedEnv) == "true" {
		opts.StartGated = true
	}
	if opts.FallbackState == "" {
		opts.FallbackState = protocol.State(getenv(protocol.FallbackStateEnv))
	}
	return opts
}

// Subscribe creates a gated consumer through client. The options must not carry a
// MessageChannel. The consumer starts in the state the agent's wishes give (Running unless
// StartGated or a hook set otherwise); a Stopped consumer does not subscribe until it runs.
func (a *Agent) Subscribe(client pulsar.Client, opts pulsar.ConsumerOptions) (*Consumer, error) {
	if opts.MessageChannel != nil {
		return nil, ErrMessageChannelOwned
	}
	if opts.ExpireTimeOfIncompleteChunk < 0 {
		return nil, ErrNegativeChunkExpiry
	}
	c := newConsumer(a, client, opts)
	a.mu.Lock()
	hooks := slices.Clone(a.hooks)
	a.mu.Unlock()
	// Hooks run before the first subscribe so that rules already known (a pause in force)
	// apply from the first message on.
	for _, hook := range hooks {
		hook(c)
	}
	// Listed before start so that a concurrent markSynced or sync timeout reaches it.
	a.mu.Lock()
	a.consumers = append(a.consumers, c)
	a.mu.Unlock()
	if err := c.start(); err != nil {
		a.forget(c)
		c.discard()
		return nil, err
	}
	return c, nil
}

// onSubscribe registers fn to run for every consumer subscribed later, before Subscribe
// returns and before its first subscribe, so fn may call setState on it.
func (a *Agent) onSubscribe(fn func(*Consumer)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.hooks = append(a.hooks, fn)
}

// consumersNow returns the consumers subscribed and not closed.
func (a *Agent) consumersNow() []*Consumer {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]*Consumer(nil), a.consumers...)
}

// markSynced lifts the start-up gate: the controller has pushed the desired state. It is a
// no-op when the agent is already synced.
func (a *Agent) markSynced() { a.startGate.MarkSynced() }

// synced reports whether markSynced was called or StartGated is off.
func (a *Agent) synced() bool { return a.startGate.Synced() }

// Close stops the sync timer and the background backlog reads. Consumers are closed by the
// application.
func (a *Agent) Close() {
	a.closedOnce.Do(func() {
		a.startGate.Stop()
		a.backlog.Close()
	})
}

// regate brings every consumer to its state after the start-up gate moved.
func (a *Agent) regate() {
	a.mu.Lock()
	consumers := append([]*Consumer(nil), a.consumers...)
	a.mu.Unlock()
	for _, c := range consumers {
		_ = c.transitions.lock(context.Background())
		if err := c.reconcile(); err != nil {
			c.log.Error(err, "Applying start-up state failed")
		}
		c.transitions.unlock()
	}
}

func (a *Agent) forget(c *Consumer) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, x := range a.consumers {
		if x == c {
			a.consumers = append(a.consumers[:i], a.consumers[i+1:]...)
			return
		}
	}
}
