package control

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	sigsjson "sigs.k8s.io/json"

	"github.com/subflow-dev/subflow/agent"
	"github.com/subflow-dev/subflow/agent/protocol"
)

// The golden files hold the protocol as peers of other releases speak it
// (docs/design.md, section 4.17): requests as a controller sends them, and the agent's
// answers. They are never rewritten to follow a change: a change that makes a test below
// fail would break a controller or an agent of another release. A new protocol version adds
// exchanges; it does not edit these. exchanges.json holds protocol 2, exchanges-v3.json what
// protocol 3 added, each file replayed against an agent of its own.

// exchange is one request of testdata/golden/exchanges.json and the answer to it.
type exchange struct {
	Name    string `json:"name"`
	Request struct {
		Method  string            `json:"method"`
		Path    string            `json:"path"`
		Headers map[string]string `json:"headers"`
		Body    json.RawMessage   `json:"body"`
	} `json:"request"`
	// Newer marks a request of a newer controller, with fields this protocol does not have.
	Newer bool `json:"newer"`
	// Agent, when set, is the protocol of an older agent that gave the answer (recorded from
	// its build): what a controller of this protocol gets from it. It is not replayed.
	Agent int `json:"agent"`
	// Repeat marks an answer that holds values the agent reads in the background (backlogs):
	// the request is sent again, unchanged, as the controller does, until the answer holds them.
	Repeat bool `json:"repeat"`
	Answer struct {
		Status int             `json:"status"`
		Body   json.RawMessage `json:"body"`
	} `json:"answer"`
}

// goldenToken and goldenMaxFlows are the agent the exchanges were recorded with.
const (
	goldenToken    = "golden-token"
	goldenMaxFlows = 5
)

// exchangeFiles are the golden exchanges, one file per protocol version that added some.
var exchangeFiles = []string{"exchanges.json", "exchanges-v3.json"}

// readExchanges returns the exchanges of every file, in order.
func readExchanges(t *testing.T) []exchange {
	t.Helper()
	var out []exchange
	for _, name := range exchangeFiles {
		out = append(out, readExchangeFile(t, name)...)
	}
	return out
}

func readExchangeFile(t *testing.T, name string) []exchange {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "golden", name))
	if err != nil {
		t.Fatal(err)
	}
	var out []exchange
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// Every request a controller of this protocol sends is decoded, with no field ignored, and
// holds what the golden request says.
func TestGoldenRequestsDecode(t *testing.T) {
	for _, x := range readExchanges(t) {
		if x.Request.Body == nil || x.Newer {
			continue
		}
		t.Run(x.Name, func(t *testing.T) {
			req, ignored, err := decodeFlowRequest(bytes.NewReader(x.Request.Body))
			if err != nil && x.Answer.Status != http.StatusBadRequest {
				t.Fatalf("a golden request is refused: %v", err)
			}
			if len(ignored) > 0 {
				t.Fatalf("fields of a golden request are ignored: %q", ignored)
			}
			if err == nil {
				again, _ := json.Marshal(req)
				if err := contains(x.Request.Body, again, exactly); err != nil {
					t.Fatalf("the decoded request lost what the golden one says: %v", err)
				}
			}
		})
	}
}

// Every golden answer decodes into this build's types, every field with a home of the same
// JSON type, and this build encodes them back with the same names: a controller of another
// release reads what this agent answers as it read the golden answer.
func TestGoldenAnswersDecodeIntoTheCurrentTypes(t *testing.T) {
	type answer struct {
		name   string
		body   json.RawMessage
		status int
		method string
	}
	var answers []answer
	for _, x := range readExchanges(t) {
		answers = append(answers, answer{x.Name, x.Answer.Body, x.Answer.Status, x.Request.Method})
	}
	for _, name := range []string{"flowstatus-full.json", "flowstatus-full-v3.json", "agentstate-full.json"} {
		data, err := os.ReadFile(filepath.Join("testdata", "golden", name))
		if err != nil {
			t.Fatal(err)
		}
		method := http.MethodPut
		if strings.HasPrefix(name, "agentstate") {
			method = http.MethodGet
		}
		answers = append(answers, answer{name, data, http.StatusOK, method})
	}
	for _, a := range answers {
		t.Run(a.name, func(t *testing.T) {
			if a.status == http.StatusNoContent {
				return
			}
			into := answerType(a.method, a.status)
			strict, err := sigsjson.UnmarshalStrict(a.body, into)
			if err != nil || len(strict) > 0 {
				t.Fatalf("the golden answer does not decode into %T: %v %v", into, err, strict)
			}
			again, _ := json.Marshal(into)
			if err := contains(a.body, again, exactly); err != nil {
				t.Fatalf("this build encodes the golden answer differently: %v", err)
			}
		})
	}
}

// The agent answers the golden requests as the golden answers say: the same status, and
// every field of the golden answer with the same name, JSON type and, but for texts and
// times, value; protocolVersion is this agent's, at least the golden one. Answers may have
// more fields.
func TestGoldenExchangesReplay(t *testing.T) {
	for _, name := range exchangeFiles {
		t.Run(name, func(t *testing.T) { replayFile(t, name) })
	}
}

func replayFile(t *testing.T, name string) {
	a, err := agent.New(agent.Options{Name: "orders-worker-7d9f8-x2x4k"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	srv, err := New(a, Options{Token: goldenToken, MaxFlows: goldenMaxFlows})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	for _, x := range readExchangeFile(t, name) {
		if x.Agent != 0 && x.Agent < protocol.Version {
			continue // an older agent's answer
		}
		code, body, header := replay(t, ts.URL, x)
		for deadline := time.Now().Add(10 * time.Second); x.Repeat && time.Now().Before(deadline) &&
			replayed(x, code, body) != nil; {
			time.Sleep(10 * time.Millisecond) // the agent reads in the background; the controller pushes again
			code, body, header = replay(t, ts.URL, x)
		}
		if code != x.Answer.Status {
			t.Fatalf("%s: status %d %s, want %d", x.Name, code, body, x.Answer.Status)
		}
		if got := header.Get(protocol.VersionHeader); got != fmt.Sprint(protocol.Version) {
			t.Errorf("%s: %s header %q, want %d", x.Name, protocol.VersionHeader, got, protocol.Version)
		}
		if err := replayed(x, code, body); err != nil {
			t.Errorf("%s: the answer %s differs from the golden one: %v", x.Name, body, err)
		}
	}
}

// replayed compares an answer with the golden one.
func replayed(x exchange, code int, body []byte) error {
	if code != x.Answer.Status {
		return fmt.Errorf("status %d, want %d", code, x.Answer.Status)
	}
	if x.Answer.Body == nil {
		if len(body) > 0 {
			return errors.New("an answer where the golden one has none")
		}
		return nil
	}
	if err := contains(x.Answer.Body, body, stable); err != nil {
		return err
	}
	var want, got struct {
		ProtocolVersion *int `json:"protocolVersion"`
	}
	_ = json.Unmarshal(x.Answer.Body, &want)
	_ = json.Unmarshal(body, &got)
	switch {
	case want.ProtocolVersion == nil:
	case got.ProtocolVersion == nil:
		return errors.New("protocolVersion: missing")
	case *got.ProtocolVersion != protocol.Version || *got.ProtocolVersion < *want.ProtocolVersion:
		return fmt.Errorf("protocolVersion %d, want this agent's %d (the golden answer's was %d)",
			*got.ProtocolVersion, protocol.Version, *want.ProtocolVersion)
	}
	return nil
}

func replay(t *testing.T, base string, x exchange) (int, []byte, http.Header) {
	t.Helper()
	req, err := http.NewRequest(x.Request.Method, base+x.Request.Path, bytes.NewReader(x.Request.Body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+goldenToken)
	if x.Request.Body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range x.Request.Headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, bytes.TrimSpace(body), resp.Header
}

func answerType(method string, status int) any {
	switch {
	case status/100 != 2:
		return &protocol.Error{}
	case method == http.MethodGet:
		return &protocol.AgentState{}
	default:
		return &protocol.FlowStatus{}
	}
}

// exactly and stable say which values contains compares; the others it compares by JSON type.
func exactly(string) bool { return true }

// stable leaves out texts meant for people and values that change from run to run.
func stable(key string) bool {
	return !slices.Contains([]string{"message", "agentVersion", "since", "readAt", "error", "unknown", "retentionUnknown",
		"protocolVersion"}, key) // the agent's protocolVersion grows: replayed checks it
}

// contains checks that got has every field of want, with the same JSON type, and the same
// value where compare says so for its name; lists must have the same length.
func contains(want, got []byte, compare func(key string) bool) error {
	var w, g any
	for _, v := range []struct {
		data []byte
		into *any
	}{{want, &w}, {got, &g}} {
		dec := json.NewDecoder(bytes.NewReader(v.data))
		dec.UseNumber()
		if err := dec.Decode(v.into); err != nil {
			return fmt.Errorf("decoding %s: %w", v.data, err)
		}
	}
	return containsValue(w, g, "", compare(""), compare)
}

func containsValue(want, got any, path string, exact bool, compare func(string) bool) error {
	if reflect.TypeOf(want) != reflect.TypeOf(got) {
		return fmt.Errorf("%s: %v (%T), want a %T", path, got, got, want)
	}
	switch w := want.(type) {
	case map[string]any:
		g := got.(map[string]any)
		for k, v := range w {
			gv, ok := g[k]
			if !ok {
				return fmt.Errorf("%s.%s: missing", path, k)
			}
			if err := containsValue(v, gv, path+"."+k, compare(k), compare); err != nil {
				return err
			}
		}
	case []any:
		g := got.([]any)
		if len(g) != len(w) {
			return fmt.Errorf("%s: %d elements, want %d", path, len(g), len(w))
		}
		for i := range w {
			if err := containsValue(w[i], g[i], fmt.Sprintf("%s[%d]", path, i), exact, compare); err != nil {
				return err
			}
		}
	default:
		if exact && want != got {
			return fmt.Errorf("%s: %v, want %v", path, got, want)
		}
	}
	return nil
}
