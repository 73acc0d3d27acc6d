package sidecar

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/go-logr/logr"

	"github.com/subflow-dev/subflow/agent"
	"github.com/subflow-dev/subflow/agent/control"
	"github.com/subflow-dev/subflow/agent/internal/pulsaradmin"
	"github.com/subflow-dev/subflow/agent/protocol"
)

// AdminOptions say how a sidecar reaches the Pulsar admin API, through which it reads
// backlogs and executes seeks with the pod's credentials (as agent.Options' Admin fields do for
// an agent).
type AdminOptions struct {
	// URL is the admin REST root, http(s)://host:port; empty means no admin access: backlogs
	// are unknown and seeks fail with agent.ErrNoAdminURL.
	URL string
	// HTTPClient carries TLS settings for admin calls; nil means http.DefaultClient.
	HTTPClient *http.Client
	// Auth adds the pod's credentials to every admin request.
	Auth func(*http.Request) error
	// BacklogRefresh is how often a watched subscription's backlog is read again; zero means
	// agent.DefaultBacklogRefresh.
	BacklogRefresh time.Duration
	// Logger receives the seeks' outcomes.
	Logger logr.Logger
}

// Admin is a sidecar's access to the admin API: the backlog reads the controller asks for,
// kept fresh in the background until Close, and the seeks.
type Admin struct {
	client  *pulsaradmin.Client // nil without a URL
	backlog *pulsaradmin.Watches
	log     logr.Logger
}

// NewAdmin returns the admin access opts describe.
func NewAdmin(opts AdminOptions) *Admin {
	a := &Admin{log: opts.Logger}
	if opts.URL != "" {
		a.client = pulsaradmin.New(opts.URL, opts.HTTPClient, opts.Auth, nil)
	}
	a.backlog = pulsaradmin.NewWatches(a.client, opts.BacklogRefresh)
	return a
}

// Close stops the background backlog reads; it returns once none runs.
func (a *Admin) Close() { a.backlog.Close() }

// resetByIndex resets the subscription's cursors on topic (pulsaradmin.Client.ResetByIndex) and
// logs the outcome.
func (a *Admin) resetByIndex(ctx context.Context, topic, subscription string, targets []protocol.PartitionIndex, beforeReset func([]protocol.SeekPosition)) (*agent.SeekResult, error) {
	res, err := a.client.ResetByIndex(ctx, topic, subscription, targets, beforeReset)
	log := a.log.WithValues("topic", topic, "subscription", subscription)
	if err != nil {
		log.Error(err, "Seek by index failed")
	} else {
		log.Info("Seek by index completed", "positions", res.Positions, "probes", res.Probes)
	}
	return res, err
}

// ControlHost is the sidecar as the control server drives it (control.NewForHost), so the
// controller pushes to a sidecar pod exactly as to an agent pod. admin makes the admin calls
// (backlog reads, seeks) with the pod's credentials.
func (s *Sidecar) ControlHost(admin *Admin) control.Host {
	return &controlHost{Sidecar: s, admin: admin}
}

var _ control.Consumer = seekingConsumer{}

type controlHost struct {
	*Sidecar
	admin *Admin
}

func (*controlHost) Kind() string { return protocol.KindSidecar }

func (h *controlHost) Consumers() []control.Consumer {
	consumers := h.Sidecar.Consumers()
	out := make([]control.Consumer, len(consumers))
	for i, c := range consumers {
		out[i] = seekingConsumer{c, h.admin}
	}
	return out
}

func (h *controlHost) OnSubscribe(fn func(control.Consumer)) {
	h.Sidecar.OnSubscribe(func(c *Consumer) { fn(seekingConsumer{c, h.admin}) })
}

// seekingConsumer executes a seek for a sidecar consumer with the admin API alone.
type seekingConsumer struct {
	*Consumer
	admin *Admin
}

// SeekPartitionsByIndex resets the subscription's cursors on the consumer's topic (all of a
// partitioned topic, whichever partition this consumer reads) through the admin API
// (pulsaradmin.Client.ResetByIndex). The broker then closes the subscription's consumers; the
// sidecar passes the close on to each client, which drops its receiver queue and subscribes
// again, in the state the rules give it, and is delivered from the new cursor.
func (c seekingConsumer) SeekPartitionsByIndex(ctx context.Context, targets []protocol.PartitionIndex) (*agent.SeekResult, error) {
	topic := baseTopic(c.topic)
	return c.admin.resetByIndex(ctx, topic, c.subscription, targets, func(positions []protocol.SeekPosition) {
		// Before the cursors move: the broker delivers the target's entry again as soon as a
		// client subscribes again, which may be before this seek returns.
		for _, other := range c.conn.s.Consumers() {
			if other.subscription == c.subscription && baseTopic(other.topic) == topic {
				_ = other.FilterSeekTargets(positions)
			}
		}
	})
}

// MarkSynced lifts the sidecar's start-up gate (Options.StartGated).
func (h *controlHost) MarkSynced() { h.Sidecar.MarkSynced() }

func (h *controlHost) WatchBacklog(topic, subscription string) {
	h.admin.backlog.Watch(topic, subscription)
}

func (h *controlHost) StopWatchingBacklog(topic, subscription string) {
	h.admin.backlog.Stop(topic, subscription)
}

func (h *controlHost) LatestBacklog(topic, subscription string) []protocol.BacklogStatus {
	return h.admin.backlog.Latest(topic, subscription)
}

// Options describe what the consumer reads, for matching flows by topic: the sidecar sees
// each partition subscribe on its own, so it is the partition's topic.
func (c *Consumer) Options() pulsar.ConsumerOptions {
	return pulsar.ConsumerOptions{Topic: c.topic, SubscriptionName: c.subscription, Name: c.name}
}

// DropHeldOf drops what DropHeld drops when the consumer's partition is one of partitions
// (nil: any). A non-partitioned topic is partition -1.
func (c *Consumer) DropHeldOf(before time.Time, partitions []int32) int {
	if partitions != nil && !slices.Contains(partitions, partitionOf(c.topic)) {
		return 0
	}
	return c.DropHeld(before)
}

// FilterSeekTargets makes the consumer cut, from the batch entry of its partition's target,
// the messages before the target whenever the broker delivers that entry (seekCut); a target
// that begins its entry ends an earlier seek's cut. Positions of other partitions are ignored.
func (c *Consumer) FilterSeekTargets(positions []protocol.SeekPosition) error {
	partition := partitionOf(c.topic)
	for _, p := range positions {
		if p.Partition != partition {
			continue
		}
		cut, ok := seekCutOf(p)
		c.mu.Lock()
		switch {
		case !ok:
			c.cut, c.cutSize = nil, 0
		case c.cut == nil || *c.cut != cut: // the same cut again (the executor's own) keeps what it saw
			c.cut, c.cutSize = &cut, 0
		}
		c.mu.Unlock()
		if ok {
			c.conn.cutting.Store(true)
		}
	}
	return nil
}

// baseTopic is the partitioned topic a partition belongs to, or the topic itself.
func baseTopic(topic string) string {
	if partitionOf(topic) < 0 {
		return topic
	}
	return topic[:strings.LastIndex(topic, "-partition-")]
}

func partitionOf(topic string) int32 {
	i := strings.LastIndex(topic, "-partition-")
	if i < 0 {
		return -1
	}
	n, err := strconv.ParseInt(topic[i+len("-partition-"):], 10, 32)
	if err != nil {
		return -1
	}
	return int32(n)
}
