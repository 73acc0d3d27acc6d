package testkit

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// Request sends a JSON request body (empty for none) and returns the status code and the
// trimmed response body. Only a failure to get an answer fails the test: the caller judges
// the code.
func Request(t testing.TB, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", method, url, err)
	}
	return resp.StatusCode, strings.TrimSpace(string(out))
}

// GetJSON decodes the JSON body of a GET of url into v, and fails t unless the answer is 200 OK
// with such a body.
func GetJSON(t testing.TB, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d", url, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: decoding the answer: %v", url, err)
	}
}
