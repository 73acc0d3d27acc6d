package testkit

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/apache/pulsar-client-go/pulsar/log"
)

// ClientLog is a silent pulsar-client-go logger that counts the frames a client dropped
// because none of its consumers had the frame's consumer id ("Got unexpected message").
//
// Why it matters: when the broker closes a consumer (a seek or cursor reset, a topic unload),
// pulsar-client-go v0.21 (and its main branch) first tells the consumer, whose reconnect runs
// on another goroutine, and only then deletes the consumer's handler from the connection
// (internal/connection.go, handleCloseConsumer). A reconnect that registers the consumer on
// the same connection before that deletion loses its handler: the broker then sends it
// messages the client drops without acknowledging, and sends them again only when the
// connection closes. On a loaded machine the reader goroutine can be descheduled for the one
// lookup round trip this takes. A wait for messages that do not come can tell this apart
// from a fault of its own by asking DroppedFrames.
//
// With Trace set, every warning and error the client logs is written there too, as a line of
// text (the chaos run's trace: a consumer the client gave up reconnecting says why).
type ClientLog struct {
	Trace   io.Writer
	dropped atomic.Int64
	mu      sync.Mutex // serialises the lines written to Trace
}

// Logger is what ClientOptions.Logger takes.
func (l *ClientLog) Logger() log.Logger {
	return log.NewLoggerWithSlog(slog.New(clientLogHandler{log: l}))
}

// DroppedFrames is how many MESSAGE frames the client dropped for an unknown consumer id.
func (l *ClientLog) DroppedFrames() int64 { return l.dropped.Load() }

type clientLogHandler struct {
	log   *ClientLog
	attrs []slog.Attr // the logger's fields: topic, subscription, consumer name
}

func (h clientLogHandler) Enabled(_ context.Context, level slog.Level) bool {
	return level >= slog.LevelWarn
}

func (h clientLogHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "Got unexpected message") {
		h.log.dropped.Add(1)
	}
	if h.log.Trace == nil {
		return nil
	}
	var line strings.Builder
	fmt.Fprintf(&line, "%s client %s %s", r.Time.Format("15:04:05.000"), r.Level, r.Message)
	for _, a := range h.attrs {
		fmt.Fprintf(&line, " %s=%v", a.Key, a.Value)
	}
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&line, " %s=%v", a.Key, a.Value)
		return true
	})
	line.WriteByte('\n')
	h.log.mu.Lock()
	defer h.log.mu.Unlock()
	_, err := io.WriteString(h.log.Trace, line.String())
	return err
}

func (h clientLogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	h.attrs = append(slices.Clip(h.attrs), attrs...)
	return h
}

func (h clientLogHandler) WithGroup(string) slog.Handler { return h }
