// Package pulsaradmin is the agent's one way to the Pulsar admin REST API: a Client that follows
// the brokers' redirects with the application's credentials and retries transient failures,
// the backlog reads of a subscription (Client.Backlog) and their background refresh (Watches),
// and seek by index: every index resolved to an entry (Client.Resolve), then the cursors reset
// (Client.ResetCursors, or both at once for consumers that are not the agent's:
// Client.ResetByIndex). docs/design.md sections 4.15 and 5.4 to 5.6.
package pulsaradmin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Client calls the few Pulsar admin REST endpoints seek by index and the backlog reads need,
// with plain net/http: the entry-metadata headers are not exposed by the Go admin package. A
// nil Client is one without an admin URL: its backlog reads are unknown and its seeks fail
// with ErrNoAdminURL.
type Client struct {
	base string
	http *http.Client
	auth func(*http.Request) error
	// retryBackoff is the first wait before retrying a transient failure; it doubles.
	retryBackoff time.Duration
}

// New returns a client of the admin API at base (http(s)://host:port) that sends its calls
// through hc (nil: http.DefaultClient, which is left as it is), adds auth's credentials to
// every request, and follows redirects to the hosts redirectPolicy trusts: base's own host,
// its subdomains, and the hosts in trusted.
func New(base string, hc *http.Client, auth func(*http.Request) error, trusted []string) *Client {
	if hc == nil {
		hc = http.DefaultClient
	}
	a := &Client{base: strings.TrimRight(base, "/"), auth: auth, retryBackoff: adminRetryBackoff}
	withRedirects := *hc // a copy: the application's client is left as it is
	withRedirects.CheckRedirect = a.redirectPolicy(base, trusted, hc.CheckRedirect)
	a.http = &withRedirects
	return a
}

// maxAdminRedirects bounds a redirect chain, as net/http does by default.
const maxAdminRedirects = 10

// redirectPolicy follows a broker's 307 to the broker that owns the topic with the agent's
// credentials: net/http drops Authorization on a redirect to another host, and keeps other
// headers the auth function may set. A redirect is followed only to a host the admin URL's
// cluster vouches for: the admin URL's own host or a subdomain of it (the usual Kubernetes
// layout: broker-0.broker.ns.svc under broker.ns.svc), or a host listed in trusted (exact
// host names or IPs, "*.example.com" for subdomains). Never from https to http. Any other
// redirect fails with a clear error, so credentials never reach a host a broker names by
// mistake or by malice.
func (a *Client) redirectPolicy(base string, trusted []string, next func(*http.Request, []*http.Request) error) func(*http.Request, []*http.Request) error {
	origin, _ := url.Parse(base)
	return func(req *http.Request, via []*http.Request) error {
		if len(via) >= maxAdminRedirects {
			return fmt.Errorf("agent: admin call stopped after %d redirects", len(via))
		}
		if origin == nil || !trustedRedirect(origin, req.URL, trusted) {
			return fmt.Errorf("agent: admin call redirected to untrusted %s://%s; list the host in Options.AdminRedirectHosts to follow it", req.URL.Scheme, req.URL.Host)
		}
		if next != nil {
			if err := next(req, via); err != nil {
				return err
			}
		}
		if a.auth != nil {
			return a.auth(req)
		}
		return nil
	}
}

func trustedRedirect(origin, target *url.URL, trusted []string) bool {
	if origin.Scheme == "https" && target.Scheme != "https" {
		return false
	}
	host, base := strings.ToLower(target.Hostname()), strings.ToLower(origin.Hostname())
	if host == base || strings.HasSuffix(host, "."+base) {
		return true
	}
	for _, t := range trusted {
		t = strings.ToLower(strings.TrimSpace(t))
		if suffix, ok := strings.CutPrefix(t, "*."); ok {
			if strings.HasSuffix(host, "."+suffix) {
				return true
			}
			continue
		}
		if host == strings.Trim(t, "[]") {
			return true
		}
	}
	return false
}

// ErrIndexMetadataDisabled means the broker attaches no index to entries, so no index can be
// resolved; nothing was moved.
var ErrIndexMetadataDisabled = errors.New("agent: broker exposes no entry index: enable brokerEntryMetadataInterceptors=org.apache.pulsar.common.intercept.AppendIndexMetadataInterceptor and exposingBrokerEntryMetadataToClientEnabled=true")

// errIndexLookupUnsupported means the broker predates PIP-415 (no getMessageIdByIndex).
var errIndexLookupUnsupported = errors.New("agent: broker has no getMessageIdByIndex endpoint")

// adminError is a non-2xx answer.
type adminError struct {
	Status int
	Path   string
	Reason string
}

func (e *adminError) Error() string {
	return fmt.Sprintf("agent: admin %s: HTTP %d: %s", e.Path, e.Status, e.Reason)
}

// TopicPath maps persistent://tenant/ns/topic (or a short name, in public/default) to
// /admin/v2/persistent/tenant/ns/topic.
func TopicPath(topic string) (string, error) {
	domain, rest, ok := strings.Cut(topic, "://")
	if !ok {
		domain, rest = "persistent", "public/default/"+topic
	}
	parts := strings.Split(rest, "/")
	if len(parts) == 1 {
		parts = []string{"public", "default", parts[0]}
	}
	if len(parts) != 3 || domain != "persistent" {
		return "", fmt.Errorf("agent: seek by index needs a persistent tenant/namespace/topic name, got %q", topic)
	}
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return "/admin/v2/persistent/" + strings.Join(parts, "/"), nil
}

// Transient failures are retried, adminRetries times with a doubling wait: a broker answers
// 503 while it loads or unloads a topic (ownership moving between brokers), 429 when it
// throttles, a gateway in front of it 502 or 504, and a refused connection is a broker
// restarting. Every call the agent makes is idempotent (reads, and a reset to a fixed
// position), so a retry is safe; the caller's context bounds the whole.
const (
	adminRetries      = 5
	adminRetryBackoff = 200 * time.Millisecond
)

func transientStatus(code int) bool {
	switch code {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

func transientError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// do sends a request, retrying transient failures; the answer is the last one.
func (a *Client) do(ctx context.Context, method, path string, body any) (*http.Response, error) {
	wait := a.retryBackoff
	for attempt := 0; ; attempt++ {
		resp, err := a.send(ctx, method, path, body)
		transient := (err != nil && transientError(err)) || (err == nil && transientStatus(resp.StatusCode))
		if !transient || attempt == adminRetries {
			return resp, err
		}
		last := err
		if resp != nil {
			last = &adminError{Status: resp.StatusCode, Path: path, Reason: reasonOf(resp.Body)}
			resp.Body.Close()
		}
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil, fmt.Errorf("%w (while retrying: %w)", ctx.Err(), last)
		}
		wait *= 2
	}
}

// send makes one request.
func (a *Client) send(ctx context.Context, method, path string, body any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if a.auth != nil {
		if err := a.auth(req); err != nil {
			return nil, err
		}
	}
	return a.http.Do(req)
}

// call performs a request and decodes a JSON answer into out (when not nil).
func (a *Client) call(ctx context.Context, method, path string, body, out any) (http.Header, error) {
	resp, err := a.do(ctx, method, path, body)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return nil, &adminError{Status: resp.StatusCode, Path: path, Reason: reasonOf(resp.Body)}
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return resp.Header, nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(out); err != nil {
		return nil, fmt.Errorf("agent: admin %s: %w", path, err)
	}
	return resp.Header, nil
}

func reasonOf(r io.Reader) string {
	b, _ := io.ReadAll(io.LimitReader(r, 4<<10))
	var e struct {
		Reason string `json:"reason"`
	}
	if json.Unmarshal(b, &e) == nil && e.Reason != "" {
		return e.Reason
	}
	return strings.TrimSpace(string(b))
}

type internalStats struct {
	LastConfirmedEntry   string `json:"lastConfirmedEntry"`
	CurrentLedgerEntries int64  `json:"currentLedgerEntries"`
	Ledgers              []struct {
		LedgerID int64 `json:"ledgerId"`
		Entries  int64 `json:"entries"`
	} `json:"ledgers"`
}

// ledgers lists the topic's ledgers with their entry counts. As in Pulsar, the open (last)
// ledger reports 0 entries in the list; its count comes from currentLedgerEntries.
func (a *Client) ledgers(ctx context.Context, topic string) ([]ledgerSpan, error) {
	base, err := TopicPath(topic)
	if err != nil {
		return nil, err
	}
	var st internalStats
	if _, err := a.call(ctx, http.MethodGet, base+"/internalStats", nil, &st); err != nil {
		return nil, err
	}
	spans := make([]ledgerSpan, 0, len(st.Ledgers))
	for i, l := range st.Ledgers {
		n := l.Entries
		if i == len(st.Ledgers)-1 && n == 0 {
			n = st.CurrentLedgerEntries
		}
		if n > 0 {
			spans = append(spans, ledgerSpan{ledger: l.LedgerID, entries: n})
		}
	}
	return spans, nil
}

// entryMeta reads one entry's broker index and message count from get-message-by-id.
func (a *Client) entryMeta(ctx context.Context, topic string, p Position) (entryMeta, error) {
	base, err := TopicPath(topic)
	if err != nil {
		return entryMeta{}, err
	}
	h, err := a.call(ctx, http.MethodGet, fmt.Sprintf("%s/ledger/%d/entry/%d", base, p.Ledger, p.Entry), nil, nil)
	if err != nil {
		return entryMeta{}, err
	}
	raw := h.Get("X-Pulsar-Broker-Entry-METADATA-index")
	if raw == "" {
		return entryMeta{}, ErrIndexMetadataDisabled
	}
	index, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		return entryMeta{}, fmt.Errorf("agent: bad entry index header %q: %w", raw, err)
	}
	count := int64(1)
	if raw := h.Get("X-Pulsar-num-batch-message"); raw != "" {
		if count, err = strconv.ParseInt(raw, 10, 32); err != nil || count < 1 {
			return entryMeta{}, fmt.Errorf("agent: bad batch count header %q", raw)
		}
	}
	meta := entryMeta{index: index, messages: count}
	if uuid := h.Get("X-Pulsar-uuid"); uuid != "" {
		id, err := strconv.ParseInt(h.Get("X-Pulsar-chunk-id"), 10, 32)
		if err != nil || id < 0 {
			return entryMeta{}, fmt.Errorf("agent: bad chunk id header %q", h.Get("X-Pulsar-chunk-id"))
		}
		meta.chunk = chunkInfo{uuid: uuid, id: int32(id)}
	}
	return meta, nil
}

type messageIDJSON struct {
	LedgerID       int64  `json:"ledgerId"`
	EntryID        int64  `json:"entryId"`
	PartitionIndex int32  `json:"partitionIndex"`
	BatchIndex     *int32 `json:"batchIndex,omitempty"`
}

// entryByIndex asks PIP-415 getMessageIdByIndex for the entry holding index.
func (a *Client) entryByIndex(ctx context.Context, topic string, index int64) (Position, error) {
	base, err := TopicPath(topic)
	if err != nil {
		return Position{}, err
	}
	var id messageIDJSON
	_, err = a.call(ctx, http.MethodGet, base+"/getMessageIdByIndex?index="+strconv.FormatInt(index, 10), nil, &id)
	var ae *adminError
	switch {
	case errors.As(err, &ae) && ae.Status == http.StatusPreconditionFailed:
		return Position{}, ErrIndexMetadataDisabled
	case errors.As(err, &ae) && (ae.Status == http.StatusNotFound || ae.Status == http.StatusMethodNotAllowed):
		// Callers ask only for indexes inside the topic's range, so 404 means no endpoint.
		return Position{}, errIndexLookupUnsupported
	case err != nil:
		return Position{}, err
	}
	return Position{Ledger: id.LedgerID, Entry: id.EntryID}, nil
}

// resetCursorData is the body of resetcursor (ResetCursorData in the broker).
type resetCursorData struct {
	LedgerID       int64 `json:"ledgerId"`
	EntryID        int64 `json:"entryId"`
	PartitionIndex int32 `json:"partitionIndex"`
	// Excluded is "excluded" on the wire: the broker's ResetCursorData is a Lombok bean whose
	// isExcluded field Jackson names "excluded", and it ignores unknown fields, so a body with
	// "isExcluded" resets to the entry itself (read off Pulsar 4.0 and 4.2).
	Excluded bool `json:"excluded"`
}

// resetCursor moves a subscription's cursor on one topic or partition to an entry, or past
// it when excluded (the entry is not delivered again, to this consumer or any other).
func (a *Client) resetCursor(ctx context.Context, topic, subscription string, p Position, excluded bool) error {
	base, err := TopicPath(topic)
	if err != nil {
		return err
	}
	path := base + "/subscription/" + url.PathEscape(subscription) + "/resetcursor"
	// The broker reads the flag from the body (ResetCursorData), not from the query.
	body := resetCursorData{LedgerID: p.Ledger, EntryID: p.Entry, PartitionIndex: -1, Excluded: excluded}
	_, err = a.call(ctx, http.MethodPost, path, body, nil)
	return err
}
