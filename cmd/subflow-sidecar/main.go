// Command subflow-sidecar runs the subflow agent as a Pulsar protocol proxy next to an
// application written in any language: the application's service URL points at the
// sidecar (pulsar://localhost:6650), the sidecar talks to the brokers and gates each
// consumer's flow permits and messages (docs/sidecar.md). The controller drives it through
// the same control API as the agent library, on --control-addr.
//
//	subflow-sidecar --broker-url pulsar://pulsar-broker.pulsar:6650
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"

	"github.com/subflow-dev/subflow/agent"
	"github.com/subflow-dev/subflow/agent/control"
	"github.com/subflow-dev/subflow/agent/protocol"
	"github.com/subflow-dev/subflow/agent/sidecar"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "subflow-sidecar:", err)
		os.Exit(1)
	}
}

type config struct {
	opts                 sidecar.Options
	tlsCAFile            string
	controlAddr          string
	tokenFile            string
	tokenGrace           time.Duration
	adminURL             string
	adminCredentialsFile string
	backlogRefresh       time.Duration
	logLevel             string
}

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("subflow-sidecar", flag.ContinueOnError)
	fs.StringVar(&c.opts.BrokerURL, "broker-url", os.Getenv("PULSAR_BROKER_URL"), "the cluster's service URL, pulsar://host:port or pulsar+ssl://host:port (default $PULSAR_BROKER_URL)")
	fs.StringVar(&c.tlsCAFile, "tls-ca-file", "", "PEM file of the CAs that sign the brokers' certificates (pulsar+ssl) and the admin API's (https --admin-url); default the system's roots")
	fs.StringVar(&c.opts.ListenAddr, "listen", sidecar.DefaultListenAddr, "data listener for the application's client; loopback unless --allow-non-loopback")
	fs.BoolVar(&c.opts.AllowNonLoopback, "allow-non-loopback", false, "permit a --listen address that is not loopback (clients talk plaintext to the sidecar)")
	fs.IntVar(&c.opts.MaxFrameSize, "max-frame-size", sidecar.DefaultMaxFrameSize, "largest frame accepted in either direction, in bytes; raise it with the broker's maxMessageSize")
	fs.DurationVar(&c.opts.HandshakeTimeout, "handshake-timeout", sidecar.DefaultHandshakeTimeout, "how long a new connection may take to send CONNECT")
	fs.IntVar(&c.opts.MaxConnections, "max-connections", sidecar.DefaultMaxConnections, "most client connections open at once; one more is closed at once")
	fs.DurationVar(&c.opts.FrameTimeout, "frame-timeout", sidecar.DefaultFrameTimeout, "how long a client may take to send a frame it has begun (idle time between frames is not bounded)")
	fs.Int64Var(&c.opts.FrameMemory, "frame-memory", sidecar.DefaultFrameMemory, "bytes of client frames read at once, beyond the first 64 KiB of each; at least one frame of --max-frame-size")
	fs.DurationVar(&c.opts.DialTimeout, "dial-timeout", sidecar.DefaultDialTimeout, "how long connecting to a broker may take")
	fs.BoolVar(&c.opts.StrictPause, "strict-pause", false, "make a pause take back what the client buffered: the client re-subscribes (docs/sidecar.md)")
	fs.BoolVar(&c.opts.StartGated, "start-gated", false, "start consumers Paused until the controller's first push (or --sync-timeout), so a pod started during a pause consumes nothing")
	fs.DurationVar(&c.opts.SyncTimeout, "sync-timeout", agent.DefaultSyncTimeout, "with --start-gated: how long to wait for the first push before --fallback-state applies")
	fs.Func("fallback-state", "with --start-gated: the state after --sync-timeout without a push, Running (default), Paused or Stopped", func(v string) error {
		if state := protocol.State(v); !state.Valid() {
			return fmt.Errorf("%q: want Running, Paused or Stopped", v)
		}
		c.opts.FallbackState = protocol.State(v)
		return nil
	})
	fs.StringVar(&c.opts.Name, "name", os.Getenv("POD_NAME"), "the name the sidecar reports for itself (default $POD_NAME)")
	fs.StringVar(&c.controlAddr, "control-addr", fmt.Sprintf(":%d", protocol.DefaultPort), "the control API the controller pushes flow rules to (name its container port "+protocol.PortName+")")
	fs.StringVar(&c.tokenFile, "token-file", "/var/run/subflow/token", "the mounted key of Secret subflow-agent-token; read at every request, so it may appear later")
	fs.DurationVar(&c.tokenGrace, "token-grace", control.DefaultPreviousTokenGrace, "how long the token the file held before a rotation is still accepted, from the rotation; 0 turns it off (after a leak)")
	fs.StringVar(&c.adminURL, "admin-url", os.Getenv("PULSAR_ADMIN_URL"), "the Pulsar admin REST root, http(s)://host:port, for backlog reports (default $PULSAR_ADMIN_URL; empty: backlog unknown)")
	fs.StringVar(&c.adminCredentialsFile, "admin-credentials-file", "", "a file holding the Pulsar token presented to the admin API as a bearer token; read at every call, absent means none")
	fs.DurationVar(&c.backlogRefresh, "backlog-refresh", agent.DefaultBacklogRefresh, "how often a backlog the controller asks for is read again through --admin-url")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.opts.BrokerURL == "" {
		return c, errors.New("--broker-url (or $PULSAR_BROKER_URL) is required")
	}
	if c.controlAddr == "" || c.tokenFile == "" {
		return c, errors.New("--control-addr and --token-file are required: the controller drives the sidecar through them")
	}
	if c.tokenGrace < 0 {
		return c, fmt.Errorf("--token-grace %s: want 0 (off) or more", c.tokenGrace)
	}
	if err := c.applyTLSCAFile(); err != nil {
		return c, err
	}
	if c.opts.Name == "" {
		c.opts.Name, _ = os.Hostname()
	}
	return c, nil
}

// applyTLSCAFile gives --tls-ca-file to whichever of the brokers and the admin API speak TLS: a
// namespace's one CA bundle serves both, also when only the admin API is https. A CA file that
// nothing uses is a mistake worth stopping for.
func (c *config) applyTLSCAFile() error {
	if c.tlsCAFile == "" {
		return nil
	}
	brokerTLS, adminTLS := scheme(c.opts.BrokerURL) == "pulsar+ssl", scheme(c.adminURL) == "https"
	if !brokerTLS && !adminTLS {
		return fmt.Errorf("--tls-ca-file %s is given but neither --broker-url is pulsar+ssl:// nor --admin-url https://", c.tlsCAFile)
	}
	if brokerTLS {
		c.opts.TLSCAFile = c.tlsCAFile
	}
	return nil
}

func scheme(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Scheme // lower case
}

// controlOptions are the control server's options from the flags.
func (c config) controlOptions(log logr.Logger) control.Options {
	grace := c.tokenGrace
	if grace == 0 {
		grace = -1 // control.Options reads zero as the default
	}
	return control.Options{TokenFile: c.tokenFile, PreviousTokenGrace: grace, Logger: log.WithName("control")}
}

func newLogger(level string) (logr.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return logr.Logger{}, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	return logr.FromSlogHandler(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}

// run serves until SIGTERM or SIGINT. Then the listeners close and every connection with
// them: applications reconnect to the next sidecar process as after a broker restart, and the
// brokers put back whatever was held for them. The data listener opens first, so that the
// control API's /healthz (the startup probe) answers only once applications can connect.
func run(args []string) error {
	cfg, err := parseFlags(args)
	if err != nil {
		return err
	}
	log, err := newLogger(cfg.logLevel)
	if err != nil {
		return err
	}
	cfg.opts.Logger = log
	s, err := sidecar.New(cfg.opts)
	if err != nil {
		return err
	}
	admin, err := cfg.admin(log)
	if err != nil {
		return err
	}
	defer admin.Close()
	server, err := control.NewForHost(s.ControlHost(admin), cfg.controlOptions(log))
	if err != nil {
		return err
	}
	data, err := net.Listen("tcp", cfg.opts.ListenAddr)
	if err != nil {
		return err
	}
	ctl, err := net.Listen("tcp", cfg.controlAddr)
	if err != nil {
		_ = data.Close()
		return err
	}
	log.Info("Serving the control API", "addr", ctl.Addr().String())

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.Serve(ctx, data) })
	g.Go(func() error { return server.Serve(ctx, ctl) })
	err = g.Wait()
	log.Info("Stopped")
	return err
}

// admin reads backlogs and executes seeks through the admin API at --admin-url, trusting
// --tls-ca-file for an https one.
func (c config) admin(log logr.Logger) (*sidecar.Admin, error) {
	var hc *http.Client
	if c.tlsCAFile != "" && scheme(c.adminURL) == "https" {
		var err error
		if hc, err = httpsClient(c.tlsCAFile); err != nil {
			return nil, fmt.Errorf("--admin-url: %w", err)
		}
	}
	return sidecar.NewAdmin(sidecar.AdminOptions{URL: c.adminURL, HTTPClient: hc,
		Auth: bearerFromFile(c.adminCredentialsFile), BacklogRefresh: c.backlogRefresh, Logger: log.WithName("admin")}), nil
}

// httpsClient verifies servers against the CAs in caFile only, as the brokers are verified
// (sidecar.Options.TLSCAFile); read once, at start.
func httpsClient(caFile string) (*http.Client, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("TLS CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("TLS CA file %s holds no PEM certificate", caFile)
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return &http.Client{Transport: transport}, nil
}

// bearerFromFile presents the token in file to the admin API, read at every call so that a
// rotated Secret applies at once; a missing or empty file sends no credentials.
func bearerFromFile(file string) func(*http.Request) error {
	return func(r *http.Request) error {
		if file == "" {
			return nil
		}
		b, err := os.ReadFile(file)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("admin credentials: %w", err)
		}
		if token := strings.TrimSpace(string(b)); token != "" {
			r.Header.Set("Authorization", "Bearer "+token)
		}
		return nil
	}
}
