package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/protocol"
	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// failingAdmin is a reverse proxy in front of a broker's admin API that answers 500 to every
// cursor reset of the topics whose path contains failTopic (while failing is set), as a broker
// that loses a partition's owner mid-seek would.
type failingAdmin struct {
	*httptest.Server
	failing atomic.Bool
	refused atomic.Int32
}

func newFailingAdmin(t *testing.T, adminURL, failTopic string) *failingAdmin {
	t.Helper()
	target, err := url.Parse(adminURL)
	if err != nil {
		t.Fatal(err)
	}
	f := &failingAdmin{}
	f.failing.Store(true)
	forward := httputil.NewSingleHostReverseProxy(target)
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f.failing.Load() && r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/resetcursor") &&
			strings.Contains(r.URL.Path, failTopic) {
			f.refused.Add(1)
			http.Error(w, `{"reason":"the partition's owner went away"}`, http.StatusInternalServerError)
			return
		}
		forward.ServeHTTP(w, r)
	}))
	t.Cleanup(f.Close)
	return f
}

// A partitioned seek whose reset fails on one partition reports the truth: the partitions
// that moved with their positions, the one that did not with its error. Each partition is then
// delivered from its own cursor - moved ones from the target, the failed one from where it
// was, losing nothing it held - and a retry of the failed partition alone completes the seek
// without replaying the others a second time.
func TestIntegrationPartitionedSeekFailingHalfWay(t *testing.T) {
	e := newEnv(t, pulsartest.Options{EntriesPerLedger: entriesPerLedger})
	topic := uniqueTopic(t)
	e.createPartitioned(t, topic, 3)
	admin := newFailingAdmin(t, e.adminURL, sanitizePath(topic)+"-partition-1/")
	a := newTestAgent(t, Options{Name: "partial", AdminURL: admin.URL})
	c := e.subscribeThrough(t, a, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "sub"})
	// Partition p holds payloads 1000p + index, in batches of 5; all consumed and acked.
	part := func(p int) string { return fmt.Sprintf("%s-partition-%d", topic, p) }
	for p := range 3 {
		e.produce(t, part(p), 1000*p, 30, 5)
	}
	testkit.ReceiveAndAck(t, c, 90, receiveLimit)
	poll.Eventually(t, "acks", func() bool { st, ok := e.stats(t, topic, "sub", true); return ok && st.MsgBacklog == 0 })
	// Paused with messages 30..34 of each partition in flight to the gate.
	c.Pause()
	for p := range 3 {
		e.produce(t, part(p), 1000*p+30, 5, 1)
	}

	res, err := c.SeekPartitionsByIndex(context.Background(),
		[]protocol.PartitionIndex{{Partition: 0, Index: 12}, {Partition: 1, Index: 20}, {Partition: 2, Index: 25}})
	if !errors.Is(err, ErrSeekPartial) {
		t.Fatalf("seek error %v, want ErrSeekPartial", err)
	}
	if res == nil || len(res.Positions) != 2 || res.Positions[0].Partition != 0 || res.Positions[0].Index != 12 ||
		res.Positions[1].Partition != 2 || res.Positions[1].Index != 25 {
		t.Fatalf("moved positions %+v, want partitions 0 at 12 and 2 at 25", res)
	}
	if len(res.Failed) != 1 || res.Failed[0].Partition != 1 || res.Failed[0].Index != 20 ||
		!strings.Contains(res.Failed[0].Error, "500") {
		t.Fatalf("failed partitions %+v, want partition 1 (index 20) with the broker's 500", res.Failed)
	}
	if st := c.Status(); st.State != protocol.Paused {
		t.Fatalf("state after the partial seek: %+v", st)
	}

	col := collect(t, c)
	c.Resume()
	// Partition 0 from 12, partition 2 from 25, partition 1 from where it was: 30..34 only.
	want := slices.Concat(seqRange(12, 35), seqRange(1030, 1035), seqRange(2025, 2035))
	awaitExactly(t, e, col, topic, want)

	admin.failing.Store(false)
	res, err = c.SeekPartitionsByIndex(context.Background(), []protocol.PartitionIndex{{Partition: 1, Index: 20}})
	if err != nil || len(res.Positions) != 1 || res.Positions[0].Partition != 1 || len(res.Failed) != 0 {
		t.Fatalf("retry of partition 1: %+v, %v", res, err)
	}
	// The retry replays partition 1 from 20 and nothing of partitions 0 and 2 again.
	awaitExactly(t, e, col, topic, slices.Concat(want, seqRange(1020, 1035)))
}

// awaitExactly waits until the application has received exactly want (in any order) and the
// subscription has nothing left to deliver, so that nothing more can arrive.
func awaitExactly(t *testing.T, e *env, col *collector, topic string, want []int) {
	t.Helper()
	want = slices.Sorted(slices.Values(want))
	poll.Eventually(t, fmt.Sprintf("the application to receive %d messages and acknowledge them", len(want)), func() bool {
		st, ok := e.stats(t, topic, "sub", true)
		return col.count() >= len(want) && ok && st.MsgBacklog == 0
	})
	if got := slices.Sorted(slices.Values(col.seqsCopy())); !slices.Equal(got, want) {
		t.Fatalf("the application received %v, want %v", got, want)
	}
}

// sanitizePath is the topic's name as the admin API's path spells it.
func sanitizePath(topic string) string {
	return strings.TrimPrefix(strings.Replace(topic, "://", "/", 1), "persistent/")
}
