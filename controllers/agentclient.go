package controllers

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// AgentClient talks to the agent in one pod. The reconciler depends on this interface so that
// unit tests can use a hand-written fake; integration tests use HTTPAgentClient for real.
type AgentClient interface {
	PutFlow(ctx context.Context, target AgentTarget, req protocol.FlowRequest) (protocol.FlowStatus, error)
	DeleteFlow(ctx context.Context, target AgentTarget, uid string) error
}

// AgentTarget addresses one flow rule in one pod's agent.
type AgentTarget struct {
	Pod     string
	BaseURL string // http://10.0.0.7:9470, https://[fd00::7]:9470
	Token   string
	// PreviousToken is offered when the agent refuses Token during a rotation's grace.
	PreviousToken string
	Namespace     string // the flow's
	Name          string // the flow's
	// Unpooled closes the connection after the call instead of keeping it idle for the next:
	// for a flow with more pods than the idle pool, whose every push would only evict another
	// idle connection (wantPooled).
	Unpooled bool
}

// agentIdlePool is how many idle connections to agents the controller keeps.
const agentIdlePool = 2048

// wantPooled tells whether the pushes to a flow of this many pods should keep their
// connections. A larger flow's pushes dial afresh anyway, and keeping their connections only
// churned the pool and held its memory: closing them lowered the controller's peak memory when
// pausing 10 000 agents (BENCHMARKS.md, BenchmarkFleetPause; docs/fleet-scale-findings.md).
func wantPooled(pods int) bool { return pods <= agentIdlePool }

func (t AgentTarget) flowURL() string {
	return fmt.Sprintf("%s%s/flows/%s/%s", t.BaseURL, protocol.PathPrefix, url.PathEscape(t.Namespace), url.PathEscape(t.Name))
}

// AgentError is an answer from an agent that was not 2xx.
type AgentError struct {
	Status  int
	Reason  string
	Message string
	// AppliedRevision is the agent's revision when it refused a stale one.
	AppliedRevision int64
	// ProtocolVersion is the agent's protocol version, when its answer said (0: it did not).
	ProtocolVersion int
	// MissingFeatures are, with AgentTooOld, the required features the agent lacks (at most
	// protocol.MaxMissingFeatures, each clipped).
	MissingFeatures []string
}

func (e *AgentError) Error() string {
	return fmt.Sprintf("agent answered %d %s: %s", e.Status, e.Reason, e.Message)
}

// maxFeatureName bounds each missing feature an agent names.
const maxFeatureName = 64

// agentErrorFrom reads a non-2xx answer's body; whatever the agent sends, what it puts into
// status stays bounded.
func agentErrorFrom(status int, data []byte) *AgentError {
	agentErr := &AgentError{Status: status}
	var payload protocol.Error
	if json.Unmarshal(data, &payload) != nil {
		agentErr.Message = clip(string(data), maxAgentText)
		return agentErr
	}
	agentErr.Reason, agentErr.Message, agentErr.AppliedRevision = clip(payload.Reason, 64), clip(payload.Message, maxAgentText), payload.AppliedRevision
	agentErr.ProtocolVersion = max(payload.ProtocolVersion, 0)
	for _, f := range payload.MissingFeatures[:min(len(payload.MissingFeatures), protocol.MaxMissingFeatures)] {
		agentErr.MissingFeatures = append(agentErr.MissingFeatures, clip(f, maxFeatureName))
	}
	return agentErr
}

// IsUnauthorized reports whether the agent refused the token.
func IsUnauthorized(err error) bool {
	var agentErr *AgentError
	return errors.As(err, &agentErr) && (agentErr.Status == http.StatusUnauthorized || agentErr.Status == http.StatusForbidden)
}

// IsStale reports whether the agent already applied a newer revision.
func IsStale(err error) bool {
	var agentErr *AgentError
	return errors.As(err, &agentErr) && agentErr.Status == http.StatusConflict && agentErr.Reason == protocol.ReasonStaleRevision
}

// IsAgentTooOld reports whether the agent refused a request that requires features it lacks
// (it changed nothing).
func IsAgentTooOld(err error) bool {
	var agentErr *AgentError
	return errors.As(err, &agentErr) && agentErr.Status == http.StatusUnprocessableEntity && agentErr.Reason == protocol.ReasonAgentTooOld
}

// IsTooManyFlows reports whether the agent holds as many flow rules as it may and refused a
// new one (it changed nothing).
func IsTooManyFlows(err error) bool {
	var agentErr *AgentError
	return errors.As(err, &agentErr) && agentErr.Status == http.StatusConflict && agentErr.Reason == protocol.ReasonTooManyFlows
}

// HTTPAgentClient speaks the agent protocol over HTTP with a per-call timeout.
type HTTPAgentClient struct {
	HTTP    *http.Client
	Timeout time.Duration
}

// agentBufferSize is the read and write buffer of each connection to an agent.
const agentBufferSize = 1 << 10

// NewHTTPAgentClient returns a client with keep-alive connections sized for many pods.
// tlsConfig verifies agents served over https (port named subflow-https); nil means the
// system roots.
func NewHTTPAgentClient(timeout time.Duration, tlsConfig *tls.Config) *HTTPAgentClient {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = 4
	transport.MaxIdleConns = agentIdlePool
	// Requests and answers are a few KiB at most, and in a fleet larger than the idle pool most
	// pushes dial afresh: the 4 KiB default buffers of each new connection were a large share of
	// the bytes the controller allocated when pausing 10 000 agents (BENCHMARKS.md,
	// BenchmarkFleetPause; docs/fleet-scale-findings.md).
	transport.ReadBufferSize = agentBufferSize
	transport.WriteBufferSize = agentBufferSize
	transport.Proxy = nil // pod IPs are never reached through a proxy
	if tlsConfig != nil {
		// The transport adds its protocols to the config it is given: never share one.
		transport.TLSClientConfig = tlsConfig.Clone()
	}
	// A redirect from an agent is never followed: it would carry the token elsewhere.
	noRedirect := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &HTTPAgentClient{HTTP: &http.Client{Transport: transport, CheckRedirect: noRedirect}, Timeout: timeout}
}

// AgentTLSConfig returns the TLS settings for agents: trust the PEM CA bundle in caFile (empty:
// the system roots) and expect serverName in their certificates (empty: the pod IP).
func AgentTLSConfig(caFile, serverName string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if caFile == "" {
		return cfg, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	cfg.RootCAs = x509.NewCertPool()
	if !cfg.RootCAs.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("no PEM certificate in %s", caFile)
	}
	return cfg, nil
}

// PutFlow sends the desired state and returns what the agent observed.
func (c *HTTPAgentClient) PutFlow(ctx context.Context, target AgentTarget, req protocol.FlowRequest) (protocol.FlowStatus, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return protocol.FlowStatus{}, err
	}
	var status protocol.FlowStatus
	err = c.do(ctx, http.MethodPut, target, target.flowURL(), body, requiredFeatures(req), &status)
	return status, err
}

// requiredFeatures names the features (protocol.Features) that req relies on: those an agent
// that ignored them would act on otherwise than asked, so that such an agent refuses the
// request (422 AgentTooOld) instead of applying half of it (docs/design.md 4.17). backlogOf:
// an agent that ignored it would answer without the figures, which would read as a backlog
// not yet read for ever. The controller asks it only of agents that reported protocol 3 or
// later (backlogWatcher), so a refusal means the pod went back to an older agent.
func requiredFeatures(req protocol.FlowRequest) []string {
	if len(req.BacklogOf) > 0 {
		return []string{"backlogOf"}
	}
	return nil
}

// DeleteFlow releases the flow's rule in the agent. An agent that does not hold it answers 404,
// or 409 UIDMismatch when it holds a newer flow's rule under the same name: either way this
// flow's rule is gone, which is what was asked.
func (c *HTTPAgentClient) DeleteFlow(ctx context.Context, target AgentTarget, uid string) error {
	err := c.do(ctx, http.MethodDelete, target, target.flowURL()+"?uid="+url.QueryEscape(uid), nil, nil, nil)
	var agentErr *AgentError
	if errors.As(err, &agentErr) && (agentErr.Status == http.StatusNotFound ||
		(agentErr.Status == http.StatusConflict && agentErr.Reason == protocol.ReasonUIDMismatch)) {
		return nil
	}
	return err
}

// newAgentRequest builds a call to an agent: the token, this controller's protocol version,
// and the features the request requires, if any (protocol.RequiresHeader).
func newAgentRequest(ctx context.Context, method string, target AgentTarget, url string, body []byte, requires []string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Close = target.Unpooled
	req.Header.Set("Authorization", "Bearer "+target.Token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(protocol.VersionHeader, strconv.Itoa(protocol.Version))
	if len(requires) > 0 {
		req.Header.Set(protocol.RequiresHeader, strings.Join(requires, ","))
	}
	return req, nil
}

func (c *HTTPAgentClient) do(ctx context.Context, method string, target AgentTarget, url string, body []byte, requires []string, into any) error {
	if c.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.Timeout)
		defer cancel()
	}
	req, err := newAgentRequest(ctx, method, target, url, body, requires)
	if err != nil {
		return err
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return agentErrorFrom(resp.StatusCode, data)
	}
	if into == nil {
		return nil
	}
	return json.Unmarshal(data, into)
}
