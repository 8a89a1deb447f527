package engine

import (
	"context"
	"sync"
)

// CommitGate settles, once, the race between cancelling a migration and
// its commit: whichever comes first wins, and the loser hears so. Without
// it a cancel that came as the commit went out answered "cancelled" for a
// migration that then committed.
type CommitGate struct {
	mu        sync.Mutex
	cancel    context.CancelFunc
	cancelled bool
	committed bool
}

// NewCommitGate makes a gate whose Cancel calls cancel.
func NewCommitGate(cancel context.CancelFunc) *CommitGate {
	return &CommitGate{cancel: cancel}
}

// Cancel cancels the migration unless its commit went first; it says
// whether it did.
func (g *CommitGate) Cancel() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.committed {
		return false
	}
	g.cancelled = true
	g.cancel()
	return true
}

// pass lets the commit go unless the migration was cancelled first.
func (g *CommitGate) pass() bool {
	if g == nil {
		return true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cancelled {
		return false
	}
	g.committed = true
	return true
}

type gateKey struct{}

// WithCommitGate attaches g to the context a migration runs under.
func WithCommitGate(ctx context.Context, g *CommitGate) context.Context {
	return context.WithValue(ctx, gateKey{}, g)
}

func commitGate(ctx context.Context) *CommitGate {
	g, _ := ctx.Value(gateKey{}).(*CommitGate)
	return g
}
