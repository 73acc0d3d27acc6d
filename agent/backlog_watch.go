package agent

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// backlogKey names a watched subscription on a topic.
type backlogKey struct{ topic, subscription string }

// backlogWatch reads one subscription's backlog in the background and keeps the latest values,
// so that a push answers at once, whatever the admin API's latency.
type backlogWatch struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	latest []protocol.BacklogStatus
}

// WatchBacklog starts reading the subscription's backlog on the topic (see Backlog) now and
// then every Options.BacklogRefresh, in the background, until StopWatchingBacklog or Close.
// Watching what is already watched changes nothing. LatestBacklog returns the values read.
func (a *Agent) WatchBacklog(topic, subscription string) {
	key := backlogKey{topic, subscription}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.watches == nil {
		a.watches = map[backlogKey]*backlogWatch{}
	}
	if _, ok := a.watches[key]; ok || a.closed {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &backlogWatch{cancel: cancel, done: make(chan struct{})}
	a.watches[key] = w
	go a.refreshBacklog(ctx, w, key)
}

// StopWatchingBacklog stops the background reads of the subscription's backlog on the topic
// and forgets its values; it returns once no read is running.
func (a *Agent) StopWatchingBacklog(topic, subscription string) {
	key := backlogKey{topic, subscription}
	a.mu.Lock()
	w := a.watches[key]
	delete(a.watches, key)
	a.mu.Unlock()
	if w != nil {
		w.stop()
	}
}

// LatestBacklog returns the values last read for a watched subscription, without waiting: nil
// when it is not watched or its first read has not finished yet.
func (a *Agent) LatestBacklog(topic, subscription string) []protocol.BacklogStatus {
	a.mu.Lock()
	w := a.watches[backlogKey{topic, subscription}]
	a.mu.Unlock()
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return cloneBacklog(w.latest)
}

func (a *Agent) refreshBacklog(ctx context.Context, w *backlogWatch, key backlogKey) {
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
		got := a.Backlog(readCtx, key.topic, key.subscription)
		cancel()
		if ctx.Err() != nil {
			return // stopped mid-read: the values may be cut short
		}
		w.mu.Lock()
		w.latest = got
		w.mu.Unlock()
		timer.Reset(a.opts.BacklogRefresh)
	}
}

func (w *backlogWatch) stop() {
	w.cancel()
	<-w.done
}

// stopWatches ends every background backlog read (Close).
func (a *Agent) stopWatches() {
	a.mu.Lock()
	watches := a.watches
	a.watches = nil
	a.mu.Unlock()
	for _, w := range watches {
		w.stop()
	}
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
