package runc

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/ferry-migrate/ferry/internal/cgroups"
	"github.com/ferry-migrate/ferry/internal/runtime"
)

// Dump is runc checkpoint of container id for a runtime.Runtime's
// Checkpoint (runc's, and the runtimes whose containers runc runs:
// Podman, containerd, Docker): the container, paused before, stays
// paused. A lazy dump returns once CRIU's page server listens and runs on
// until that page server is closed.
func (h Host) Dump(ctx context.Context, id string, o runtime.CheckpointOptions) (runtime.Dump, error) {
	d, err := h.BeginDump(ctx, id, o, "")
	if err != nil {
		return nil, err
	}
	return d.Dump()
}

// Dumping is a runc checkpoint under way.
type Dumping struct {
	lazy   bool
	status *os.File // a lazy dump's readiness, from CRIU
	done   chan struct{}
	err    error
}

// BeginDump starts runc checkpoint; actionScript, if set, is a script
// CRIU runs before it dumps (the runc adapter's dump gate).
func (h Host) BeginDump(ctx context.Context, id string, o runtime.CheckpointOptions, actionScript string) (*Dumping, error) {
	opts := CheckpointOptions{ImagePath: o.ImagesDir, WorkPath: o.WorkDir, ParentPath: o.ParentDir, PageServer: o.PageServer,
		LeaveRunning: !o.PreDump, TCPEstablished: o.TCPEstablished, TCPClose: o.TCPClose, PreDump: o.PreDump, LazyPages: o.Lazy, Netns: o.PageNet,
		NoNetworkLock: o.NetworkQuiet, ActionScript: actionScript, ScriptActions: []string{"pre-dump"},
		SmapsSnapshot: o.SmapsSnapshot, IrmapScanPaths: o.IrmapScanPaths}
	d := &Dumping{lazy: o.Lazy, done: make(chan struct{})}
	if o.Lazy {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		d.status, opts.StatusFD = r, w
	}
	go func() {
		// A lazy dump outlives the caller's context: it ends when its page
		// server is closed, or its caller kills it through ctx.
		d.err = h.Checkpoint(ctx, id, opts)
		close(d.done)
	}()
	return d, nil
}

// Done is closed once runc ended.
func (d *Dumping) Done() <-chan struct{} { return d.done }

// Err is how runc ended, once Done is closed.
func (d *Dumping) Err() error { return d.err }

// Abandon waits for runc to end, for a dump whose images nobody reads.
func (d *Dumping) Abandon() {
	<-d.done
	if d.status != nil {
		d.status.Close()
	}
}

// Dump waits for the dump's images: until runc ended, or for a lazy dump
// until CRIU's page server listens.
func (d *Dumping) Dump() (runtime.Dump, error) {
	if !d.lazy {
		<-d.done
		return doneDump{}, d.err
	}
	defer d.status.Close()
	var b [1]byte
	if n, rerr := d.status.Read(b[:]); n != 1 {
		<-d.done
		return nil, errors.Join(d.err, fmt.Errorf("CRIU never signalled that the lazy page server is ready: %v", rerr))
	}
	return lazyDump{d}, nil
}

// RequirePaused checks that runc knows container id and sees it paused, as
// another runtime's freeze (Podman's, containerd's, Docker's) leaves it: a
// dump then leaves it paused, resumable by that runtime. what names the
// container in errors; hint follows one runc does not know.
func (h Host) RequirePaused(ctx context.Context, id, what, hint string) error {
	st, err := h.State(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return fmt.Errorf("%s is not in runc's root %s%s", what, h.Root, hint)
	}
	if err != nil {
		return err
	}
	if st.Status != "paused" {
		return fmt.Errorf("%s is %s: freeze it before the dump", what, st.Status)
	}
	return nil
}

// doneDump is a dump that had finished when Checkpoint returned.
type doneDump struct{}

func (doneDump) Wait() error                         { return nil }
func (doneDump) Release(context.Context, bool) error { return nil }

// lazyDump is a `runc checkpoint --lazy-pages` whose page server serves.
type lazyDump struct{ d *Dumping }

func (l lazyDump) Wait() error                         { <-l.d.done; return l.d.err }
func (l lazyDump) Release(context.Context, bool) error { return nil }

// ContinueRestored continues container id, which this process restored
// with its init at pid: from its cgroup, without an exec of runc; through
// runc where the cgroup cannot tell (pid 0: not restored here).
func (h Host) ContinueRestored(ctx context.Context, id string, pid int) error {
	if pid > 0 && cgroups.Continue(pid) == nil {
		return nil
	}
	return h.ContinueAll(ctx, id)
}
