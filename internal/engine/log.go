package engine

import (
	"context"
	"log/slog"
)

// The engine logs through the logger its Source and Destination are
// given (their Log; nil: slog's default), never through the global one
// directly: a migration's own code through its migration or incoming, and
// code that only has the migration's context through loggerFrom.

type loggerKey struct{}

// withLogger carries l in ctx, for loggerFrom.
func withLogger(ctx context.Context, l *slog.Logger) context.Context {
	return context.WithValue(ctx, loggerKey{}, l)
}

// loggerFrom is the logger ctx carries, or slog's default.
func loggerFrom(ctx context.Context) *slog.Logger {
	if l, ok := ctx.Value(loggerKey{}).(*slog.Logger); ok && l != nil {
		return l
	}
	return slog.Default()
}

// orDefault is l, or slog's default where l is nil.
func orDefault(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.Default()
	}
	return l
}

// log is the destination's logger.
func (d *Destination) log() *slog.Logger { return orDefault(d.Log) }
