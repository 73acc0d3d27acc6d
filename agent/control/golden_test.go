package control

import (
	"bytes"
	"encoding/json"
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

	sigsjson "sigs.k8s.io/json"

	"github.com/subflow-dev/subflow/agent"
	"github.com/subflow-dev/subflow/agent/protocol"
)

// The golden files hold the protocol as peers of other releases speak it
// (docs/design.md, section 4.17): requests as a controller sends them, and the agent's
// answers. They are never rewritten to follow a change: a change that makes a test below
// fail would break a controller or an agent of another release. A new protocol version adds
// exchanges; it does not edit these.

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
	Newer  bool `json:"newer"`
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

func readExchanges(t *testing.T) []exchange {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "golden", "exchanges.json"))
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
	for _, name := range []string{"flowstatus-full.json", "agentstate-full.json"} {
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
// times, value. Answers may have more fields.
func TestGoldenExchangesReplay(t *testing.T) {
	a, err := agent.New(agent.Options{Name: "orders-worker-7d9f8-x2x4k"})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(a, Options{Token: goldenToken, MaxFlows: goldenMaxFlows})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	for _, x := range readExchanges(t) {
		code, body, header := replay(t, ts.URL, x)
		if code != x.Answer.Status {
			t.Fatalf("%s: status %d %s, want %d", x.Name, code, body, x.Answer.Status)
		}
		if got := header.Get(protocol.VersionHeader); got != fmt.Sprint(protocol.Version) {
			t.Errorf("%s: %s header %q, want %d", x.Name, protocol.VersionHeader, got, protocol.Version)
		}
		if x.Answer.Body == nil {
			if len(body) > 0 {
				t.Errorf("%s: answer %s, want none", x.Name, body)
			}
			continue
		}
		if err := contains(x.Answer.Body, body, stable); err != nil {
			t.Errorf("%s: the answer %s differs from the golden one: %v", x.Name, body, err)
		}
	}
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
	return !slices.Contains([]string{"message", "agentVersion", "since", "readAt", "error", "unknown", "retentionUnknown"}, key)
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
