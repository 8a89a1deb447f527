package runc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	driver "github.com/ferry-migrate/ferry/internal/runc"
	"github.com/ferry-migrate/ferry/internal/runtime"
)

// A dump begun before the freeze (runtime.EarlyCheckpointer).
//
// runc checkpoint does ~14 ms of its own work before CRIU looks at the
// container: its start, and CRIU started twice for its version and its
// features. CRIU then runs its pre-dump action scripts, before it freezes
// or seizes anything. Here that script waits for ferry's word: the dump
// begins while the container runs, and waits there until it is frozen.
//
// The word is a file this process holds locked (flock) while the gate is
// shut; the script waits for a shared lock, then reads the word. Whatever
// ends the lock but Go (Cancel, this agent's death) leaves the word
// "wait", and CRIU gives up before it touched the container.

// dumpGateScript is the action script, run at pre-dump only by ferry's
// CRIU (ScriptActions); a stock CRIU runs it at every action, which then
// passes at once (a shell's start, 1-4 ms of the frozen dump each).
// reached tells ferry CRIU is at the gate.
const dumpGateScript = `#!/bin/sh
# ferry's dump gate (internal/runtime/runc/dumpgate.go): CRIU runs this
# before it dumps (a CRIU without ferry's patch 0013 at every action too),
# and there it waits for ferry's word.
[ "$CRTOOLS_SCRIPT_ACTION" = pre-dump ] || exit 0
: > '%[1]s.reached'
exec 3< '%[1]s.word'
flock -s 3 || exit 1
read -r word <&3
[ "$word" = go ]
`

// dumpGate is a gate in a dump's work directory.
type dumpGate struct {
	path string   // the script; its word and its reached mark beside it
	word *os.File // locked exclusively while the gate is shut
}

// openDumpGate writes the script and its word ("wait"), locked.
func openDumpGate(dir string) (*dumpGate, error) {
	if _, err := exec.LookPath("flock"); err != nil {
		return nil, errors.New("no flock(1) here (util-linux)")
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return nil, err
	}
	if st.Flags&unix.ST_NOEXEC != 0 {
		return nil, fmt.Errorf("%s is mounted noexec: CRIU could not run a script there", dir)
	}
	g := &dumpGate{path: filepath.Join(dir, "dump-gate")}
	if !driver.ConfigSafe(g.path) {
		return nil, fmt.Errorf("CRIU's configuration cannot name %q", g.path)
	}
	_ = os.Remove(g.path + ".reached")
	f, err := os.OpenFile(g.path+".word", os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.WriteString("wait\n"); err != nil {
		f.Close()
		return nil, err
	}
	if err := os.WriteFile(g.path, fmt.Appendf(nil, dumpGateScript, g.path), 0o700); err != nil {
		f.Close()
		return nil, err
	}
	g.word = f
	return g, nil
}

// reached waits until CRIU's script is at the gate, or done is closed
// (runc ended) or timeout passed.
func (g *dumpGate) reached(done <-chan struct{}, timeout time.Duration) bool {
	return pollGate(func() (bool, error) {
		_, err := os.Stat(g.path + ".reached")
		return err == nil, nil
	}, done, timeout)
}

// open lets the script through with word: "go" lets CRIU dump, anything
// else makes it give up.
func (g *dumpGate) open(word string) error {
	// Emptied first: a word half written reads as none, never as "go".
	err := g.word.Truncate(0)
	if err == nil {
		_, err = g.word.WriteAt([]byte(word+"\n"), 0)
	}
	if cerr := g.word.Close(); err == nil { // the lock goes with it
		err = cerr
	}
	return err
}

// earlyDump is a runc checkpoint waiting at its dump gate.
type earlyDump struct {
	gate *dumpGate
	d    *driver.Dumping
	once sync.Once
}

// dumpGateTimeout bounds the wait for CRIU to come to the gate: runc's
// own work before it takes ~14 ms.
const dumpGateTimeout = 10 * time.Second

var _ runtime.EarlyCheckpointer = (*Runtime)(nil)

// StartCheckpoint begins runc checkpoint of the container and returns
// once CRIU waits at the gate, before it touched the container. Where it
// cannot (a work directory a script cannot run from, a runc or CRIU that
// ended first), it returns an error with nothing begun: the caller dumps
// as usual.
func (r *Runtime) StartCheckpoint(ctx context.Context, c *runtime.Container, o runtime.CheckpointOptions) (runtime.Checkpointing, error) {
	if o.WorkDir == "" || o.PreDump {
		return nil, errors.New("only a dump with a work directory waits at a gate")
	}
	gate, err := openDumpGate(o.WorkDir)
	if err != nil {
		return nil, err
	}
	d, err := r.BeginDump(ctx, c.ID, o, gate.path)
	if err != nil {
		gate.open("no")
		return nil, err
	}
	e := &earlyDump{gate: gate, d: d}
	if !gate.reached(d.Done(), dumpGateTimeout) {
		e.Cancel()
		if d.Err() != nil {
			return nil, fmt.Errorf("the dump ended before its gate: %w", d.Err())
		}
		return nil, errors.New("CRIU did not come to the dump's gate in time")
	}
	return e, nil
}

// Go lets CRIU dump the container, frozen now.
func (e *earlyDump) Go() (runtime.Dump, error) {
	var err error
	e.once.Do(func() { err = e.gate.open("go") })
	if err != nil {
		// The word is not "go": CRIU gives up.
		<-e.d.Done()
		return nil, fmt.Errorf("opening the dump's gate: %w", err)
	}
	return e.d.Dump()
}

// Cancel makes CRIU give up at the gate and waits for runc to end.
func (e *earlyDump) Cancel() {
	e.once.Do(func() {
		_ = e.gate.open("no")
		e.d.Abandon()
	})
}
