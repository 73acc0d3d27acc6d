package testkit

import (
	"context"
	"io"
	"log/slog"
	"strings"
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
// With Trace set, every warning and error the client logs is written there too, as slog text
// (the chaos run's trace: a consumer the client gave up reconnecting says why).
type ClientLog struct {
	Trace   io.Writer
	dropped atomic.Int64
}

// Logger is what ClientOptions.Logger takes.
func (l *ClientLog) Logger() log.Logger {
	var next slog.Handler = slog.DiscardHandler
	if l.Trace != nil {
		next = slog.NewTextHandler(l.Trace, &slog.HandlerOptions{Level: slog.LevelWarn}).WithAttrs([]slog.Attr{slog.String("from", "client")})
	}
	return log.NewLoggerWithSlog(slog.New(clientLogHandler{log: l, next: next}))
}

// DroppedFrames is how many MESSAGE frames the client dropped for an unknown consumer id.
func (l *ClientLog) DroppedFrames() int64 { return l.dropped.Load() }

// clientLogHandler counts the dropped frames and hands every warning and error on to next.
type clientLogHandler struct {
	log  *ClientLog
	next slog.Handler
}

func (h clientLogHandler) Enabled(_ context.Context, level slog.Level) bool {
	return level >= slog.LevelWarn
}

func (h clientLogHandler) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "Got unexpected message") {
		h.log.dropped.Add(1)
	}
	return h.next.Handle(ctx, r)
}

func (h clientLogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	h.next = h.next.WithAttrs(attrs)
	return h
}

func (h clientLogHandler) WithGroup(name string) slog.Handler {
	h.next = h.next.WithGroup(name)
	return h
}
