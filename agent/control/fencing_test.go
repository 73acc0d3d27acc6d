package control_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/subflow-dev/subflow/agent/control"
	"github.com/subflow-dev/subflow/agent/protocol"
)

// A DELETE fences the released flow's older revisions as the rule did: a late or replayed push
// of revision 2 after revision 5 was released is refused, not restored. The same revision comes
// back (a pod relabelled away and back), and a recreated flow (a new uid) replaces the released
// one and retires its uid.
func TestReleaseFencesOlderRevisions(t *testing.T) {
	ts := newServer(t, control.Options{Token: token})
	url := ts.URL + protocol.PathPrefix + "/flows/ns/f"
	push := func(uid string, revision int64) (int, string) {
		body, _ := json.Marshal(protocol.FlowRequest{UID: uid, Revision: revision, Subscription: "sub", State: protocol.Paused})
		return call(t, http.MethodPut, url, token, string(body))
	}
	release := func(uid string) {
		t.Helper()
		if code, body := call(t, http.MethodDelete, url+"?uid="+uid, token, ""); code != http.StatusNoContent {
			t.Fatalf("DELETE: %d %s", code, body)
		}
	}
	if code, body := push("old", 5); code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	release("old")
	code, body := push("old", 2)
	if e := errorReason(t, body); code != http.StatusConflict || e.Reason != protocol.ReasonStaleRevision || e.AppliedRevision != 5 {
		t.Fatalf("revision 2 after revision 5 was released: %d %s, want 409 StaleRevision with appliedRevision 5", code, body)
	}
	if got := flows(t, ts.URL); len(got) != 0 {
		t.Fatalf("the refused push restored the rule: %+v", got)
	}
	if code, body := push("old", 5); code != http.StatusOK {
		t.Fatalf("the released revision again (relabelled back): %d %s, want 200", code, body)
	}
	release("old")
	if code, body := push("new", 1); code != http.StatusOK {
		t.Fatalf("a recreated flow after the release: %d %s, want 200", code, body)
	}
	code, body = push("old", 5)
	if code != http.StatusConflict || errorReason(t, body).Reason != protocol.ReasonStaleUID {
		t.Fatalf("the released uid after a recreated flow took its name: %d %s, want 409 StaleUID", code, body)
	}
	if got := flows(t, ts.URL); len(got) != 1 || got[0].UID != "new" {
		t.Fatalf("rules %+v, want the recreated flow's", got)
	}
}

// An agent holds at most MaxFlows rules: a new flow beyond is refused with 409 TooManyFlows and
// changes nothing; the rules held are still updated, replaced and released, and a release
// makes room.
func TestFlowsPerAgentAreBounded(t *testing.T) {
	ts := newServer(t, control.Options{Token: token, MaxFlows: 3})
	push := func(flow, uid string, revision int64, state protocol.State) (int, string) {
		body, _ := json.Marshal(protocol.FlowRequest{UID: uid, Revision: revision, Subscription: "sub", State: state})
		return call(t, http.MethodPut, ts.URL+protocol.PathPrefix+"/flows/ns/"+flow, token, string(body))
	}
	for i := range 3 {
		if code, body := push(fmt.Sprint("f", i), "u", 1, protocol.Running); code != http.StatusOK {
			t.Fatalf("flow %d: %d %s", i, code, body)
		}
	}
	code, body := push("f3", "u", 1, protocol.Paused)
	if code != http.StatusConflict || errorReason(t, body).Reason != protocol.ReasonTooManyFlows {
		t.Fatalf("a fourth flow: %d %s, want 409 TooManyFlows", code, body)
	}
	if code, body := push("f0", "u", 2, protocol.Paused); code != http.StatusOK {
		t.Fatalf("an update of a rule held: %d %s", code, body)
	}
	if code, body := push("f1", "recreated", 1, protocol.Stopped); code != http.StatusOK {
		t.Fatalf("a recreated flow of a rule held: %d %s", code, body)
	}
	if got := flows(t, ts.URL); len(got) != 3 || got[0].State != protocol.Paused || got[1].UID != "recreated" {
		t.Fatalf("rules %+v", got)
	}
	if code, body := call(t, http.MethodDelete, ts.URL+protocol.PathPrefix+"/flows/ns/f2?uid=u", token, ""); code != http.StatusNoContent {
		t.Fatalf("DELETE: %d %s", code, body)
	}
	if code, body := push("f3", "u", 1, protocol.Paused); code != http.StatusOK {
		t.Fatalf("a new flow once another was released: %d %s", code, body)
	}

	// By default, DefaultMaxFlows.
	ts = newServer(t, control.Options{Token: token})
	for i := range control.DefaultMaxFlows {
		if code, body := push(fmt.Sprint("g", i), "u", 1, protocol.Running); code != http.StatusOK {
			t.Fatalf("flow %d of the default bound: %d %s", i, code, body)
		}
	}
	if code, body := push("one-more", "u", 1, protocol.Running); code != http.StatusConflict {
		t.Fatalf("flow %d: %d %s, want 409", control.DefaultMaxFlows+1, code, body)
	}
}
