// Package control is the agent's HTTP control server: the controller pushes flow rules to it
// (DESIGN.md section 4) and it applies them to the agent's consumers, reporting what they did.
package control

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
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

// Options configure the control server.
type Options struct {
	// Addr to listen on; empty means ":9470".
	Addr string
	// TokenFile holds the bearer token (the mounted Secret key); it is re-read when it changes.
	TokenFile string
	// Token is a fixed token, used when TokenFile is empty.
	Token string
	// TLSCertFile and TLSKeyFile enable TLS when both are set.
	TLSCertFile, TLSKeyFile string
	// MaxBodyBytes bounds request bodies; zero means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Gatherer serves /metrics; nil means prometheus.DefaultGatherer.
	Gatherer prometheus.Gatherer
	// Logger receives structured logs.
	Logger logr.Logger
}

// Server applies flow rules pushed by the controller to an agent's consumers.
type Server struct {
	agent *agent.Agent
	opts  Options
	log   logr.Logger
	token *tokenSource
	rules *rules
	mux   *http.ServeMux
}

// New returns a control server for a. A token is required: the server changes what the
// application consumes, so it never runs open.
func New(a *agent.Agent, opts Options) (*Server, error) {
	if opts.Token == "" && opts.TokenFile == "" {
		return nil, errors.New("control: a bearer token is required (Options.TokenFile or Options.Token)")
	}
	if opts.Addr == "" {
		opts.Addr = fmt.Sprintf(":%d", protocol.DefaultPort)
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.Gatherer == nil {
		opts.Gatherer = prometheus.DefaultGatherer
	}
	s := &Server{agent: a, opts: opts, log: opts.Logger, token: &tokenSource{file: opts.TokenFile, fixed: opts.Token},
		rules: newRules(a), mux: http.NewServeMux()}
	s.mux.Handle("PUT "+protocol.PathPrefix+"/flows/{namespace}/{name}", s.authenticated(s.putFlow))
	s.mux.Handle("DELETE "+protocol.PathPrefix+"/flows/{namespace}/{name}", s.authenticated(s.deleteFlow))
	s.mux.Handle("GET "+protocol.PathPrefix+"/state", s.authenticated(s.getState))
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{}))
	return s, nil
}

// Handler serves the control API.
func (s *Server) Handler() http.Handler { return s.mux }

// ListenAndServe serves on Options.Addr until ctx ends.
func (s *Server) ListenAndServe(ctx context.Context) error {
	l, err := net.Listen("tcp", s.opts.Addr)
	if err != nil {
		return err
	}
	return s.Serve(ctx, l)
}

// Serve serves on l until ctx ends, with TLS when configured.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	srv := &http.Server{Handler: s.mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	go func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	var err error
	if s.opts.TLSCertFile != "" && s.opts.TLSKeyFile != "" {
		err = srv.ServeTLS(l, s.opts.TLSCertFile, s.opts.TLSKeyFile)
	} else {
		err = srv.Serve(l)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func (s *Server) authenticated(next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		want, err := s.token.current()
		if err != nil {
			s.log.Error(err, "Reading the control token failed")
			writeError(w, http.StatusInternalServerError, "TokenUnavailable", "the agent cannot read its token file")
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="subflow-agent"`)
			writeError(w, http.StatusUnauthorized, "Unauthorized", "missing or wrong bearer token")
			return
		}
		next(w, r)
	})
}

func (s *Server) putFlow(w http.ResponseWriter, r *http.Request) {
	req, err := decodeFlowRequest(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes))
	if err != nil {
		writeError(w, http.StatusBadRequest, "BadRequest", err.Error())
		return
	}
	rl := newRule(r.PathValue("namespace"), r.PathValue("name"), req)
	if err := s.rules.put(rl); err != nil {
		writeError(w, http.StatusConflict, "StaleRevision", err.Error())
		return
	}
	s.agent.MarkSynced()
	if err := s.rules.applyAll(r.Context()); err != nil {
		s.log.Error(err, "Applying flow rule failed", "flow", rl.key, "revision", req.Revision)
	}
	consumers := s.rules.matched(rl)
	status := protocol.FlowStatus{
		Pod:             s.agent.Name(),
		AppliedRevision: req.Revision,
		Consumers:       statuses(consumers),
		Seek:            s.rules.seek(r.Context(), rl, consumers),
		Conflict:        s.rules.conflicts(rl, consumers),
	}
	s.log.V(1).Info("Flow rule applied", "flow", rl.key, "revision", req.Revision, "state", req.State, "consumers", len(consumers))
	writeJSON(w, http.StatusOK, status)
}

func (s *Server) deleteFlow(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("namespace") + "/" + r.PathValue("name")
	found, err := s.rules.remove(key, r.URL.Query().Get("uid"))
	switch {
	case err != nil:
		writeError(w, http.StatusConflict, "UIDMismatch", err.Error())
		return
	case !found:
		writeError(w, http.StatusNotFound, "NotFound", "no rule for flow "+key)
		return
	}
	if err := s.rules.applyAll(r.Context()); err != nil {
		s.log.Error(err, "Releasing flow rule failed", "flow", key)
	}
	s.log.Info("Flow rule released", "flow", key)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) getState(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, protocol.AgentState{
		Pod: s.agent.Name(), Flows: s.rules.summary(), Consumers: statuses(s.agent.Consumers()),
	})
}

func statuses(consumers []*agent.Consumer) []protocol.ConsumerStatus {
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

func writeError(w http.ResponseWriter, code int, reason, message string) {
	writeJSON(w, code, protocol.Error{Reason: reason, Message: message})
}
