package agent

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"

	"github.com/subflow-dev/subflow/agent/internal/pulsaradmin"
	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
)

// The integration tests are a conformance suite: they run unchanged against any broker.
//
// Without environment, each test starts an in-process pulsartest broker. With PULSAR_URL
// (pulsar://host:6650) and PULSAR_ADMIN_URL (http://host:8080), they run against that broker
// (`make conformance`). Either way the client talks to the broker through a wire recorder
// (internal/testing/wirerec), and what a test asserts about FLOW permits and MESSAGE frames comes from
// that record, never from the broker's own bookkeeping; subscription state (backlog, the
// subscription's existence) comes from the admin REST API, as an operator would read it.
// Tests that need something only pulsartest offers (a broker setting chosen per test) skip
// with the reason on a remote broker.

const (
	envPulsarURL      = "PULSAR_URL"
	envPulsarAdminURL = "PULSAR_ADMIN_URL"
)

// remoteBroker returns the broker named by the environment, if any.
func remoteBroker(t testing.TB) (serviceURL, adminURL string, ok bool) {
	t.Helper()
	serviceURL, adminURL = os.Getenv(envPulsarURL), os.Getenv(envPulsarAdminURL)
	switch {
	case serviceURL == "" && adminURL == "":
		return "", "", false
	case serviceURL == "" || adminURL == "":
		t.Fatalf("set both %s and %s to run against a remote broker (got %q and %q)", envPulsarURL, envPulsarAdminURL, serviceURL, adminURL)
	}
	return serviceURL, strings.TrimRight(adminURL, "/"), true
}

// env is a broker behind a wire recorder, a real client connected through the recorder, and an
// agent pointed at the broker's admin API.
type env struct {
	local    *pulsartest.Broker // the in-process broker; nil against a remote broker
	wire     *wirerec.Proxy
	adminURL string
	client   pulsar.Client
	// clientLog counts the frames the client dropped for a consumer it no longer knew.
	clientLog *testkit.ClientLog
	agent     *Agent
}

// newEnv starts the test's broker (or uses the remote one) behind a wire recorder. Options
// other than EntriesPerLedger describe a broker configuration that only the in-process broker
// can take per test; on a remote broker the test skips.
func newEnv(t testing.TB, opts ...pulsartest.Options) *env {
	t.Helper()
	var o pulsartest.Options
	if len(opts) > 0 {
		o = opts[0]
	}
	e := &env{}
	if serviceURL, adminURL, ok := remoteBroker(t); ok {
		if why := remoteMismatch(o, probeRemote(t, serviceURL, adminURL)); why != "" {
			t.Skip(why)
		}
		// A remote broker advertises its own address; rewritten lookups keep the client
		// dialing the recorder, which forwards to the broker each lookup names.
		e.wire = wirerec.StartT(t, serviceURL, wirerec.Options{RewriteLookups: true})
		e.adminURL = adminURL
	} else {
		// The broker advertises the recorder's address, so no byte is changed.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		o.AdvertisedURL = "pulsar://" + ln.Addr().String()
		e.local = pulsartest.Start(t, o)
		e.wire = wirerec.StartT(t, e.local.ServiceURL(), wirerec.Options{Listener: ln})
		e.adminURL = e.local.AdminURL()
	}
	e.clientLog = &testkit.ClientLog{}
	e.client = testkit.Client(t, pulsar.ClientOptions{URL: e.wire.ServiceURL(), Logger: e.clientLog.Logger()})
	e.agent = newTestAgent(t, Options{Name: "test", AdminURL: e.adminURL})
	return e
}

// untilPastClientRace waits for done after the broker closed consumers (a reset). When it does
// not come and the client dropped frames for a consumer it no longer knew (pulsar-client-go's
// handler races, testkit.ClientLog), it reconnects every client, after which the broker sends
// again what the lost handler never saw, and waits again. Nothing may be lost either way;
// without dropped frames the wait fails, since then the client's race is not what held them.
//
// A reconnect does not reach a consumer whose handler the client deleted after its re-subscribe
// registered it: the client's reaction to the broker's CLOSE_CONSUMER notifies the consumer,
// which subscribes again at once, and only then deletes the consumer's handler (v0.21; seen on
// Pulsar 4.2.4 in CI: the consumer subscribed, active and granted permits on the broker, every
// MESSAGE dropped, and no reconnect since the connection no longer knows it). The consumers in
// renew are stopped and run again too, so that they subscribe afresh, as an operator would
// restart a wedged pod; their agent state (a pending seek, say) stays what it was.
func (e *env) untilPastClientRace(t *testing.T, p testkit.Poll, what string, done func() bool, renew ...*Consumer) {
	t.Helper()
	if p.Until(done) {
		return
	}
	dropped := e.clientLog.DroppedFrames()
	if dropped == 0 {
		t.Fatalf("%s: not within %s, and the client dropped no frame for an unknown consumer", what, p.Within)
	}
	t.Logf("%s: not within %s; the client dropped %d frames for a consumer it no longer knew: reconnecting every client, renewing %d consumers",
		what, p.Within, dropped, len(renew))
	e.dropConnections()
	for _, c := range renew {
		c.Stop()
		if err := c.Run(); err != nil {
			t.Fatalf("%s: renewing a consumer: %v", what, err)
		}
	}
	p.Eventually(t, what+" after a reconnect", done)
}

// newDirectEnv connects the client straight to an in-process broker, without a recorder: for
// benchmarks, whose figures must not include the recorder's hop.
func newDirectEnv(t testing.TB) *env {
	t.Helper()
	b := pulsartest.Start(t)
	return &env{local: b, adminURL: b.AdminURL(), client: testkit.Client(t, pulsar.ClientOptions{URL: b.ServiceURL()}),
		agent: newTestAgent(t, Options{Name: "test", AdminURL: b.AdminURL()})}
}

// remoteCaps is what a remote broker's configuration offers.
type remoteCaps struct {
	indexMetadata bool // entries carry a broker index (AppendIndexMetadataInterceptor)
	indexLookup   bool // PIP-415 getMessageIdByIndex (Pulsar 4.1 and later)
}

func (c remoteCaps) String() string {
	return fmt.Sprintf("index metadata %v, PIP-415 %v", c.indexMetadata, c.indexLookup)
}

var (
	remoteCapsOnce sync.Once
	remoteCapsSeen remoteCaps
	remoteCapsErr  error
)

// probeRemote finds out once per test binary what the remote broker offers: it produces one
// message to a topic of its own and reads it back through the admin API.
func probeRemote(t testing.TB, serviceURL, adminURL string) remoteCaps {
	t.Helper()
	remoteCapsOnce.Do(func() { remoteCapsSeen, remoteCapsErr = probeCaps(serviceURL, adminURL) })
	if remoteCapsErr != nil {
		t.Fatalf("probing the broker at %s: %v", serviceURL, remoteCapsErr)
	}
	return remoteCapsSeen
}

func probeCaps(serviceURL, adminURL string) (remoteCaps, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := pulsar.NewClient(pulsar.ClientOptions{URL: serviceURL, Logger: log.DefaultNopLogger()})
	if err != nil {
		return remoteCaps{}, err
	}
	defer client.Close()
	topic := fmt.Sprintf("persistent://public/default/subflow-probe-%s", rand.Text()[:10])
	p, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	if err != nil {
		return remoteCaps{}, err
	}
	defer p.Close()
	id, err := p.Send(ctx, &pulsar.ProducerMessage{Payload: []byte("probe")})
	if err != nil {
		return remoteCaps{}, err
	}
	// What the broker answers for the entry's metadata and for PIP-415, read as an operator would.
	path, err := pulsaradmin.TopicPath(topic)
	if err != nil {
		return remoteCaps{}, err
	}
	status, header, err := probeAdmin(ctx, adminURL+path+fmt.Sprintf("/ledger/%d/entry/%d", id.LedgerID(), id.EntryID()))
	if err != nil {
		return remoteCaps{}, err
	}
	if status/100 != 2 {
		return remoteCaps{}, fmt.Errorf("reading the probe's entry: HTTP %d", status)
	}
	var caps remoteCaps
	caps.indexMetadata = header.Get("X-Pulsar-Broker-Entry-METADATA-index") != ""
	if status, _, err = probeAdmin(ctx, adminURL+path+"/getMessageIdByIndex?index=0"); err != nil {
		return remoteCaps{}, err
	}
	switch {
	case caps.indexMetadata:
		// 404 or 405: no PIP-415 endpoint.
		if status/100 != 2 && status != http.StatusNotFound && status != http.StatusMethodNotAllowed {
			return remoteCaps{}, fmt.Errorf("getMessageIdByIndex: HTTP %d", status)
		}
		caps.indexLookup = status/100 == 2
	default:
		// Without metadata PIP-415 answers 412 and a broker without PIP-415 404.
		caps.indexLookup = status == http.StatusPreconditionFailed
	}
	return caps, nil
}

// probeAdmin GETs url and returns the answer's status and headers.
func probeAdmin(ctx context.Context, url string) (int, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, resp.Header, nil
}

// topicPath is the admin API's path of a topic (pulsaradmin.TopicPath).
func topicPath(topic string) (string, error) { return pulsaradmin.TopicPath(topic) }

// remoteMismatch says why a test cannot run on a remote broker with caps, or "". A test that
// asks for a broker without index metadata or without PIP-415 runs on a broker configured so
// (make conformance-pulsar starts one of each); on a broker without index metadata only those
// tests run. A test's ledger size only makes it stricter and is not needed; any other option
// configures pulsartest itself.
func remoteMismatch(o pulsartest.Options, caps remoteCaps) string {
	switch {
	case !caps.indexMetadata && !o.DisableIndexMetadata:
		return fmt.Sprintf("this broker runs without index metadata (%v): only the tests for such a broker run on it", caps)
	case caps.indexMetadata && o.DisableIndexMetadata:
		return fmt.Sprintf("needs a broker without index metadata; this one has %v", caps)
	case o.DisableIndexMetadata && o.DisableIndexLookup == caps.indexLookup:
		// Without metadata the test is about how the broker answers: with PIP-415 or without.
		return fmt.Sprintf("needs a broker without index metadata and with PIP-415 %v; this one has %v", !o.DisableIndexLookup, caps)
	case o.DisableIndexLookup && caps.indexLookup:
		return fmt.Sprintf("needs a broker without PIP-415 getMessageIdByIndex (before 4.1); this one has %v", caps)
	}
	o.DisableIndexMetadata, o.DisableIndexLookup, o.EntriesPerLedger = false, false, 0
	v := reflect.ValueOf(o)
	var set []string
	for i := range v.NumField() {
		switch f, name := v.Field(i), v.Type().Field(i).Name; {
		case f.IsZero():
		case f.Kind() == reflect.Func:
			set = append(set, name+" (its own clock)")
		default:
			set = append(set, fmt.Sprintf("%s=%v", name, f))
		}
	}
	if len(set) > 0 {
		return fmt.Sprintf("needs a broker configured with %s (in-process pulsartest only)", strings.Join(set, ", "))
	}
	return ""
}

// pulsartest returns the in-process broker, or skips the test on a remote broker: for fault
// injection and settings only the test broker offers.
func (e *env) pulsartest(t testing.TB, why string) *pulsartest.Broker {
	t.Helper()
	if e.local == nil {
		t.Skipf("needs the in-process pulsartest broker: %s", why)
	}
	return e.local
}

func (e *env) subscribe(t testing.TB, opts pulsar.ConsumerOptions) *Consumer {
	t.Helper()
	return e.subscribeThrough(t, e.agent, opts)
}

// subscribeThrough subscribes with the env's client through the given agent.
func (e *env) subscribeThrough(t testing.TB, a *Agent, opts pulsar.ConsumerOptions) *Consumer {
	t.Helper()
	c, err := a.Subscribe(e.client, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// subscribeRaw subscribes with the client alone (no agent).
func (e *env) subscribeRaw(t testing.TB, opts pulsar.ConsumerOptions) pulsar.Consumer {
	t.Helper()
	return testkit.Subscribe(t, e.client, opts)
}

// produce sends messages whose payloads are the numbers from..from+n-1; batch > 1 groups them
// into batch entries of that many messages.
func (e *env) produce(t testing.TB, topic string, from, n, batch int) {
	t.Helper()
	e.produceKeyed(t, topic, from, n, batch, nil)
}

// produceKeyed is produce with a message key chosen per message (nil: no key).
func (e *env) produceKeyed(t testing.TB, topic string, from, n, batch int, key func(i int) string) {
	t.Helper()
	opts := pulsar.ProducerOptions{Topic: topic, DisableBatching: batch <= 1}
	if batch > 1 {
		opts.BatchingMaxMessages = uint(batch)
		opts.BatchingMaxPublishDelay = time.Hour // flushed explicitly
	}
	p, err := e.client.CreateProducer(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var sendErr error
	for i := from; i < from+n; i++ {
		wg.Add(1)
		msg := &pulsar.ProducerMessage{Payload: []byte(strconv.Itoa(i))}
		if key != nil {
			msg.Key = key(i)
		}
		p.SendAsync(context.Background(), msg, func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
			if err != nil {
				mu.Lock()
				sendErr = err
				mu.Unlock()
			}
			wg.Done()
		})
		if batch > 1 && (i-from+1)%batch == 0 {
			if err := p.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if sendErr != nil {
		t.Fatal(sendErr)
	}
}

// --- What the wire recorder saw.

func (e *env) mark() wirerec.Mark { return e.wire.Mark() }

// flows returns the FLOW commands for the subscription recorded after mark.
func (e *env) flows(topic, sub string, since wirerec.Mark) []wirerec.Event {
	return e.wire.Flows(wirerec.Filter{Topic: topic, Subscription: sub, Since: since})
}

// permits sums the FLOW permits for the subscription recorded after mark.
func (e *env) permits(topic, sub string, since wirerec.Mark) int64 {
	return e.wire.Permits(wirerec.Filter{Topic: topic, Subscription: sub, Since: since})
}

// delivered counts the messages the broker sent for the subscription after mark (a batch entry
// counts its messages).
func (e *env) delivered(topic, sub string, since wirerec.Mark) int {
	return e.wire.Delivered(wirerec.Filter{Topic: topic, Subscription: sub, Since: since})
}

// mostDeliveredOnOneConnection is delivered for the connection that was sent the most.
func (e *env) mostDeliveredOnOneConnection(topic, sub string, since wirerec.Mark) int {
	perConn, most := map[uint64]int{}, 0
	for _, m := range e.wire.Messages(wirerec.Filter{Topic: topic, Subscription: sub, Since: since}) {
		perConn[m.Conn] += m.Messages
		most = max(most, perConn[m.Conn])
	}
	return most
}

// barrier returns once every command c queued before the call is in the record.
func (e *env) barrier(t testing.TB, c pulsar.Consumer) {
	t.Helper()
	if err := e.wire.Barrier(c); err != nil {
		t.Fatal(err)
	}
}

// connectionBarrier is barrier for a consumer whose GetLastMessageIDs races with the client's
// own topic discovery (partitioned and regex consumers in pulsar-client-go v0.19): it passes the
// round trip through a probe consumer of the same client, which shares its connection to the
// broker, so that every command queued on that connection before the call is in the record.
func (e *env) connectionBarrier(t testing.TB) {
	t.Helper()
	probe := e.subscribeRaw(t, pulsar.ConsumerOptions{Topic: uniqueTopic(t) + "-probe", SubscriptionName: "probe"})
	e.barrier(t, probe)
}

// dropConnections breaks every client connection at the recorder, as a network failure would;
// the clients reconnect. Works against any broker.
func (e *env) dropConnections() { e.wire.DropConnections() }

// wireSession is one subscription of a consumer on the wire (from a SUBSCRIBE on) with what it was
// granted and sent.
type wireSession struct {
	wirerec.Consumer
	granted, delivered int64
	active             *bool // the last ACTIVE_CONSUMER_CHANGE it got, if any
	ended              bool  // refused, closed (either side), its connection lost, or subscribed again
}

// outstanding is what the broker may still send without a new FLOW: granted minus sent (the
// broker debits per message, so it can go negative with batches).
func (s wireSession) outstanding() int64 { return s.granted - s.delivered }

// sessions returns the subscription's sessions on the wire, in SUBSCRIBE order, with their
// counts.
func (e *env) sessions(topic, sub string) []wireSession {
	f := wirerec.Filter{Topic: topic, Subscription: sub}
	open := map[uint64]bool{}
	for _, c := range e.wire.Connections() {
		open[c.ID] = c.Closed.IsZero()
	}
	var out []wireSession
	index := map[wirerec.Mark]int{}
	latest := map[wirerec.ConsumerKey]wirerec.Mark{}
	for _, c := range e.wire.Consumers(f) {
		index[c.Session] = len(out)
		latest[c.ConsumerKey] = c.Session
		out = append(out, wireSession{Consumer: c, ended: !open[c.Conn]})
	}
	for i := range out {
		if latest[out[i].ConsumerKey] != out[i].Session {
			out[i].ended = true
		}
	}
	// A SUBSCRIBE the broker refused (a real broker may, while it loads a new partition) never
	// started a session; the client tries again as another consumer.
	refused := map[[2]uint64]bool{}
	for _, ev := range e.wire.Events(wirerec.Filter{}, pb.BaseCommand_ERROR) {
		refused[[2]uint64{ev.Conn, ev.RequestID}] = true
	}
	for _, ev := range e.wire.Events(f, pb.BaseCommand_SUBSCRIBE) {
		if i, ok := index[ev.Seq]; ok && refused[[2]uint64{ev.Conn, ev.RequestID}] {
			out[i].ended = true
		}
	}
	for _, ev := range e.wire.Events(f, pb.BaseCommand_FLOW, pb.BaseCommand_MESSAGE, pb.BaseCommand_CLOSE_CONSUMER, pb.BaseCommand_ACTIVE_CONSUMER_CHANGE) {
		i, ok := index[ev.Consumer.Session]
		if !ok {
			continue
		}
		s := &out[i]
		switch ev.Type {
		case pb.BaseCommand_FLOW:
			s.granted += int64(ev.Permits)
		case pb.BaseCommand_MESSAGE:
			s.delivered += int64(ev.Messages)
		case pb.BaseCommand_CLOSE_CONSUMER:
			s.ended = true
		case pb.BaseCommand_ACTIVE_CONSUMER_CHANGE:
			s.active = &ev.Active
		}
	}
	return out
}

// liveSessions returns the sessions still connected.
func (e *env) liveSessions(topic, sub string) []wireSession {
	return slices.DeleteFunc(e.sessions(topic, sub), func(s wireSession) bool { return s.ended })
}

// awaitLiveSessions waits until the subscription has exactly n live sessions; if it does not
// within the deadline, the test fails with the sessions and the subscribes' answers on the wire.
func (e *env) awaitLiveSessions(t testing.TB, topic, sub string, n int, within time.Duration) {
	t.Helper()
	if (testkit.Poll{Within: within, Every: 10 * time.Millisecond}).Until(func() bool { return len(e.liveSessions(topic, sub)) == n }) {
		return
	}
	for _, ev := range e.wire.Events(wirerec.Filter{}, pb.BaseCommand_SUBSCRIBE, pb.BaseCommand_SUCCESS, pb.BaseCommand_ERROR, pb.BaseCommand_CLOSE_CONSUMER) {
		t.Logf("on the wire: %s conn %d request %d consumer %+v", ev.Type, ev.Conn, ev.RequestID, ev.Consumer)
	}
	t.Fatalf("after %v, %s/%s has not %d live sessions: %+v", within, topic, sub, n, e.sessions(topic, sub))
}

// grantSpent reports whether the subscription has exactly `consumers` live sessions and the
// broker has sent each every message its permits allowed.
func (e *env) grantSpent(topic, sub string, consumers int) bool {
	live := e.liveSessions(topic, sub)
	if len(live) != consumers {
		return false
	}
	for _, s := range live {
		if s.granted == 0 || s.outstanding() > 0 {
			return false
		}
	}
	return true
}

// activeConsumer waits until each of the subscription's `consumers` live consumers has been
// told by the broker whether it is the active one (ACTIVE_CONSUMER_CHANGE on the wire, sent
// after a change once activeConsumerFailoverDelayTimeMillis has passed, or at once to a consumer
// that joins without changing the choice), and returns the active one's name. Exclusive and
// Failover only.
func (e *env) activeConsumer(t testing.TB, topic, sub string, consumers int) string {
	t.Helper()
	var name string
	poll.Eventually(t, "the broker's choice of active consumer", func() bool {
		name = ""
		live := e.liveSessions(topic, sub)
		if len(live) != consumers {
			return false
		}
		for _, s := range live {
			switch {
			case s.active == nil:
				return false
			case *s.active && name != "":
				return false
			case *s.active:
				name = s.Name
			}
		}
		return name != ""
	})
	return name
}

// sessionCount counts the SUBSCRIBEs on the wire for the subscription.
func (e *env) sessionCount(topic, sub string) int {
	return len(e.wire.Consumers(wirerec.Filter{Topic: topic, Subscription: sub}))
}

// --- What the broker's admin API says.

// subStats is the part of a subscription's admin stats (TopicStats.subscriptions) the tests
// read; the field names are Pulsar's.
type subStats struct {
	MsgBacklog      int64  `json:"msgBacklog"`
	UnackedMessages int64  `json:"unackedMessages"`
	Type            string `json:"type"`
	Consumers       []struct {
		ConsumerName     string `json:"consumerName"`
		AvailablePermits int64  `json:"availablePermits"`
		UnackedMessages  int64  `json:"unackedMessages"`
	} `json:"consumers"`
}

// stats reads the subscription's stats from the admin API (GET .../stats of a topic or
// partition, or .../partitioned-stats of a partitioned topic); ok is false when the
// subscription does not exist.
func (e *env) stats(t testing.TB, topic, sub string, partitioned bool) (subStats, bool) {
	t.Helper()
	path, err := topicPath(topic)
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "/stats"
	if partitioned {
		endpoint = "/partitioned-stats"
	}
	var ts struct {
		Subscriptions map[string]subStats `json:"subscriptions"`
	}
	e.adminJSON(t, http.MethodGet, path+endpoint, "", &ts)
	st, ok := ts.Subscriptions[sub]
	return st, ok
}

// logWireOnFailure logs, if the test fails, every frame recorded since the mark and the
// topic's subscription stats: what a flake on a loaded machine leaves to read.
func (e *env) logWireOnFailure(t *testing.T, topic string, since wirerec.Mark) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, ev := range e.wire.Events(wirerec.Filter{Since: since}) {
			consumer := ""
			if ev.Consumer != nil {
				consumer = ev.Consumer.Name + "@" + ev.Consumer.Subscription
			}
			t.Logf("wire %s conn %d %s %s %s permits=%d messages=%d id=%+v active=%v error=%q url=%q afterClose=%v",
				ev.Time.Format("15:04:05.000"), ev.Conn, ev.Dir, ev.Type, consumer, ev.Permits, ev.Messages, ev.MessageID,
				ev.Active, ev.Error, ev.URL, ev.AfterClose)
		}
		if path, err := topicPath(topic); err == nil {
			var st json.RawMessage
			e.adminJSON(t, http.MethodGet, path+"/stats", "", &st)
			t.Logf("stats of %s: %s", topic, st)
		}
	})
}

// backlog is the subscription's backlog from the admin API; acks that reached the broker take
// it down.
func (e *env) backlog(t testing.TB, topic, sub string) int64 {
	t.Helper()
	st, ok := e.stats(t, topic, sub, false)
	if !ok {
		t.Fatalf("subscription %s of %s not found", sub, topic)
	}
	return st.MsgBacklog
}

// createPartitioned creates a partitioned topic through the admin API.
func (e *env) createPartitioned(t testing.TB, topic string, partitions int) {
	t.Helper()
	path, err := topicPath(topic)
	if err != nil {
		t.Fatal(err)
	}
	e.adminJSON(t, http.MethodPut, path+"/partitions", strconv.Itoa(partitions), nil)
}

// updatePartitions grows a partitioned topic through the admin API (POST .../partitions), as an
// operator would, on any broker.
func (e *env) updatePartitions(t testing.TB, topic string, partitions int) {
	t.Helper()
	path, err := topicPath(topic)
	if err != nil {
		t.Fatal(err)
	}
	switch status := e.admin(t, http.MethodPost, path+"/partitions", strconv.Itoa(partitions), nil); {
	case status == http.StatusMethodNotAllowed:
		t.Skip("the broker does not update partitioned topics through the admin API (POST .../partitions answered 405)")
	case status/100 != 2:
		t.Fatalf("update %s to %d partitions: HTTP %d", topic, partitions, status)
	}
}

// adminJSON calls the admin API and fails the test unless it answers 2xx (testkit.AdminOK).
func (e *env) adminJSON(t testing.TB, method, path, body string, out any) {
	t.Helper()
	testkit.AdminOK(t, e.adminURL, method, path, body, out)
}

// admin calls the admin API and returns the status (testkit.Admin).
func (e *env) admin(t testing.TB, method, path, body string, out any) int {
	t.Helper()
	return testkit.Admin(t, e.adminURL, method, path, body, out)
}

func seqOfMessage(t testing.TB, m pulsar.Message) int {
	t.Helper()
	n, err := strconv.Atoi(string(m.Payload()))
	if err != nil {
		t.Fatalf("payload %q: %v", m.Payload(), err)
	}
	return n
}

// receiveLimit bounds how long a test waits for the messages it receives.
const receiveLimit = 15 * time.Second

// collector receives in the background, acking, and records what reached the application.
type collector struct {
	mu   sync.Mutex
	seqs []int
	stop func() // ends the receiving; the test's end does too
}

func collect(t testing.TB, c pulsar.Consumer) *collector { return collectAcking(t, c, true) }

// logGatesOnFailure logs, when the test fails, what each consumer reports and its gate's
// fields, before the consumers close.
func logGatesOnFailure(t *testing.T, consumers map[string]*Consumer) {
	t.Cleanup(func() {
		if t.Failed() {
			logGates(t, consumers)
		}
	})
}

// logGates logs what each consumer reports and its gate's fields.
func logGates(t *testing.T, consumers map[string]*Consumer) {
	for _, name := range slices.Sorted(maps.Keys(consumers)) {
		c := consumers[name]
		st := c.Status()
		c.gate.mu.Lock()
		dump := c.gate.String()
		c.gate.mu.Unlock()
		t.Logf("consumer %s: %s, held %d, connected %v; gate: %s", name, st.State, st.HeldMessages, st.Connected, dump)
	}
}

// collectAcking collects like collect; without ack it avoids a data race inside pulsar-client-go
// v0.19 between Ack and the discovery of new partitions (consumer_impl.go reads the partition
// list in AckID while partition discovery replaces it).
func collectAcking(t testing.TB, c pulsar.Consumer, ack bool) *collector {
	col := &collector{}
	col.stop = testkit.ReceiveInBackground(t, c, ack, func(m pulsar.Message) { col.add(seqOfMessage(t, m)) })
	return col
}

func (col *collector) add(seq int) {
	col.mu.Lock()
	defer col.mu.Unlock()
	col.seqs = append(col.seqs, seq)
}

func (col *collector) count() int {
	col.mu.Lock()
	defer col.mu.Unlock()
	return len(col.seqs)
}

func (col *collector) seqsCopy() []int {
	col.mu.Lock()
	defer col.mu.Unlock()
	return slices.Clone(col.seqs)
}

func (col *collector) distinct() map[int]bool {
	col.mu.Lock()
	defer col.mu.Unlock()
	seen := map[int]bool{}
	for _, s := range col.seqs {
		seen[s] = true
	}
	return seen
}

// uniqueTopic names a topic no other test, run or process uses, so that a shared remote broker
// needs no cleanup between tests and no test sees another's state.
func uniqueTopic(t testing.TB) string {
	return fmt.Sprintf("persistent://public/default/%s-%d-%s", sanitize(t.Name()), time.Now().UnixNano(), rand.Text()[:6])
}

func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			b[i] = '-'
		}
	}
	return string(b)
}
