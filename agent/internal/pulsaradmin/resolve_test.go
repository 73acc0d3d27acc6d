package pulsaradmin

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// arithTopic is a topic whose entries are computed, not stored: ledgers of perLedger entries
// with ids from firstLedger, every entry a batch of batch messages, first index firstIndex.
type arithTopic struct {
	firstLedger, perLedger, entries, batch, firstIndex int64
	noMetadata, noLookup                               bool
}

func (t arithTopic) posOf(k int64) Position {
	return Position{Ledger: t.firstLedger + k/t.perLedger, Entry: k % t.perLedger}
}

func (t arithTopic) kOf(p Position) (int64, bool) {
	k := (p.Ledger-t.firstLedger)*t.perLedger + p.Entry
	return k, p.Ledger >= t.firstLedger && p.Entry >= 0 && p.Entry < t.perLedger && k < t.entries
}

func (t arithTopic) metaOf(k int64) entryMeta {
	return entryMeta{index: t.firstIndex + (k+1)*t.batch - 1, messages: t.batch}
}

// serve answers the admin endpoints the agent uses, like a broker would, over real HTTP.
func (t arithTopic) serve(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	switch {
	case strings.HasSuffix(path, "/internalStats"):
		var b strings.Builder
		b.WriteString(`{"ledgers":[`)
		n := (t.entries + t.perLedger - 1) / t.perLedger
		for i := int64(0); i < n; i++ {
			entries := min(t.perLedger, t.entries-i*t.perLedger)
			if i == n-1 {
				entries = 0 // the open ledger, as Pulsar reports it
			}
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"ledgerId":%d,"entries":%d}`, t.firstLedger+i, entries)
		}
		fmt.Fprintf(&b, `],"currentLedgerEntries":%d}`, t.entries-(n-1)*t.perLedger)
		w.Write([]byte(b.String()))
	case strings.Contains(path, "/ledger/"):
		parts := strings.Split(path, "/")
		l, _ := strconv.ParseInt(parts[len(parts)-3], 10, 64)
		e, _ := strconv.ParseInt(parts[len(parts)-1], 10, 64)
		k, ok := t.kOf(Position{l, e})
		if !ok {
			http.Error(w, `{"reason":"not found"}`, http.StatusNotFound)
			return
		}
		if !t.noMetadata {
			w.Header()["X-Pulsar-Broker-Entry-METADATA-index"] = []string{strconv.FormatInt(t.metaOf(k).index, 10)}
		}
		if t.batch > 1 {
			w.Header()["X-Pulsar-num-batch-message"] = []string{strconv.FormatInt(t.batch, 10)}
		}
	case strings.HasSuffix(path, "/getMessageIdByIndex"):
		if t.noLookup {
			http.NotFound(w, r)
			return
		}
		if t.noMetadata {
			http.Error(w, `{"reason":"Broker entry metadata is not enabled"}`, http.StatusPreconditionFailed)
			return
		}
		x, _ := strconv.ParseInt(r.URL.Query().Get("index"), 10, 64)
		k := max(0, (x-t.firstIndex)/t.batch)
		p := t.posOf(k)
		fmt.Fprintf(w, `{"ledgerId":%d,"entryId":%d,"partitionIndex":-1}`, p.Ledger, p.Entry)
	default:
		http.NotFound(w, r)
	}
}

func (t arithTopic) source(tb testing.TB) indexSource {
	srv := httptest.NewServer(http.HandlerFunc(t.serve))
	tb.Cleanup(srv.Close)
	return New(srv.URL, srv.Client(), nil, nil)
}

const testTopic = "persistent://public/default/seek"

func TestResolveIndex(t *testing.T) {
	topic := arithTopic{firstLedger: 7, perLedger: 4, entries: 10, batch: 3, firstIndex: 30}
	// Indexes 30..59: entry k holds 30+3k .. 32+3k; ledgers 7 (entries 0-3), 8, 9 (0-1).
	cases := []struct {
		name  string
		x     int64
		want  resolution
		noPIP bool
	}{
		{name: "below range is earliest", x: 3, want: resolution{pos: Position{7, 0}, index: 30}},
		{name: "first message", x: 30, want: resolution{pos: Position{7, 0}, index: 30}},
		{name: "inside a batch", x: 43, want: resolution{pos: Position{8, 0}, batch: 1, index: 43}},
		{name: "inside a batch, binary search", x: 43, noPIP: true, want: resolution{pos: Position{8, 0}, batch: 1, index: 43}},
		{name: "last ledger, binary search", x: 58, noPIP: true, want: resolution{pos: Position{9, 1}, batch: 1, index: 58}},
		{name: "last message", x: 59, want: resolution{pos: Position{9, 1}, batch: 2, index: 59}},
		{name: "end of range is latest", x: 60, want: resolution{pos: Position{9, 1}, batch: 3, index: 60, past: true}},
		{name: "far above is latest", x: 1 << 40, want: resolution{pos: Position{9, 1}, batch: 3, index: 60, past: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tp := topic
			tp.noLookup = tc.noPIP
			got, err := resolveIndex(context.Background(), tp.source(t), testTopic, tc.x)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("resolveIndex(%d) = %+v, want %+v", tc.x, got, tc.want)
			}
		})
	}
}

func TestResolveIndexEmptyTopic(t *testing.T) {
	tp := arithTopic{firstLedger: 1, perLedger: 10, entries: 0, batch: 1}
	got, err := resolveIndex(context.Background(), tp.source(t), testTopic, 5)
	if err != nil || !got.empty {
		t.Fatalf("got %+v, %v; want an empty resolution", got, err)
	}
}

func TestResolveIndexWithoutMetadataIsTypedError(t *testing.T) {
	for _, noLookup := range []bool{false, true} {
		tp := arithTopic{firstLedger: 1, perLedger: 10, entries: 50, batch: 1, noMetadata: true, noLookup: noLookup}
		_, err := resolveIndex(context.Background(), tp.source(t), testTopic, 5)
		if !errors.Is(err, ErrIndexMetadataDisabled) {
			t.Fatalf("noLookup=%v: err = %v, want ErrIndexMetadataDisabled", noLookup, err)
		}
		if !strings.Contains(err.Error(), "brokerEntryMetadataInterceptors") || !strings.Contains(err.Error(), "exposingBrokerEntryMetadataToClientEnabled") {
			t.Fatalf("the error does not name the broker settings: %v", err)
		}
	}
}

// Every index of a topic with ledger rollovers resolves, within the probe bound.
func TestResolveIndexProbeBound(t *testing.T) {
	for _, noLookup := range []bool{false, true} {
		tp := arithTopic{firstLedger: 3, perLedger: 7, entries: 1000, batch: 2, firstIndex: 0, noLookup: noLookup}
		src := &countingSource{indexSource: tp.source(t)}
		bound := int(2*math.Log2(float64(tp.entries))) + 8
		for x := int64(0); x < tp.entries*tp.batch; x += 37 {
			src.probes = 0
			got, err := resolveIndex(context.Background(), src, testTopic, x)
			if err != nil {
				t.Fatal(err)
			}
			k := x / tp.batch
			if want := (resolution{pos: tp.posOf(k), batch: int32(x % tp.batch), index: x}); got != want {
				t.Fatalf("noLookup=%v x=%d: got %+v, want %+v", noLookup, x, got, want)
			}
			if src.probes > bound {
				t.Fatalf("noLookup=%v x=%d: %d probes, bound %d", noLookup, x, src.probes, bound)
			}
		}
	}
}

func TestTopicPath(t *testing.T) {
	for in, want := range map[string]string{
		"persistent://t/ns/a b-partition-2": "/admin/v2/persistent/t/ns/a%20b-partition-2",
		"orders":                            "/admin/v2/persistent/public/default/orders",
	} {
		if got, err := TopicPath(in); err != nil || got != want {
			t.Errorf("TopicPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := TopicPath("non-persistent://t/ns/x"); err == nil {
		t.Error("a non-persistent topic was accepted")
	}
}

// seekBatch is the number of messages per entry in the seek benchmarks, as the agent's
// (agent/bench_seek_test.go).
const seekBatch = 4

// BenchmarkSeekProbes measures index resolution on topics of 10^6 and 10^7 entries, side by
// side: pip415 and binarySearch time it alone, on computed topics served by a fake admin server
// over real HTTP. The agent's BenchmarkSeekProbes times the whole seek through pulsartest
// holding every entry (wholeSeek-pip415 and wholeSeek-binarySearch).
func BenchmarkSeekProbes(b *testing.B) {
	for _, entries := range []int64{1_000_000, 10_000_000} {
		for _, mode := range []string{"pip415", "binarySearch"} {
			b.Run(fmt.Sprintf("entries=%d/%s", entries, mode), func(b *testing.B) {
				tp := arithTopic{firstLedger: 100, perLedger: 50_000, entries: entries, batch: seekBatch, noLookup: mode == "binarySearch"}
				src := &countingSource{indexSource: tp.source(b)}
				ctx := context.Background()
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					x := (int64(i) * 7_919_993) % (entries * tp.batch)
					if _, err := resolveIndex(ctx, src, testTopic, x); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(src.probes)/float64(b.N), "probes/op")
				b.ReportMetric(2*math.Log2(float64(entries))+8, "probeBound")
			})
		}
	}
}

func TestIsPartitioned(t *testing.T) {
	cases := []struct {
		topic      string
		partitions []string
		want       bool
	}{
		{"orders", []string{"persistent://public/default/orders"}, false},
		{"persistent://t/n/orders", []string{"persistent://t/n/orders-partition-0"}, true},
		{"orders", []string{"persistent://public/default/orders-partition-0", "persistent://public/default/orders-partition-1"}, true},
		{"orders-partition-0", []string{"persistent://public/default/orders-partition-0"}, false},
	}
	for _, c := range cases {
		if got := isPartitioned(c.topic, c.partitions); got != c.want {
			t.Errorf("isPartitioned(%q, %v) = %v", c.topic, c.partitions, got)
		}
	}
}
