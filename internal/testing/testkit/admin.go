package testkit

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Admin calls a Pulsar admin REST API at adminURL (http://host:8080) with a JSON body (empty
// for none), decodes a 2xx answer into out (when not nil) and returns the status. Another
// status is logged with its body and returned for the caller to judge; no answer at all, or a
// 2xx body that does not decode, fails the test.
func Admin(t testing.TB, adminURL, method, path, body string, out any) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, adminURL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("admin %s %s: %v", method, path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		t.Logf("admin %s %s: HTTP %d: %s", method, path, resp.StatusCode, b)
		return resp.StatusCode
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("admin %s %s: %v: %s", method, path, err, b)
		}
	}
	return resp.StatusCode
}

// AdminOK is Admin that fails the test unless the answer is 2xx.
func AdminOK(t testing.TB, adminURL, method, path, body string, out any) {
	t.Helper()
	if status := Admin(t, adminURL, method, path, body, out); status/100 != 2 {
		t.Fatalf("admin %s %s: HTTP %d", method, path, status)
	}
}
