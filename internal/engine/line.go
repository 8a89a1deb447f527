package engine

import (
	"context"
	"slices"
	"sync"

	"github.com/ferry-migrate/ferry/api"
)

// A line is migrations from this host whose memory crosses a few at a
// time (Request.Line: a drain's). Each joins as it starts and, once its
// setup is done (the offer, the live root filesystem sync), waits for its
// turn: so its setup overlaps the memory of those before it, and no more
// than the line's width of memory streams share the link. One whose live
// rounds carry its memory gives its turn away at its commit, or at its
// freeze where the line says so (its last round is small, but its
// switchover then shares the two cores and the link with the next one's
// first round: docs/BENCHMARKS.md, "A drain in line"); the others at their
// end. Lines holds a host's lines; its zero value is ready.
type Lines struct {
	mu sync.Mutex
	m  map[string]*line
}

type line struct {
	width  int
	queued []*ticket // in the order they joined
}

// ticket is one migration's place in a line; nil outside any.
type ticket struct {
	ls    *Lines
	name  string
	turn  chan struct{} // closed once it is this one's turn
	given bool          // turn closed
	gone  sync.Once
	// atFreeze: it gives its turn away at its freeze (LineSpec.Handoff).
	atFreeze bool
}

// LineSpec names a line and how many of its migrations cross at once.
type LineSpec = api.LineSpec

// When a migration in a line gives its turn to the next.
const (
	HandoffCommit = api.HandoffCommit
	HandoffFreeze = api.HandoffFreeze
)

// join puts a migration at the end of its line.
func (ls *Lines) join(spec *LineSpec) *ticket {
	if ls == nil || spec == nil || spec.Name == "" {
		return nil
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.m == nil {
		ls.m = map[string]*line{}
	}
	l := ls.m[spec.Name]
	if l == nil {
		l = &line{width: max(spec.Width, 1)}
		ls.m[spec.Name] = l
	}
	t := &ticket{ls: ls, name: spec.Name, turn: make(chan struct{}), atFreeze: spec.Handoff == HandoffFreeze}
	l.queued = append(l.queued, t)
	l.giveTurns()
	return t
}

// giveTurns lets the first width of the line cross.
func (l *line) giveTurns() {
	for _, t := range l.queued[:min(l.width, len(l.queued))] {
		if !t.given {
			t.given = true
			close(t.turn)
		}
	}
}

// wait returns once it is this migration's turn, or ctx ended.
func (t *ticket) wait(ctx context.Context) error {
	if t == nil {
		return nil
	}
	select {
	case <-t.turn:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// handsOffAtFreeze says its line lets the next cross from its freeze on.
func (t *ticket) handsOffAtFreeze() bool { return t != nil && t.atFreeze }

// ready says it is this migration's turn now; outside a line, always.
func (t *ticket) ready() bool {
	if t == nil {
		return true
	}
	select {
	case <-t.turn:
		return true
	default:
		return false
	}
}

// leave gives the migration's place to the next; again, nothing.
func (t *ticket) leave() {
	if t == nil {
		return
	}
	t.gone.Do(func() {
		ls := t.ls
		ls.mu.Lock()
		defer ls.mu.Unlock()
		l := ls.m[t.name]
		l.queued = slices.DeleteFunc(l.queued, func(q *ticket) bool { return q == t })
		if len(l.queued) == 0 {
			delete(ls.m, t.name)
			return
		}
		l.giveTurns()
	})
}
