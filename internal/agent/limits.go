package agent

import (
	"sync"
	"time"

	"github.com/ferry-migrate/ferry/internal/transport"
)

// Limits bound what peers, authenticated or not, can hold of an agent.
type Limits struct {
	// MaxPeerSessions is how many sessions peers may hold open at once.
	MaxPeerSessions int
	// MaxIncoming is how many migrations may come in at once.
	MaxIncoming int
	// IdleTimeout closes a peer's session that has had no channel open
	// (no migration, no query) for this long.
	IdleTimeout time.Duration
}

// DefaultLimits suit a host receiving a few migrations at a time.
func DefaultLimits() Limits {
	return Limits{MaxPeerSessions: 32, MaxIncoming: 4, IdleTimeout: time.Minute}
}

// withDefaults fills what l leaves zero.
func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.MaxPeerSessions <= 0 {
		l.MaxPeerSessions = d.MaxPeerSessions
	}
	if l.MaxIncoming <= 0 {
		l.MaxIncoming = d.MaxIncoming
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = d.IdleTimeout
	}
	return l
}

// idleWatch closes a session once no channel has been open on it for a
// while.
type idleWatch struct {
	mu     sync.Mutex
	active int
	timer  *time.Timer
	after  time.Duration
}

func newIdleWatch(sess *transport.Session, after time.Duration) *idleWatch {
	return &idleWatch{after: after, timer: time.AfterFunc(after, func() { sess.Close() })}
}

// busy: a channel opened; the session is not idle until it ends.
func (w *idleWatch) busy() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.active++
	w.timer.Stop()
}

// done: a channel ended; with none left the idle time starts again.
func (w *idleWatch) done() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.active--; w.active == 0 {
		w.timer.Reset(w.after)
	}
}

func (w *idleWatch) stop() { w.timer.Stop() }
