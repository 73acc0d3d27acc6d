// Command subflow-sidecar runs the subflow agent as a Pulsar protocol proxy next to an
// application written in any language: the application's service URL points at the
// sidecar (pulsar://localhost:6650), the sidecar talks to the brokers and gates each
// consumer's flow permits and messages (docs/sidecar.md).
//
//	subflow-sidecar --broker-url pulsar://pulsar-broker.pulsar:6650
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"

	"github.com/subflow-dev/subflow/agent/sidecar"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "subflow-sidecar:", err)
		os.Exit(1)
	}
}

type config struct {
	opts     sidecar.Options
	logLevel string
}

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("subflow-sidecar", flag.ContinueOnError)
	fs.StringVar(&c.opts.BrokerURL, "broker-url", os.Getenv("PULSAR_BROKER_URL"), "the cluster's service URL, pulsar://host:port or pulsar+ssl://host:port (default $PULSAR_BROKER_URL)")
	fs.StringVar(&c.opts.TLSCAFile, "tls-ca-file", "", "PEM file of the CAs that sign the brokers' certificates (pulsar+ssl; default the system's roots)")
	fs.StringVar(&c.opts.ListenAddr, "listen", sidecar.DefaultListenAddr, "data listener for the application's client; loopback unless --allow-non-loopback")
	fs.BoolVar(&c.opts.AllowNonLoopback, "allow-non-loopback", false, "permit a --listen address that is not loopback (clients talk plaintext to the sidecar)")
	fs.IntVar(&c.opts.MaxFrameSize, "max-frame-size", sidecar.DefaultMaxFrameSize, "largest frame accepted in either direction, in bytes; raise it with the broker's maxMessageSize")
	fs.DurationVar(&c.opts.HandshakeTimeout, "handshake-timeout", sidecar.DefaultHandshakeTimeout, "how long a new connection may take to send CONNECT")
	fs.DurationVar(&c.opts.DialTimeout, "dial-timeout", sidecar.DefaultDialTimeout, "how long connecting to a broker may take")
	fs.BoolVar(&c.opts.StrictPause, "strict-pause", false, "make a pause take back what the client buffered: the client re-subscribes (docs/sidecar.md)")
	fs.StringVar(&c.opts.Name, "name", os.Getenv("POD_NAME"), "the name the sidecar reports for itself (default $POD_NAME)")
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
	if c.opts.Name == "" {
		c.opts.Name, _ = os.Hostname()
	}
	return c, nil
}

func newLogger(level string) (logr.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return logr.Logger{}, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	return logr.FromSlogHandler(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}

// run serves until SIGTERM or SIGINT. Then the listener closes and every connection with it:
// applications reconnect to the next sidecar process as after a broker restart, and the
// brokers put back whatever was held for them.
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
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	err = s.ListenAndServe(ctx)
	log.Info("Stopped")
	return err
}
