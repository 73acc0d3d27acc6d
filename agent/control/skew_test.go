package control_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/subflow-dev/subflow/agent/control"
	"github.com/subflow-dev/subflow/agent/protocol"
)

// A controller one release newer sends optional fields this agent does not know, at any depth:
// the push applies, and the answer names what was ignored.
func TestUnknownOptionalFieldsOfANewerControllerAreIgnored(t *testing.T) {
	ts := newServer(t, control.Options{Token: token})
	url := ts.URL + protocol.PathPrefix + "/flows/ns/f"
	body := `{"uid":"uid-1","revision":3,"subscription":"sub","state":"Paused","priority":{"level":"high","why":["a","b"]},` +
		`"seek":{"id":"s1","partitions":[{"partition":0,"index":1,"weight":2},{"partition":1,"index":1,"weight":3}],"hint":null}}`
	code, out := callRaw(t, http.MethodPut, url, map[string]string{"Authorization": "Bearer " + token,
		"Content-Type": "application/json", protocol.VersionHeader: "3"}, body)
	if code != http.StatusOK {
		t.Fatalf("a newer controller's push: %d %s, want 200", code, out)
	}
	var st protocol.FlowStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatal(err)
	}
	want := []string{"priority", "seek.partitions[].weight", "seek.hint"}
	if !slices.Equal(st.IgnoredFields, want) || st.ProtocolVersion != protocol.Version || st.AgentVersion == "" {
		t.Fatalf("answer %s: want ignoredFields %q, protocolVersion %d and an agentVersion", out, want, protocol.Version)
	}
	if got := flows(t, ts.URL); len(got) != 1 || got[0].State != protocol.Paused || got[0].AppliedRevision != 3 {
		t.Fatalf("the rule was not applied: %+v", got)
	}
}

// Tolerance covers unknown fields only: a repeated field (known or not), a known field's name
// in another case, trailing data and invalid values of known fields are still refused, and
// change nothing.
func TestSkewToleranceRefusesWhatIsNotSkew(t *testing.T) {
	ts := newServer(t, control.Options{Token: token})
	url := ts.URL + protocol.PathPrefix + "/flows/ns/f"
	tests := []struct{ name, body, want string }{
		{"repeated unknown field", flowBody(1, protocol.Paused, `,"extra":1,"extra":2`), `duplicate field \"extra\"`},
		{"repeated nested field", flowBody(1, protocol.Paused, `,"seek":{"id":"x","index":1,"index":2}`), `duplicate field \"seek.index\"`},
		{"known name in another case", flowBody(1, protocol.Paused, `,"reportbacklog":true`), `unknown field \"reportbacklog\": names are case-sensitive, this one is \"reportBacklog\"`},
		{"unknown field after the known one in another case", `{"uid":"u","revision":1,"subscription":"s","state":"Paused","State":"Running"}`, `unknown field \"State\"`},
		{"new state value", flowBody(1, "Draining", ""), `state \"Draining\"`},
		{"wrong type", flowBody(1, protocol.Paused, `,"reportBacklog":"yes"`), "invalid JSON"},
		{"trailing data", flowBody(1, protocol.Paused, "") + ` {"uid":"x"}`, "more than one object"},
		{"an array", `[` + flowBody(1, protocol.Paused, "") + `]`, "invalid JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := call(t, http.MethodPut, url, token, tt.body)
			if code != http.StatusBadRequest || !strings.Contains(body, tt.want) {
				t.Fatalf("%d %s, want 400 mentioning %s", code, body, tt.want)
			}
		})
	}
	if got := flows(t, ts.URL); len(got) != 0 {
		t.Fatalf("refused bodies created rules: %+v", got)
	}
}

// A push that requires a feature this agent lacks is refused whole, with 422 AgentTooOld
// naming the features and the agent's protocol, before its body is read (a body of a newer
// protocol may hold values this one would call invalid); features it has are fine.
func TestRequiredFeatureTheAgentLacksRefusesThePush(t *testing.T) {
	ts := newServer(t, control.Options{Token: token})
	url := ts.URL + protocol.PathPrefix + "/flows/ns/f"
	push := func(requires, body string) (int, string) {
		return callRaw(t, http.MethodPut, url, map[string]string{"Authorization": "Bearer " + token,
			"Content-Type": "application/json", protocol.RequiresHeader: requires}, body)
	}
	code, out := push("seek.positions, seek.timestamp,state=Draining", flowBody(1, "Draining", `,"seek":{"id":"x","timestamp":"2026-01-01T00:00:00Z"}`))
	e := errorReason(t, out)
	if code != http.StatusUnprocessableEntity || e.Reason != protocol.ReasonAgentTooOld || e.ProtocolVersion != protocol.Version ||
		!slices.Equal(e.MissingFeatures, []string{"seek.timestamp", "state=Draining"}) {
		t.Fatalf("%d %s, want 422 AgentTooOld naming seek.timestamp and state=Draining, with protocolVersion %d", code, out, protocol.Version)
	}
	if got := flows(t, ts.URL); len(got) != 0 {
		t.Fatalf("a refused push created a rule: %+v", got)
	}
	if code, out := push("seek.positions,reportBacklog", flowBody(1, protocol.Paused, `,"reportBacklog":true`)); code != http.StatusOK {
		t.Fatalf("a push requiring features the agent has: %d %s", code, out)
	}
	code, out = callRaw(t, http.MethodDelete, url+"?uid=uid-1", map[string]string{"Authorization": "Bearer " + token,
		protocol.RequiresHeader: "delete.cascade"}, "")
	if code != http.StatusUnprocessableEntity || len(flows(t, ts.URL)) != 1 {
		t.Fatalf("a release requiring a feature the agent lacks: %d %s, want 422 and the rule kept", code, out)
	}
	many := strings.Repeat("x,", 5000) + strings.Repeat("y", 10)
	for i := range 100 {
		many += ",f" + strings.Repeat("z", i)
	}
	if code, out := push(many, flowBody(1, protocol.Paused, "")); code != http.StatusUnprocessableEntity ||
		len(errorReason(t, out).MissingFeatures) != protocol.MaxMissingFeatures {
		t.Fatalf("a long list of missing features: %d %.300s, want 422 naming %d", code, out, protocol.MaxMissingFeatures)
	}
}

// Every answer carries the agent's protocol version: in a header, and in every JSON body.
func TestEveryAnswerNamesTheProtocolVersion(t *testing.T) {
	ts := newServer(t, control.Options{Token: token})
	for _, tc := range []struct{ method, path, bearer, body string }{
		{http.MethodPut, "/flows/ns/f", token, flowBody(1, protocol.Paused, "")},
		{http.MethodGet, "/state", token, ""},
		{http.MethodPut, "/flows/ns/f", token, "{"},
		{http.MethodGet, "/state", "wrong", ""},
		{http.MethodDelete, "/flows/ns/g?uid=u", token, ""},
	} {
		req, _ := http.NewRequest(tc.method, ts.URL+protocol.PathPrefix+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Authorization", "Bearer "+tc.bearer)
		req.Header.Set("Content-Type", "application/json")
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var answer struct {
			ProtocolVersion int `json:"protocolVersion"`
		}
		err = json.NewDecoder(resp.Body).Decode(&answer)
		_ = resp.Body.Close()
		if err != nil || answer.ProtocolVersion != protocol.Version || resp.Header.Get(protocol.VersionHeader) != strconv.Itoa(protocol.Version) {
			t.Errorf("%s %s: %d, protocolVersion %d (%v), header %q: want %d in both", tc.method, tc.path, resp.StatusCode,
				answer.ProtocolVersion, err, resp.Header.Get(protocol.VersionHeader), protocol.Version)
		}
	}
}
