package control

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzDecodeFlowRequest: the decoder never panics, and whatever it accepts is valid and
// survives a round trip unchanged.
func FuzzDecodeFlowRequest(f *testing.F) {
	f.Add([]byte(`{"uid":"u","revision":1,"subscription":"s","state":"Paused"}`))
	f.Add([]byte(`{"uid":"u","revision":2,"subscription":"s","topic":"t","state":"Running","seek":{"id":"x","index":5,"execute":true}}`))
	f.Add([]byte(`{"uid":"u","revision":3,"subscription":"s","state":"Stopped","seek":{"id":"x","partitions":[{"partition":1,"index":2}]}}`))
	f.Add([]byte(`{"uid":`))
	f.Fuzz(func(t *testing.T, data []byte) {
		req, _, err := decodeFlowRequest(bytes.NewReader(data))
		if err != nil {
			return
		}
		if err := validate(req); err != nil {
			t.Fatalf("accepted an invalid request: %v", err)
		}
		again, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		back, ignored, err := decodeFlowRequest(bytes.NewReader(again))
		if err != nil {
			t.Fatalf("re-encoded request refused: %v (%s)", err, again)
		}
		if len(ignored) > 0 {
			t.Fatalf("re-encoded request has fields the decoder does not know: %q", ignored)
		}
		if b2, _ := json.Marshal(back); !bytes.Equal(b2, again) {
			t.Fatalf("round trip changed the request: %s vs %s", again, b2)
		}
	})
}
