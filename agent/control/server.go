// Package control is the agent's HTTP control server: the controller pushes flow rules to it
// (docs/design.md section 4) and it applies them to the agent's consumers, reporting what they did.
package control

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/subflow-dev/subflow/agent"
	"github.com/subflow-dev/subflow/agent/protocol"
)

// DefaultMaxBodyBytes bounds a request body; a flow request is a few hundred bytes.
const DefaultMaxBodyBytes = 64 << 10

// DefaultPreviousTokenGrace is how long the agent still accepts the token its file held before
// it changed. The controller reads the Secret at every push, so only pushes already on their
// way when the kubelet updated the file carry the old token: they take at most the push
// timeout, and two minutes leave room for a slow controller.
const DefaultPreviousTokenGrace = 2 * time.Minute

// DefaultMaxFlows bounds the flow rules an agent holds: a pod matched by this many flows at
// once is far beyond any use, and each rule may hold a request of up to MaxBodyBytes.
const DefaultMaxFlows = 256

// DefaultApplyTimeout bounds how long a push waits for a consumer busy with another
// transition (a seek moving its cursor) before it answers with the states as they are; the
// rules are then applied in the background as soon as the consumer is free.
const DefaultApplyTimeout = 3 * time.Second

// HTTP limits against slow and hostile peers. The controller sends a request of a few hundred
// bytes at once, so a peer that needs seconds for its headers or body is not the controller.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	// writeTimeout covers the handler and the answer: a push may wait DefaultApplyTimeout for a
	// consumer and then for a pause to settle (the gate waits for messages in hand), which is
	// quick but must not be cut short.
	writeTimeout   = 30 * time.Second
	idleTimeout    = 60 * time.Second
	maxHeaderBytes = 16 << 10
)

// Options configure the control server.
type Options struct {
	// Addr to listen on; empty means ":9470".
	Addr string
	// TokenFile holds the bearer token (the mounted Secret key); it is read at every check, so
	// a rotated Secret applies at once.
	TokenFile string
	// Token is a fixed token, used when TokenFile is empty.
	Token string
	// PreviousTokenGrace is how long the token TokenFile held before a change is still
	// accepted, counted from the change (the new file's modification time), not from the
	// first request after it. Zero means DefaultPreviousTokenGrace, negative means not at all
	// (after a leak, for example).
	PreviousTokenGrace time.Duration
	// TLSCertFile and TLSKeyFile enable TLS when both are set. The pair is loaded again when
	// the files change (a renewed Secret), without a restart.
	TLSCertFile, TLSKeyFile string
	// MaxBodyBytes bounds request bodies; zero means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// MaxFlows bounds the flow rules held; zero means DefaultMaxFlows. A push of a new flow
	// beyond it is refused (409 TooManyFlows); updates of the rules held always apply.
	MaxFlows int
	// MaxConnections caps open connections (Serve only); zero means DefaultMaxConnections.
	// When full, the oldest connection that has not authenticated is closed for a new one.
	MaxConnections int
	// SeekTimeout bounds a seek this agent executes; zero means DefaultSeekTimeout.
	SeekTimeout time.Duration
	// ApplyTimeout bounds a push's wait for busy consumers; zero means DefaultApplyTimeout.
	ApplyTimeout time.Duration
	// MetricsRequireToken makes /metrics ask for the bearer token like the control API. Off
	// by default: /metrics exposes counts and names only, and handing the token, which can
	// pause consumption, to every scraper would widen who holds it.
	MetricsRequireToken bool
	// Gatherer serves /metrics; nil means prometheus.DefaultGatherer.
	Gatherer prometheus.Gatherer
	// Logger receives structured logs.
	Logger logr.Logger
}

// Server applies flow rules pushed by the controller to an agent's consumers.
type Server struct {
	host    Host
	opts    Options
	log     logr.Logger
	token   *tokenSource
	rules   *rules
	backlog *backlogWatches
	mux     *http.ServeMux
}

// New returns a control server for the agent a. A token is required: the server changes
// what the application consumes, so it never runs open.
func New(a *agent.Agent, opts Options) (*Server, error) { return NewForHost(AgentHost(a), opts) }

// NewForHost returns a control server for any Host, such as the protocol sidecar.
func NewForHost(h Host, opts Options) (*Server, error) {
	if opts.Token == "" && opts.TokenFile == "" {
		return nil, errors.New("control: a bearer token is required (Options.TokenFile or Options.Token)")
	}
	if opts.Addr == "" {
		opts.Addr = fmt.Sprintf(":%d", protocol.DefaultPort)
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.MaxFlows <= 0 {
		opts.MaxFlows = DefaultMaxFlows
	}
	if opts.MaxConnections <= 0 {
		opts.MaxConnections = DefaultMaxConnections
	}
	if opts.SeekTimeout <= 0 {
		opts.SeekTimeout = DefaultSeekTimeout
	}
	if opts.ApplyTimeout <= 0 {
		opts.ApplyTimeout = DefaultApplyTimeout
	}
	if opts.Gatherer == nil {
		opts.Gatherer = prometheus.DefaultGatherer
	}
	if opts.PreviousTokenGrace == 0 {
		opts.PreviousTokenGrace = DefaultPreviousTokenGrace
	}
	token := &tokenSource{file: opts.TokenFile, fixed: opts.Token, grace: opts.PreviousTokenGrace, now: time.Now}
	s := &Server{host: h, opts: opts, log: opts.Logger, token: token,
		rules: newRules(h, opts.Logger, opts.SeekTimeout, opts.MaxFlows), backlog: newBacklogWatches(h), mux: http.NewServeMux()}
	s.mux.Handle("GET "+protocol.PathPrefix+"/state", s.authenticated(s.getState))
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	var metrics http.Handler = promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{})
	if opts.MetricsRequireToken {
		metrics = s.authenticated(metrics.ServeHTTP)
	}
	s.mux.Handle("GET /metrics", metrics)
	return s, nil
}

// Handler serves the control API. The flow endpoints are routed before the mux, which would
// clean "..", "//" and decoded "%2F" out of the path and redirect instead of refusing. Every
// answer names the agent's protocol version.
func (s *Server) Handler() http.Handler {
	flows := s.authenticated(s.serveFlow)
	version := []string{strconv.Itoa(protocol.Version)}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()[protocol.VersionHeader] = version
		if strings.HasPrefix(r.URL.EscapedPath(), flowsPrefix) {
			flows.ServeHTTP(w, r)
			return
		}
		s.mux.ServeHTTP(w, r)
	})
}

// ListenAndServe serves on Options.Addr until ctx ends.
func (s *Server) ListenAndServe(ctx context.Context) error {
	l, err := net.Listen("tcp", s.opts.Addr)
	if err != nil {
		return err
	}
	return s.Serve(ctx, l)
}

// Serve serves on l until ctx ends, with TLS when configured, and closes l. Slow peers are
// cut off by the timeouts and, when Options.MaxConnections are open, evicted in favour of new
// connections as long as they have not authenticated.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ConnContext:       withConn,
	}
	limited := net.Listener(newLimitListener(l, s.opts.MaxConnections))
	if s.opts.TLSCertFile != "" && s.opts.TLSKeyFile != "" {
		pair, err := newKeyPair(s.opts.TLSCertFile, s.opts.TLSKeyFile, s.log)
		if err != nil {
			_ = l.Close()
			return err
		}
		// HTTP/1.1 only: its timeouts and the connection cap apply per request as set above.
		limited = tls.NewListener(limited, &tls.Config{GetCertificate: pair.GetCertificate,
			MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}})
	}
	// No goroutine waits on ctx: AfterFunc starts the shutdown only if ctx ends while serving.
	stop := context.AfterFunc(ctx, func() {
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	})
	defer stop()
	err := srv.Serve(limited)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// authenticated checks the bearer token before anything else of the request is read, then
// that the agent has the features the request requires. A refused request gets its answer at
// once and its connection is closed, its body unread.
func (s *Server) authenticated(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		got, ok := bearerToken(r.Header.Get("Authorization"))
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="subflow-agent"`)
			refuse(w, http.StatusUnauthorized, protocol.ReasonUnauthorized, "missing or wrong bearer token")
			return
		}
		accepted, err := s.token.accepts(got)
		if err != nil {
			s.log.Error(err, "Reading the control token failed")
			refuse(w, http.StatusInternalServerError, "TokenUnavailable", "the agent cannot read its token file")
			return
		}
		if !accepted {
			w.Header().Set("WWW-Authenticate", `Bearer realm="subflow-agent"`)
			refuse(w, http.StatusUnauthorized, protocol.ReasonUnauthorized, "missing or wrong bearer token")
			return
		}
		trustConn(r.Context())
		if missing := missingFeatures(r.Header); len(missing) > 0 {
			refuseTooOld(w, missing)
			return
		}
		next(w, r)
	}
}

// serveFlow routes PUT and DELETE of one flow after checking its path.
func (s *Server) serveFlow(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPut && r.Method != http.MethodDelete {
		w.Header().Set("Allow", "PUT, DELETE")
		refuse(w, http.StatusMethodNotAllowed, protocol.ReasonBadRequest, "method "+r.Method+" not allowed: want PUT or DELETE")
		return
	}
	namespace, name, err := flowKey(r.URL)
	if err != nil {
		refuse(w, http.StatusBadRequest, protocol.ReasonBadRequest, err.Error())
		return
	}
	if r.Method == http.MethodDelete {
		s.deleteFlow(w, r, namespace+"/"+name)
		return
	}
	if err := jsonContent(r.Header.Get("Content-Type")); err != nil {
		refuse(w, http.StatusUnsupportedMediaType, protocol.ReasonUnsupportedMediaType, err.Error())
		return
	}
	s.putFlow(w, r, namespace, name)
}

// jsonContent accepts "application/json" with parameters (charset) and in any case.
func jsonContent(contentType string) error {
	mediaType, _, err := mime.ParseMediaType(contentType)
	if err != nil || mediaType != "application/json" {
		return fmt.Errorf("content type %q: want application/json", contentType)
	}
	return nil
}

func (s *Server) putFlow(w http.ResponseWriter, r *http.Request, namespace, name string) {
	req, ignored, err := decodeFlowRequest(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes))
	if err != nil {
		writeError(w, http.StatusBadRequest, protocol.Error{Reason: protocol.ReasonBadRequest, Message: err.Error()})
		return
	}
	rl := newRule(namespace, name, req)
	if err := s.rules.put(rl); err != nil {
		writeError(w, http.StatusConflict, conflict(err))
		return
	}
	consumers := s.rules.matched(rl)
	seek := s.rules.takeSeek(rl, consumers)
	s.apply(r.Context(), rl.key)
	// Only now, with the rules applied: lifted first, a start-gated consumer the push pauses
	// would run until its rule reached it, and hand over what its client had buffered.
	s.host.MarkSynced()
	watched := backlogKeys(rl, consumers)
	s.backlog.set(rl.key, watched)
	status := protocol.FlowStatus{
		Pod:             s.host.Name(),
		Kind:            s.host.Kind(),
		ProtocolVersion: protocol.Version,
		AgentVersion:    agentVersion(),
		AppliedRevision: req.Revision,
		IgnoredFields:   ignored,
		Consumers:       statuses(consumers),
		Seek:            s.rules.startSeek(rl, seek, consumers),
		Conflict:        s.rules.conflicts(rl, consumers),
		HeldBy:          s.rules.heldBy(rl, consumers),
		Backlog:         s.backlog.latest(watched),
	}
	if len(consumers) == 0 {
		status.OtherConsumers = otherConsumers(s.host.Consumers())
	}
	controllerProtocol, _ := strconv.Atoi(r.Header.Get(protocol.VersionHeader))
	s.log.V(1).Info("Flow rule applied", "flow", rl.key, "revision", req.Revision, "state", req.State,
		"consumers", len(consumers), "controllerProtocol", controllerProtocol, "ignoredFields", ignored)
	writeJSON(w, http.StatusOK, status)
}

func conflict(err error) protocol.Error {
	var stale *errStale
	var full *errTooManyFlows
	switch {
	case errors.As(err, &stale):
		return protocol.Error{Reason: protocol.ReasonStaleRevision, Message: err.Error(), AppliedRevision: stale.applied}
	case errors.As(err, &full):
		return protocol.Error{Reason: protocol.ReasonTooManyFlows, Message: err.Error()}
	}
	return protocol.Error{Reason: protocol.ReasonStaleUID, Message: err.Error()}
}

// apply brings the consumers to the rules, waiting at most ApplyTimeout for busy ones; what
// it could not finish is applied in the background.
func (s *Server) apply(ctx context.Context, flow string) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.ApplyTimeout)
	defer cancel()
	err := s.rules.applyAll(ctx)
	if err == nil {
		return
	}
	if ctx.Err() != nil {
		s.rules.applyInBackground()
		return
	}
	s.log.Error(err, "Applying flow rules failed", "flow", flow)
}

func (s *Server) deleteFlow(w http.ResponseWriter, r *http.Request, key string) {
	uid := r.URL.Query().Get("uid")
	if uid == "" {
		refuse(w, http.StatusBadRequest, protocol.ReasonBadRequest, "query parameter uid is required: it names the flow whose rule is released")
		return
	}
	found, err := s.rules.remove(key, uid)
	switch {
	case err != nil:
		writeError(w, http.StatusConflict, protocol.Error{Reason: protocol.ReasonUIDMismatch, Message: err.Error()})
		return
	case !found:
		writeError(w, http.StatusNotFound, protocol.Error{Reason: protocol.ReasonNotFound, Message: "no rule for flow " + key})
		return
	}
	s.backlog.set(key, nil)
	s.apply(r.Context(), key)
	s.log.Info("Flow rule released", "flow", key)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) getState(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, protocol.AgentState{
		Pod: s.host.Name(), Kind: s.host.Kind(), ProtocolVersion: protocol.Version, AgentVersion: agentVersion(),
		Flows: s.rules.summary(), Consumers: statuses(s.host.Consumers()),
	})
}

// otherConsumers names the distinct subscriptions and topics of consumers, in order, bounded.
func otherConsumers(consumers []Consumer) []protocol.ConsumerRef {
	var refs []protocol.ConsumerRef
	for _, c := range consumers {
		st := c.Status()
		ref := protocol.ConsumerRef{Subscription: st.Subscription, Topic: st.Topic}
		if !slices.Contains(refs, ref) && len(refs) < protocol.MaxOtherConsumers {
			refs = append(refs, ref)
		}
	}
	return refs
}

func statuses(consumers []Consumer) []protocol.ConsumerStatus {
	out := make([]protocol.ConsumerStatus, 0, len(consumers))
	for _, c := range consumers {
		out = append(out, c.Status())
	}
	return out
}

func writeJSON(w http.ResponseWriter, code int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}

func writeError(w http.ResponseWriter, code int, e protocol.Error) {
	e.ProtocolVersion = protocol.Version
	writeJSON(w, code, e)
}

// refuse answers a request whose body is not going to be read, and closes the connection
// without reading the body: net/http would otherwise read up to 256 KiB of it, before or
// after the answer, at whatever pace the peer sends.
func refuse(w http.ResponseWriter, code int, reason, message string) {
	refuseWith(w, code, protocol.Error{Reason: reason, Message: message})
}

func refuseWith(w http.ResponseWriter, code int, e protocol.Error) {
	w.Header().Set("Connection", "close")
	// Ends the read that net/http makes after the handler; an error just means the request
	// did not come through a server (tests calling the handler directly).
	_ = http.NewResponseController(w).SetReadDeadline(time.Now())
	writeError(w, code, e)
}
