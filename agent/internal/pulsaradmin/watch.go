package pulsaradmin

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// Watches read subscriptions' backlogs in the background and keep the latest values, so that a
// push answers at once, whatever the admin API's latency.
type Watches struct {
	client  *Client
	refresh time.Duration

	mu      sync.Mutex
	watches map[backlogKey]*backlogWatch
	closed  bool
}

// NewWatches returns watches that read through client (nil: every read is unknown, without an
// admin URL) every refresh; zero means protocol.DefaultBacklogRefresh.
func NewWatches(client *Client, refresh time.Duration) *Watches {
	if refresh <= 0 {
		refresh = protocol.DefaultBacklogRefresh
	}
	return &Watches{client: client, refresh: refresh}
}

// backlogKey names a watched subscription on a topic.
type backlogKey struct{ topic, subscription string }

// backlogWatch reads one subscription's backlog in the background and keeps the latest values.
type backlogWatch struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	latest []protocol.BacklogStatus
}

// Watch starts reading the subscription's backlog on the topic (see Client.Backlog) now and
// then every refresh, in the background, until Stop or Close. Watching what is already watched
// changes nothing, and so does a watch after Close. Latest returns the values read.
func (ws *Watches) Watch(topic, subscription string) {
	key := backlogKey{topic, subscription}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.watches == nil {
		ws.watches = map[backlogKey]*backlogWatch{}
	}
	if _, ok := ws.watches[key]; ok || ws.closed {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &backlogWatch{cancel: cancel, done: make(chan struct{})}
	ws.watches[key] = w
	go ws.refreshBacklog(ctx, w, key)
}

// Stop stops the background reads of the subscription's backlog on the topic and forgets its
// values; it returns once no read is running.
func (ws *Watches) Stop(topic, subscription string) {
	key := backlogKey{topic, subscription}
	ws.mu.Lock()
	w := ws.watches[key]
	delete(ws.watches, key)
	ws.mu.Unlock()
	if w != nil {
		w.stop()
	}
}

// Latest returns the values last read for a watched subscription, without waiting: nil when
// it is not watched or its first read has not finished yet.
func (ws *Watches) Latest(topic, subscription string) []protocol.BacklogStatus {
	ws.mu.Lock()
	w := ws.watches[backlogKey{topic, subscription}]
	ws.mu.Unlock()
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return cloneBacklog(w.latest)
}

// Close ends every background read, and returns once none runs; later watches do nothing.
func (ws *Watches) Close() {
	ws.mu.Lock()
	watches := ws.watches
	ws.watches, ws.closed = nil, true
	ws.mu.Unlock()
	for _, w := range watches {
		w.stop()
	}
}

func (ws *Watches) refreshBacklog(ctx context.Context, w *backlogWatch, key backlogKey) {
	defer close(w.done)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		readCtx, cancel := context.WithTimeout(ctx, backlogReadTimeout)
		got := ws.client.Backlog(readCtx, key.topic, key.subscription)
		cancel()
		if ctx.Err() != nil {
			return // stopped mid-read: the values may be cut short
		}
		w.mu.Lock()
		w.latest = got
		w.mu.Unlock()
		timer.Reset(ws.refresh)
	}
}

func (w *backlogWatch) stop() {
	w.cancel()
	<-w.done
}

// cloneBacklog copies statuses deeply, so that callers cannot change the cache.
func cloneBacklog(in []protocol.BacklogStatus) []protocol.BacklogStatus {
	if in == nil {
		return nil
	}
	out := slices.Clone(in)
	for i := range out {
		out[i].Quotas = slices.Clone(out[i].Quotas)
		if p := out[i].OldestPublishTime; p != nil {
			t := *p
			out[i].OldestPublishTime = &t
		}
		if p := out[i].MessageTTLSeconds; p != nil {
			v := *p
			out[i].MessageTTLSeconds = &v
		}
	}
	return out
}
