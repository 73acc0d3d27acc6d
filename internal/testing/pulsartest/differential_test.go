package pulsartest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"google.golang.org/protobuf/proto"

	"github.com/subflow-dev/subflow/internal/testing/wirerec"

	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

// Differential fidelity: every scenario below runs on this package's broker
// and, when PULSAR_URL and PULSAR_ADMIN_URL name one (hack/pulsar/pulsar.sh
// exec), on a real Apache Pulsar, each behind a wire recorder, and reduces
// what pulsar-client-go (or a raw client) saw to an observation: lines of
// "key = value" with ledger ids, times, producer names and ports
// normalised. The in-process observation must equal the scenario's want
// (what the real brokers showed), and the real broker's must equal the
// in-process one except for the lines listed in knownDivergences, which
// doc.go explains.
//
//	hack/pulsar/pulsar.sh exec -- go test -race -count=1 -run Differential -v ./internal/testing/pulsartest/
//	PULSAR_VERSION=4.2.4 hack/pulsar/pulsar.sh exec -- go test -race -count=1 -run Differential -v ./internal/testing/pulsartest/

// knownDivergences are observation lines ("scenario/key", or
// "scenario/key@profile" for one broker line) on which the real broker
// legitimately differs from pulsartest, with the reason; doc.go lists them
// too.
var knownDivergences = map[string]string{
	"InternalStatsFields/topic fields@4.0":                                          internalStatsPropertiesDivergence,
	"InternalStatsFields/topic properties@4.0":                                      internalStatsPropertiesDivergence,
	"EntryByIDHeaders/batch entry header X-Pulsar-Broker-Entry-Metadata-Timestamp":  brokerTimestampDivergence,
	"EntryByIDHeaders/single entry header X-Pulsar-Broker-Entry-Metadata-Timestamp": brokerTimestampDivergence,
	"EntryByIDHeaders/batch entry header X-Pulsar-Batch-Size":                       brokerTimestampDivergence,
}

const internalStatsPropertiesDivergence = "4.0 internal stats have no managed-ledger properties; pulsartest writes them as 4.2 does"

const brokerTimestampDivergence = "pulsartest stamps entries with a broker timestamp (AppendBrokerTimestampMetadataInterceptor); " +
	"the reference broker runs AppendIndexMetadataInterceptor only, so it has no timestamp header and its broker-entry " +
	"section, which X-Pulsar-batch-size counts, is 7 bytes shorter"

// diffProfiles are the broker versions pulsartest can stand in for, and how.
var diffProfiles = map[string]Options{
	"4.0": {DisableIndexLookup: true}, // before PIP-415: no getMessageIdByIndex
	"4.2": {},
}

func profileOf(version string) string {
	if strings.HasPrefix(version, "4.0.") { // PIP-415 landed in 4.1
		return "4.0"
	}
	return "4.2"
}

type diffScenario struct {
	name string
	run  func(tg *diffTarget, o *observation)
	// want is what both brokers show, by profile ("" for every profile).
	want map[string]string
	// settings are the broker settings the scenario needs where they differ from
	// diffSettingDefaults, and options sets the same on pulsartest.
	settings map[string]string
	options  func(*Options)
}

// diffSettingDefaults are the broker settings some scenario changes, with their defaults. A
// scenario runs on the real broker only when the broker's runtime configuration has the
// values it needs, so that one run per configuration covers each scenario once:
//
//	hack/pulsar/pulsar.sh exec --set subscriptionKeySharedUseConsistentHashing=false -- go test -run Differential ./internal/testing/pulsartest/
var diffSettingDefaults = map[string]string{
	"subscriptionKeySharedUseConsistentHashing": "true",
}

// mismatch names a setting the real broker has otherwise than the scenario needs.
func (sc diffScenario) mismatch(runtime map[string]string) string {
	for _, k := range slices.Sorted(mapKeys(diffSettingDefaults)) {
		want, ok := sc.settings[k]
		if !ok {
			want = diffSettingDefaults[k]
		}
		if runtime[k] != want {
			return fmt.Sprintf("%s=%s (the broker has %q)", k, want, runtime[k])
		}
	}
	return ""
}

// runtimeConfiguration reads the real broker's settings (BrokersBase.getRuntimeConfiguration).
func runtimeConfiguration(t *testing.T, admin string) map[string]string {
	t.Helper()
	resp, err := http.Get(strings.TrimSuffix(admin, "/") + "/admin/v2/brokers/configuration/runtime")
	if err != nil {
		t.Fatalf("runtime configuration of the real broker: %v", err)
	}
	defer resp.Body.Close()
	var conf map[string]string
	if err := json.NewDecoder(resp.Body).Decode(&conf); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("runtime configuration of the real broker: %d %v", resp.StatusCode, err)
	}
	return conf
}

func (sc diffScenario) wantFor(profile string) (string, bool) {
	if w, ok := sc.want[profile]; ok {
		return w, true
	}
	w, ok := sc.want[""]
	return w, ok
}

var diffScenarios = []diffScenario{}

func TestDifferential(t *testing.T) {
	realURL, realAdmin := os.Getenv("PULSAR_URL"), os.Getenv("PULSAR_ADMIN_URL")
	realVersion := os.Getenv("PULSAR_VERSION")
	if realVersion == "" {
		realVersion = "4.0.7"
	}
	haveReal := realURL != "" && realAdmin != ""
	run := strconv.FormatInt(time.Now().UnixNano()/int64(time.Millisecond)%(36*36*36*36*36), 36)
	var runtime map[string]string
	if haveReal {
		runtime = runtimeConfiguration(t, realAdmin)
	}
	for _, sc := range diffScenarios {
		t.Run(sc.name, func(t *testing.T) {
			profiles := []string{profileOf(realVersion)}
			if !haveReal {
				profiles = profiles[:0]
				for p := range sc.want {
					if p == "" {
						p = "4.2"
					}
					if !slices.Contains(profiles, p) {
						profiles = append(profiles, p)
					}
				}
				if len(profiles) == 0 {
					profiles = slices.Collect(mapKeys(diffProfiles))
				}
				slices.Sort(profiles)
			}
			for _, profile := range profiles {
				var local *observation
				t.Run("pulsartest-"+profile, func(t *testing.T) {
					local = runScenario(t, sc, newLocalTarget(t, profile, run, sc.options))
					want, ok := sc.wantFor(profile)
					if !ok {
						t.Fatalf("no want for profile %s; observed:\n%s", profile, local)
					}
					if d := parseObservation(want).diff(local, nil, nil); d != "" {
						t.Errorf("pulsartest differs from the recorded real broker (want = what Pulsar %s showed):\n%s\nobserved:\n%s", profile, d, local)
					}
				})
				if !haveReal || local == nil {
					continue
				}
				t.Run("pulsar-"+realVersion, func(t *testing.T) {
					if m := sc.mismatch(runtime); m != "" {
						t.Skipf("needs a broker with %s", m)
					}
					remote := runScenario(t, sc, newRealTarget(t, realURL, realAdmin, realVersion, run))
					known := func(key string) (string, bool) {
						if r, ok := knownDivergences[sc.name+"/"+key+"@"+profile]; ok {
							return r, true
						}
						r, ok := knownDivergences[sc.name+"/"+key]
						return r, ok
					}
					if d := local.diff(remote, known, t.Logf); d != "" {
						t.Errorf("Pulsar %s differs from pulsartest:\n%s\nobserved on Pulsar:\n%s", realVersion, d, remote)
					}
				})
			}
		})
	}
}

func runScenario(t *testing.T, sc diffScenario, tg *diffTarget) *observation {
	o := newObservation()
	sc.run(tg, o)
	t.Logf("%s on %s:\n%s", sc.name, tg.name, o)
	return o
}

// observation is an ordered set of "key = value" lines.
type observation struct {
	keys []string
	vals map[string]string
}

func newObservation() *observation { return &observation{vals: map[string]string{}} }

func (o *observation) set(key, format string, args ...any) {
	if _, ok := o.vals[key]; !ok {
		o.keys = append(o.keys, key)
	}
	o.vals[key] = fmt.Sprintf(format, args...)
}

func (o *observation) String() string {
	var sb strings.Builder
	for _, k := range o.keys {
		fmt.Fprintf(&sb, "%s = %s\n", k, o.vals[k])
	}
	return sb.String()
}

func parseObservation(s string) *observation {
	o := newObservation()
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		k, v, _ := strings.Cut(line, " = ")
		o.set(k, "%s", v)
	}
	return o
}

// diff lists the lines that differ between o (expected) and got; lines for
// which known gives a reason are reported as known, not as differences.
func (o *observation) diff(got *observation, known func(string) (string, bool), logKnown func(string, ...any)) string {
	keys := slices.Clone(o.keys)
	for _, k := range got.keys {
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	var sb strings.Builder
	for _, k := range keys {
		want, inWant := o.vals[k]
		have, inGot := got.vals[k]
		if inWant == inGot && want == have {
			continue
		}
		if known != nil {
			if reason, ok := known(k); ok {
				if logKnown != nil {
					logKnown("known divergence %s (%s): pulsartest %q, real broker %q", k, reason, want, have)
				}
				continue
			}
		}
		if !inWant {
			want = "(absent)"
		}
		if !inGot {
			have = "(absent)"
		}
		fmt.Fprintf(&sb, "  %s:\n    want %s\n    got  %s\n", k, want, have)
	}
	return sb.String()
}

// diffTarget is one broker behind a wire recorder, as a scenario sees it.
type diffTarget struct {
	t        *testing.T
	name     string
	real     bool
	rec      *wirerec.Proxy
	adminURL string
	client   pulsar.Client
	broker   *Broker // nil on a real broker
	suffix   string  // makes topic names unique per run: the real broker keeps topics
	ledgers  map[int64]string
}

func newLocalTarget(t *testing.T, profile, run string, options func(*Options)) *diffTarget {
	opts := diffProfiles[profile]
	if options != nil {
		options(&opts)
	}
	b := Start(t, opts)
	rec := wirerec.StartT(t, b.ServiceURL(), wirerec.Options{RewriteLookups: true})
	return newDiffTarget(t, "pulsartest-"+profile, rec, b.AdminURL(), b, run)
}

func newRealTarget(t *testing.T, url, admin, version, run string) *diffTarget {
	rec := wirerec.StartT(t, url, wirerec.Options{RewriteLookups: true})
	return newDiffTarget(t, "pulsar-"+version, rec, strings.TrimSuffix(admin, "/"), nil, run)
}

func newDiffTarget(t *testing.T, name string, rec *wirerec.Proxy, admin string, b *Broker, run string) *diffTarget {
	c := testkit.NewClient(t, rec.ServiceURL())
	logWireOnFailure(t, rec)
	return &diffTarget{
		t: t, name: name, real: b == nil, rec: rec, adminURL: admin, client: c, broker: b,
		suffix: run, ledgers: map[int64]string{},
	}
}

// logWireOnFailure logs every frame the target's recorder saw when the
// scenario fails, so a failure that does not reproduce can still be read.
func logWireOnFailure(t *testing.T, rec *wirerec.Proxy) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, ev := range rec.Events(wirerec.Filter{}) {
			t.Logf("wire %s conn %d %s %s consumer=%+v permits=%d messages=%d id=%+v error=%q",
				ev.Time.Format("15:04:05.000"), ev.Conn, ev.Dir, ev.Type, ev.Consumer, ev.Permits, ev.Messages, ev.MessageID, ev.Error)
		}
	})
}

// topic is a short topic name unique to this run.
func (tg *diffTarget) topic(name string) string { return name + "-" + tg.suffix }

func fullName(topic string) string { return "persistent://public/default/" + topic }

// ledger names a ledger id by order of first appearance: L0, L1...
func (tg *diffTarget) ledger(id int64) string {
	if id < 0 {
		return strconv.FormatInt(id, 10)
	}
	if n, ok := tg.ledgers[id]; ok {
		return n
	}
	n := "L" + strconv.Itoa(len(tg.ledgers))
	tg.ledgers[id] = n
	return n
}

func (tg *diffTarget) pos(ledger, entry int64) string {
	return tg.ledger(ledger) + ":" + strconv.FormatInt(entry, 10)
}

// position normalises "ledger:entry" as internal stats write it.
func (tg *diffTarget) position(s string) string {
	l, e, ok := strings.Cut(s, ":")
	if !ok {
		return s
	}
	li, err1 := strconv.ParseInt(l, 10, 64)
	ei, err2 := strconv.ParseInt(e, 10, 64)
	if err1 != nil || err2 != nil {
		return s
	}
	return tg.pos(li, ei)
}

const diffWait = 15 * time.Second

// eventually polls cond until it holds, failing the test at the deadline.
func (tg *diffTarget) eventually(what string, cond func() bool) {
	tg.t.Helper()
	if !tg.poll(diffWait, cond) {
		tg.t.Fatalf("%s: timed out waiting for %s", tg.name, what)
	}
}

// poll polls cond until it holds or d passes, and tells which.
func (tg *diffTarget) poll(d time.Duration, cond func() bool) bool {
	return testkit.Poll{Within: d, Every: 10 * time.Millisecond}.Until(cond)
}

func (tg *diffTarget) subscribe(opts pulsar.ConsumerOptions) pulsar.Consumer {
	tg.t.Helper()
	if opts.SubscriptionInitialPosition == pulsar.SubscriptionPositionLatest {
		opts.SubscriptionInitialPosition = pulsar.SubscriptionPositionEarliest
	}
	cons, err := tg.client.Subscribe(opts)
	if err != nil {
		tg.t.Fatalf("%s: subscribe %s/%s: %v", tg.name, opts.Topic, opts.SubscriptionName, err)
	}
	tg.t.Cleanup(cons.Close)
	return cons
}

// producer batches up to batch messages per entry; 0 disables batching.
func (tg *diffTarget) producer(topic string, batch int) pulsar.Producer {
	tg.t.Helper()
	opts := pulsar.ProducerOptions{Topic: topic, DisableBatching: batch == 0}
	if batch > 0 {
		opts.BatchingMaxMessages = uint(batch)
		opts.BatchingMaxPublishDelay = time.Hour
		opts.BatchingMaxSize = 1 << 20
	}
	p, err := tg.client.CreateProducer(opts)
	if err != nil {
		tg.t.Fatalf("%s: create producer on %s: %v", tg.name, topic, err)
	}
	tg.t.Cleanup(p.Close)
	return p
}

// send sends messages one by one and returns their ids.
func (tg *diffTarget) send(p pulsar.Producer, msgs ...*pulsar.ProducerMessage) []pulsar.MessageID {
	tg.t.Helper()
	ids := make([]pulsar.MessageID, 0, len(msgs))
	for _, m := range msgs {
		id, err := p.Send(context.Background(), m)
		if err != nil {
			tg.t.Fatalf("%s: send: %v", tg.name, err)
		}
		ids = append(ids, id)
	}
	return ids
}

// sendN sends n messages "<prefix>-<i>" one by one.
func (tg *diffTarget) sendN(p pulsar.Producer, prefix string, n int) []pulsar.MessageID {
	tg.t.Helper()
	msgs := make([]*pulsar.ProducerMessage, n)
	for i := range msgs {
		msgs[i] = &pulsar.ProducerMessage{Payload: fmt.Appendf(nil, "%s-%d", prefix, i)}
	}
	return tg.send(p, msgs...)
}

// sendBatched sends the messages asynchronously, so that a batching
// producer groups them, flushes and waits for every receipt.
func (tg *diffTarget) sendBatched(p pulsar.Producer, msgs ...*pulsar.ProducerMessage) []pulsar.MessageID {
	tg.t.Helper()
	type receipt struct {
		id  pulsar.MessageID
		err error
	}
	done := make(chan receipt, len(msgs))
	for _, m := range msgs {
		p.SendAsync(context.Background(), m, func(id pulsar.MessageID, _ *pulsar.ProducerMessage, err error) { done <- receipt{id, err} })
	}
	if err := p.Flush(); err != nil {
		tg.t.Fatalf("%s: flush: %v", tg.name, err)
	}
	ids := make([]pulsar.MessageID, 0, len(msgs))
	for range msgs {
		r := <-done
		if r.err != nil {
			tg.t.Fatalf("%s: send: %v", tg.name, r.err)
		}
		ids = append(ids, r.id)
	}
	return ids
}

func payloadsN(prefix string, n int) []*pulsar.ProducerMessage {
	msgs := make([]*pulsar.ProducerMessage, n)
	for i := range msgs {
		msgs[i] = &pulsar.ProducerMessage{Payload: fmt.Appendf(nil, "%s-%d", prefix, i)}
	}
	return msgs
}

// receive takes n messages, acking each when ack is set (the target's subtest names the target).
func (tg *diffTarget) receive(c pulsar.Consumer, n int, ack bool) []pulsar.Message {
	tg.t.Helper()
	if ack {
		return testkit.ReceiveAndAck(tg.t, c, n, diffWait)
	}
	return testkit.Receive(tg.t, c, n, diffWait)
}

// drain receives n messages from several consumers, acking each, and
// returns which consumer got each payload.
func (tg *diffTarget) drain(consumers map[string]pulsar.Consumer, n int) map[string]string {
	tg.t.Helper()
	got := map[string]string{}
	names := slices.Sorted(mapKeys(consumers))
	list := make([]pulsar.Consumer, len(names))
	for i, name := range names {
		list[i] = consumers[name]
	}
	drain(tg.t, list, func(i int, m pulsar.Message) bool {
		got[string(m.Payload())] = names[i]
		return len(got) >= n
	})
	return got
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// call makes an admin REST call; a path without a leading slash is under
// /admin/v2/persistent/public/default/.
func (tg *diffTarget) call(method, path, body string) (int, []byte, http.Header) {
	tg.t.Helper()
	if !strings.HasPrefix(path, "/") {
		path = "/admin/v2/persistent/public/default/" + path
	}
	req, err := http.NewRequest(method, tg.adminURL+path, strings.NewReader(body))
	if err != nil {
		tg.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tg.t.Fatalf("%s: %s %s: %v", tg.name, method, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data, resp.Header
}

func (tg *diffTarget) getJSON(path string, v any) int {
	tg.t.Helper()
	status, body, _ := tg.call(http.MethodGet, path, "")
	if status == http.StatusOK {
		if err := json.Unmarshal(body, v); err != nil {
			tg.t.Fatalf("%s: GET %s: %v in %s", tg.name, path, err, body)
		}
	}
	return status
}

func (tg *diffTarget) createPartitioned(topic string, n int) {
	tg.t.Helper()
	if status, body, _ := tg.call(http.MethodPut, topic+"/partitions", strconv.Itoa(n)); status != http.StatusNoContent {
		tg.t.Fatalf("%s: create partitioned %s: %d %s", tg.name, topic, status, body)
	}
}

type diffConsumerStats struct {
	ConsumerName     string `json:"consumerName"`
	AvailablePermits int64  `json:"availablePermits"`
	UnackedMessages  int64  `json:"unackedMessages"`
	MsgOutCounter    int64  `json:"msgOutCounter"`
}

type diffSubStats struct {
	MsgBacklog         int64               `json:"msgBacklog"`
	MsgOutCounter      int64               `json:"msgOutCounter"`
	UnackedMessages    int64               `json:"unackedMessages"`
	Type               string              `json:"type"`
	ActiveConsumerName string              `json:"activeConsumerName"`
	TotalMsgExpired    int64               `json:"totalMsgExpired"`
	Consumers          []diffConsumerStats `json:"consumers"`
}

type diffTopicStats struct {
	MsgInCounter  int64                   `json:"msgInCounter"`
	Subscriptions map[string]diffSubStats `json:"subscriptions"`
}

func (tg *diffTarget) subStats(topic, sub string) diffSubStats {
	tg.t.Helper()
	var st diffTopicStats
	if status := tg.getJSON(topic+"/stats", &st); status != http.StatusOK {
		tg.t.Fatalf("%s: stats of %s: %d", tg.name, topic, status)
	}
	return st.Subscriptions[sub]
}

func (tg *diffTarget) consumerStats(topic, sub, name string) diffConsumerStats {
	tg.t.Helper()
	for _, c := range tg.subStats(topic, sub).Consumers {
		if c.ConsumerName == name {
			return c
		}
	}
	return diffConsumerStats{ConsumerName: "(none)"}
}

type diffInternalStats struct {
	NumberOfEntries      int64  `json:"numberOfEntries"`
	CurrentLedgerEntries int64  `json:"currentLedgerEntries"`
	LastConfirmedEntry   string `json:"lastConfirmedEntry"`
	Ledgers              []struct {
		LedgerID int64 `json:"ledgerId"`
		Entries  int64 `json:"entries"`
	} `json:"ledgers"`
	Cursors map[string]struct {
		MarkDeletePosition string `json:"markDeletePosition"`
		ReadPosition       string `json:"readPosition"`
	} `json:"cursors"`
}

func (tg *diffTarget) internalStats(topic string) diffInternalStats {
	tg.t.Helper()
	var st diffInternalStats
	if status := tg.getJSON(topic+"/internalStats", &st); status != http.StatusOK {
		tg.t.Fatalf("%s: internal stats of %s: %d", tg.name, topic, status)
	}
	return st
}

// ledgerList is the internal stats' ledgers as "L0(3) L1(0)".
func (tg *diffTarget) ledgerList(st diffInternalStats) string {
	var parts []string
	for _, l := range st.Ledgers {
		parts = append(parts, fmt.Sprintf("%s(%d)", tg.ledger(l.LedgerID), l.Entries))
	}
	return strings.Join(parts, " ")
}

// Wire-record helpers.

func (tg *diffTarget) flows(f wirerec.Filter) string {
	var parts []string
	for _, e := range tg.rec.Flows(f) {
		if !e.AfterClose {
			parts = append(parts, strconv.Itoa(int(e.Permits)))
		}
	}
	return listOrNone(parts)
}

// entries lists the MESSAGE frames as "position(messages)".
func (tg *diffTarget) entries(f wirerec.Filter) string {
	var parts []string
	for _, e := range tg.rec.Messages(f) {
		parts = append(parts, fmt.Sprintf("%s(%d)", tg.pos(int64(e.MessageID.Ledger), int64(e.MessageID.Entry)), e.Messages))
	}
	return listOrNone(parts)
}

// batchSizes summarises the MESSAGE frames as "entries=N messages=M sizes=a,b".
func (tg *diffTarget) batchSizes(f wirerec.Filter) string {
	msgs := tg.rec.Messages(f)
	total := 0
	var sizes []int
	for _, e := range msgs {
		total += e.Messages
		if !slices.Contains(sizes, e.Messages) {
			sizes = append(sizes, e.Messages)
		}
	}
	parts := make([]string, len(sizes))
	for i, s := range sizes {
		parts[i] = strconv.Itoa(s)
	}
	return fmt.Sprintf("entries=%d messages=%d sizes=%s", len(msgs), total, strings.Join(parts, ","))
}

func (tg *diffTarget) events(f wirerec.Filter, dir wirerec.Direction, types ...pb.BaseCommand_Type) []wirerec.Event {
	var out []wirerec.Event
	for _, e := range tg.rec.Events(f, types...) {
		if dir == 0 || e.Dir == dir {
			out = append(out, e)
		}
	}
	return out
}

func listOrNone(parts []string) string {
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

func (tg *diffTarget) raw() *rawClient {
	tg.t.Helper()
	return dialRawURL(tg.t, tg.rec.ServiceURL())
}

// messageIDData converts a client message id for a raw command.
func messageIDData(id pulsar.MessageID) *pb.MessageIdData {
	return &pb.MessageIdData{LedgerId: proto.Uint64(uint64(id.LedgerID())), EntryId: proto.Uint64(uint64(id.EntryID()))}
}

func sortedJoin(m map[string]string) string {
	keys := slices.Sorted(mapKeys(m))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, " ")
}

func jsonKeys(raw json.RawMessage) string {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return "(not an object)"
	}
	keys := slices.Sorted(mapKeys(m))
	sort.Strings(keys)
	return strings.Join(keys, ",")
}
