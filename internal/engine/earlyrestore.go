package engine

import (
	"sync"

	"github.com/ferry-migrate/ferry/internal/runtime"
)

// earlyRestore is the destination's restore begun as soon as the root
// filesystem is final, where the runtime can begin one before the images
// (runtime.EarlyTarget): the runtime's own ~30 ms of work before CRIU reads
// an image then runs while the source dumps, not in the downtime. It
// restores nothing until the restore's turn comes (restore), after the
// journal says a copy may be here; a migration that ends first cancels it
// (cleanup).
type earlyRestore struct {
	mu sync.Mutex
	r  runtime.Restoring
	o  runtime.RestoreOptions // what it was begun with
}

// restoreOptions are what this migration's restore asks of the runtime.
func (in *incoming) restoreOptions(lazy bool) runtime.RestoreOptions {
	return runtime.RestoreOptions{ImagesDir: in.images, WorkDir: in.work, Lazy: lazy, TCPEstablished: in.offer.Network != nil || !runtime.HostLocal(in.offer.Networks) && len(in.offer.Networks) > 0,
		TCPClose: runtime.HostLocal(in.offer.Networks)}
}

// beginRestore begins the restore early where the runtime can; where it
// cannot, or fails to, the restore runs whole at its turn.
func (in *incoming) beginRestore() {
	et, ok := in.target.(runtime.EarlyTarget)
	if !ok {
		return
	}
	o := in.restoreOptions(in.tech.lazy || in.restoresFromOwnImages())
	r, err := et.StartRestore(o)
	if err != nil {
		in.d.log().Info("restore not begun before the images", "migration", in.offer.ID, "container", in.offer.Container, "why", err)
		return
	}
	in.early.mu.Lock()
	in.early.r, in.early.o = r, o
	in.early.mu.Unlock()
}

// take returns the restore begun early, if it was begun with o, and
// cancels one that was not.
func (e *earlyRestore) take(o runtime.RestoreOptions) runtime.Restoring {
	e.mu.Lock()
	r, same := e.r, e.o == o
	e.r = nil
	e.mu.Unlock()
	if r != nil && !same {
		r.Cancel()
		return nil
	}
	return r
}

// cancel ends a restore begun early and never taken.
func (e *earlyRestore) cancel() {
	e.mu.Lock()
	r := e.r
	e.r = nil
	e.mu.Unlock()
	if r != nil {
		r.Cancel()
	}
}
