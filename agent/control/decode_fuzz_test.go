package control

import (
	"bytes"
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// requestAllocPerByte bounds what decoding a request body allocates per byte, on top of
// requestAllocSlack: the most per byte is a list of empty objects (`{},` is 3 bytes; each
// element is walked for unknown fields with its own field maps and path, then decoded into a
// struct of the list), about 225 bytes a byte. A body is at most MaxBodyBytes.
const (
	requestAllocPerByte = 320
	requestAllocSlack   = 64 << 10
)

// FuzzDecodeFlowRequest: the decoder never panics, whatever it accepts is valid and survives
// a round trip unchanged, and no body makes it allocate more than requestAllocPerByte per
// byte.
func FuzzDecodeFlowRequest(f *testing.F) {
	f.Add([]byte(`{"uid":"u","revision":1,"subscription":"s","state":"Paused"}`))
	f.Add([]byte(`{"uid":"u","revision":2,"subscription":"s","topic":"t","state":"Running","seek":{"id":"x","index":5,"execute":true}}`))
	f.Add([]byte(`{"uid":"u","revision":3,"subscription":"s","state":"Stopped","seek":{"id":"x","partitions":[{"partition":1,"index":2}]}}`))
	f.Add([]byte(`{"uid":`))
	// Repeated keys, a known name in another case, unknown fields at depth, trailing data.
	f.Add([]byte(`{"uid":"u","uid":"v","revision":1,"subscription":"s","state":"Paused"}`))
	f.Add([]byte(`{"UID":"u","revision":1,"subscription":"s","state":"Paused"}`))
	f.Add([]byte(`{"uid":"u","revision":1,"subscription":"s","state":"Paused","x":{"y":[[[[{}]]]]}}{}`))
	// The most allocated per byte: a list of empty objects.
	f.Add([]byte(`{"uid":"u","revision":3,"subscription":"s","state":"Stopped","seek":{"id":"x","index":1,"succeeded":true,"positions":[` +
		strings.Repeat(`{},`, 100) + `{}]}}`))
	_, _, _ = decodeFlowRequest(bytes.NewReader([]byte(`{"uid":"u","revision":1,"subscription":"s","state":"Paused","seek":{"id":"x","positions":[{}]}}`)))
	f.Fuzz(func(t *testing.T, data []byte) {
		var (
			req protocol.FlowRequest
			err error
		)
		r := bytes.NewReader(data)
		if n, bound := allocated(func() { req, _, err = decodeFlowRequest(r) }), uint64(requestAllocPerByte*len(data)+requestAllocSlack); n > bound {
			t.Fatalf("decoding a body of %d bytes allocated %d bytes, more than %d", len(data), n, bound)
		}
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

// allocated is how many bytes fn allocates on the heap.
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}
