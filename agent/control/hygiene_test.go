package control_test

import (
	"bufio"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/subflow-dev/subflow/agent/control"
	"github.com/subflow-dev/subflow/agent/protocol"
)

// callRaw sends a request as given (path unparsed, any headers) and returns code and body.
func callRaw(t *testing.T, method, url string, header map[string]string, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out strings.Builder
	_, _ = bufio.NewReader(resp.Body).WriteTo(&out)
	return resp.StatusCode, out.String()
}

func errorReason(t *testing.T, body string) protocol.Error {
	t.Helper()
	var e protocol.Error
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("answer %q is not a JSON error: %v", body, err)
	}
	return e
}

func flows(t *testing.T, base string) []protocol.FlowSummary {
	t.Helper()
	code, body := call(t, http.MethodGet, base+protocol.PathPrefix+"/state", token, "")
	if code != http.StatusOK {
		t.Fatalf("GET state: %d %s", code, body)
	}
	var st protocol.AgentState
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	return st.Flows
}

func TestPutNeedsJSONContentType(t *testing.T) {
	ts := newServer(t, control.Options{Token: token})
	url := ts.URL + protocol.PathPrefix + "/flows/ns/f"
	for _, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded", "application/jsonx"} {
		code, body := callRaw(t, http.MethodPut, url, map[string]string{"Authorization": "Bearer " + token, "Content-Type": ct}, flowBody(1, protocol.Paused, ""))
		if code != http.StatusUnsupportedMediaType || errorReason(t, body).Reason != protocol.ReasonUnsupportedMediaType {
			t.Errorf("content type %q: %d %s, want 415 UnsupportedMediaType", ct, code, body)
		}
	}
	if got := flows(t, ts.URL); len(got) != 0 {
		t.Fatalf("refused requests created rules: %+v", got)
	}
	code, body := callRaw(t, http.MethodPut, url, map[string]string{"Authorization": "Bearer " + token, "Content-Type": "application/json; charset=utf-8"}, flowBody(1, protocol.Paused, ""))
	if code != http.StatusOK {
		t.Fatalf("application/json with a charset: %d %s", code, body)
	}
}

func TestFlowPathsMustBeKubernetesNames(t *testing.T) {
	ts := newServer(t, control.Options{Token: token})
	base := ts.URL + protocol.PathPrefix + "/flows/"
	bad := []string{
		"ns%2Fa/b", "ns/a%2Fb", "ns/a%2fb", // escaped slashes: would both be the rule ns/a/b
		"ns/a%00b", "ns%00/a", // NUL
		"ns/..", "../f", "ns/.", "ns/%2E%2E", // dot segments
		"ns/" + strings.Repeat("a", 5000), strings.Repeat("n", 64) + "/f",
		"ns/F", "NS/f", "ns/a_b", "ns/-a", "ns/a-", "ns/a..b", "ns/.a", "ns./f", "n.s/f",
		"ns/a/b", "ns/", "/f", "ns", "ns/a%20b", "ns/a b",
	}
	for _, path := range bad {
		code, body := call(t, http.MethodPut, base+path, token, flowBody(1, protocol.Paused, ""))
		if code != http.StatusBadRequest || errorReason(t, body).Reason != protocol.ReasonBadRequest {
			t.Errorf("path %.80q: %d %.200s, want 400 BadRequest", path, code, body)
		}
	}
	if got := flows(t, ts.URL); len(got) != 0 {
		t.Fatalf("refused paths created rules: %+v", got)
	}
	for _, path := range []string{"ns/f", "a-1/b.c-d", strings.Repeat("n", 63) + "/" + strings.Repeat("a", 253), "0/9"} {
		if code, body := call(t, http.MethodPut, base+path, token, flowBody(1, protocol.Paused, "")); code != http.StatusOK {
			t.Errorf("valid path %.80q: %d %s", path, code, body)
		}
	}
}

func TestDeleteRequiresUID(t *testing.T) {
	ts := newServer(t, control.Options{Token: token})
	url := ts.URL + protocol.PathPrefix + "/flows/ns/f"
	if code, body := call(t, http.MethodPut, url, token, flowBody(1, protocol.Paused, "")); code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	for _, query := range []string{"", "?uid=", "?other=uid-1"} {
		code, body := call(t, http.MethodDelete, url+query, token, "")
		if code != http.StatusBadRequest || errorReason(t, body).Reason != protocol.ReasonBadRequest {
			t.Errorf("DELETE%s: %d %s, want 400", query, code, body)
		}
	}
	if got := flows(t, ts.URL); len(got) != 1 {
		t.Fatalf("a DELETE without uid released the rule: %+v", got)
	}
	code, body := call(t, http.MethodDelete, url+"?uid=uid-2", token, "")
	if code != http.StatusConflict || errorReason(t, body).Reason != protocol.ReasonUIDMismatch {
		t.Errorf("DELETE of another uid: %d %s, want 409 UIDMismatch", code, body)
	}
	if code, _ := call(t, http.MethodDelete, url+"?uid=uid-1", token, ""); code != http.StatusNoContent {
		t.Fatalf("DELETE: %d", code)
	}
	if code, body := call(t, http.MethodDelete, url+"?uid=uid-1", token, ""); code != http.StatusNotFound || errorReason(t, body).Reason != protocol.ReasonNotFound {
		t.Errorf("second DELETE: %d %s, want 404", code, body)
	}
}

// A recreated flow (new uid) replaces the rule at any revision; the old uid is refused from
// then on, also after the new flow's rule is released. A DELETE retires nothing.
func TestReplacedUIDIsRefused(t *testing.T) {
	ts := newServer(t, control.Options{Token: token})
	url := ts.URL + protocol.PathPrefix + "/flows/ns/f"
	push := func(uid string, revision int64, state protocol.State) (int, string) {
		body, _ := json.Marshal(protocol.FlowRequest{UID: uid, Revision: revision, Subscription: "sub", State: state})
		return call(t, http.MethodPut, url, token, string(body))
	}
	if code, body := push("old", 7, protocol.Paused); code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	if code, body := push("new", 1, protocol.Running); code != http.StatusOK {
		t.Fatalf("recreated flow at revision 1: %d %s", code, body)
	}
	code, body := push("old", 8, protocol.Stopped)
	if code != http.StatusConflict || errorReason(t, body).Reason != protocol.ReasonStaleUID {
		t.Fatalf("a late push of the replaced uid: %d %s, want 409 StaleUID", code, body)
	}
	if got := flows(t, ts.URL); len(got) != 1 || got[0].UID != "new" || got[0].State != protocol.Running {
		t.Fatalf("the refused push changed the rules: %+v", got)
	}
	if code, _ := call(t, http.MethodDelete, url+"?uid=new", token, ""); code != http.StatusNoContent {
		t.Fatalf("DELETE: %d", code)
	}
	if code, body := push("old", 9, protocol.Stopped); code != http.StatusConflict {
		t.Fatalf("the replaced uid after the release: %d %s, want 409", code, body)
	}
	if code, body := push("new", 1, protocol.Paused); code != http.StatusOK {
		t.Fatalf("the released uid came back (pod relabelled back): %d %s, want 200", code, body)
	}
	code, body = push("new", 0+1, protocol.Paused)
	if code != http.StatusOK {
		t.Fatalf("same revision again: %d %s", code, body)
	}
}

func TestStaleRevisionAnswerCarriesAppliedRevision(t *testing.T) {
	ts := newServer(t, control.Options{Token: token})
	url := ts.URL + protocol.PathPrefix + "/flows/ns/f"
	if code, body := call(t, http.MethodPut, url, token, flowBody(10, protocol.Paused, "")); code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	code, body := call(t, http.MethodPut, url, token, flowBody(3, protocol.Running, ""))
	e := errorReason(t, body)
	if code != http.StatusConflict || e.Reason != protocol.ReasonStaleRevision || e.AppliedRevision != 10 {
		t.Fatalf("stale revision: %d %s, want 409 StaleRevision with appliedRevision 10", code, body)
	}
}

func TestFieldNamesAreCaseSensitive(t *testing.T) {
	ts := newServer(t, control.Options{Token: token})
	url := ts.URL + protocol.PathPrefix + "/flows/ns/f"
	tests := []struct{ name, body, want string }{
		{"Revision", `{"uid":"u","Revision":1,"subscription":"s","state":"Paused"}`, `unknown field \"Revision\"`},
		{"UID", `{"UID":"u","revision":1,"subscription":"s","state":"Paused"}`, `unknown field \"UID\"`},
		{"nested seek.ID", `{"uid":"u","revision":1,"subscription":"s","state":"Paused","seek":{"ID":"x","index":1}}`, `unknown field \"seek.ID\"`},
		{"partition field", `{"uid":"u","revision":1,"subscription":"s","state":"Paused","seek":{"id":"x","partitions":[{"Partition":0,"index":1}]}}`, `unknown field \"seek.partitions[0].Partition\"`},
		{"duplicate uid", `{"uid":"u","uid":"v","revision":1,"subscription":"s","state":"Paused"}`, `duplicate field \"uid\"`},
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

func TestAuthorizationSchemeIsCaseInsensitive(t *testing.T) {
	ts := newServer(t, control.Options{Token: token})
	url := ts.URL + protocol.PathPrefix + "/state"
	for _, h := range []string{"bearer " + token, "BEARER " + token, "Bearer  " + token} {
		if code, body := callRaw(t, http.MethodGet, url, map[string]string{"Authorization": h}, ""); code != http.StatusOK {
			t.Errorf("Authorization %q: %d %s", h, code, body)
		}
	}
	for _, h := range []string{"Basic " + token, "Bearer", "Bearer " + strings.ToUpper(token), token, "Bearer" + token} {
		if code, _ := callRaw(t, http.MethodGet, url, map[string]string{"Authorization": h}, ""); code != http.StatusUnauthorized {
			t.Errorf("Authorization %q: %d, want 401", h, code)
		}
	}
}

// An unauthenticated request is answered before its body arrives, and its connection closed:
// a peer announcing a large body and sending nothing gets its 401 at once.
func TestUnauthenticatedBodyIsNotRead(t *testing.T) {
	addr := serveOnLoopback(t, control.Options{Token: token})
	for _, auth := range []string{"", "Authorization: Bearer wrong\r\n"} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, err = conn.Write([]byte("PUT " + protocol.PathPrefix + "/flows/ns/f HTTP/1.1\r\nHost: agent\r\n" + auth +
			"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"))
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("no answer before the body was sent (%q): %v", auth, err)
		}
		if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
			t.Fatalf("%q: %d close=%v, want 401 with the connection closed", auth, resp.StatusCode, resp.Close)
		}
		_ = resp.Body.Close()
		// The server closed its side: a read ends at once rather than after the timeouts.
		start := time.Now()
		if _, err := conn.Read(make([]byte, 1)); err == nil {
			t.Fatalf("connection still open after the 401")
		}
		if waited := time.Since(start); waited > time.Second {
			t.Fatalf("connection closed only after %s", waited)
		}
	}
}
