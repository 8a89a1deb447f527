package runc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	driver "github.com/ferry-migrate/ferry/internal/runc"
	"github.com/ferry-migrate/ferry/internal/runtime"
)

// A restore started before its images are complete (runtime.EarlyTarget).
//
// runc restore does ~30 ms of its own work before CRIU reads an image: its
// start, its mounts, a CRIU started for its version, CRIU's own start, and
// moving CRIU into the container's cgroups. CRIU then reads the
// configuration file runc names (criu.conf, the container's
// org.criu.config annotation), and only then the images. Here that file is
// a FIFO, and CRIU waits on it while the source still dumps.
//
// What CRIU reads first is a line naming an images directory that does
// not exist, so that whatever ends its wait but Go (Cancel, or this
// agent's death: the FIFO's end of file) makes it fail before it restores
// anything. Go writes the real configuration after that line; its
// images-dir overrides it.

// stdioMeta is the Container.Meta key of the container's standard
// descriptors, as runc records them in a dump's descriptors.json: runc
// restore reads that file before it starts CRIU, so it must be there
// before the images.
const stdioMeta = "runc.descriptors"

// descriptorsFile is runc's name for that file in an images directory.
const descriptorsFile = "descriptors.json"

// stdioOf reads what pid's descriptors 0-2 are, as runc does for
// descriptors.json (one it may not read stays empty).
func stdioOf(pid int) ([]byte, error) {
	fds := make([]string, 3)
	for i := range fds {
		target, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "fd", strconv.Itoa(i)))
		if errors.Is(err, os.ErrPermission) {
			continue
		}
		if err != nil {
			return nil, err
		}
		fds[i] = target
	}
	return json.Marshal(fds)
}

// sameStdio says two descriptors.json files name the same descriptors.
func sameStdio(a, b []byte) bool {
	var x, y []string
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && slices.Equal(x, y)
}

// gateReachTimeout bounds the wait for CRIU to open the gate: runc's own
// work before it takes ~30 ms.
const gateReachTimeout = 30 * time.Second

// restoreGate is a runc restore waiting at its CRIU configuration file.
type restoreGate struct {
	t *target
	o runtime.RestoreOptions
	// fifo is the gate's write end, opened read-write so that opening
	// never waited for CRIU; kill ends runc if CRIU never comes to it.
	fifo *os.File
	kill context.CancelFunc
	done chan struct{} // runc restore has exited, with err
	err  error

	mu     sync.Mutex
	closed bool // Go or Cancel closed the gate
}

// StartRestore mounts the root, writes descriptors.json from what the
// source said, puts the gate in place of criu.conf and starts runc
// restore, which waits there.
func (t *target) StartRestore(o runtime.RestoreOptions) (runtime.Restoring, error) {
	if t.stdio == nil {
		return nil, errors.New("the source did not say what the container's standard descriptors are")
	}
	if err := t.mountRoot(); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(o.ImagesDir, descriptorsFile), t.stdio, 0o600); err != nil {
		return nil, err
	}
	fifo, err := openGate(t.criuConf(), t.gateClosed())
	if err != nil {
		return nil, err
	}
	ctx, kill := context.WithCancel(context.Background())
	g := &restoreGate{t: t, o: o, fifo: fifo, kill: kill, done: make(chan struct{})}
	go func() {
		g.err = t.runRestore(ctx, o)
		close(g.done)
	}()
	return g, nil
}

// gateClosed is the images directory CRIU is told of first: it never
// exists.
func (t *target) gateClosed() string { return filepath.Join(t.bundle, "gate-closed") }

// openGate puts a FIFO at path in place of the file there (a rename: the
// path never lacks a file, which would have CRIU restore without one),
// holding its write end, with the line that fails a restore in it.
func openGate(path, never string) (*os.File, error) {
	tmp := path + ".gate"
	_ = os.Remove(tmp)
	if err := unix.Mkfifo(tmp, 0o600); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(tmp, os.O_RDWR, 0)
	if err == nil {
		_, err = f.WriteString(closedLine(never))
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		if f != nil {
			f.Close()
		}
		_ = os.Remove(tmp)
		return nil, err
	}
	return f, nil
}

// closedLine is the gate's first line: it names never, an images
// directory that does not exist, so a CRIU that reads nothing after it
// fails before it restores anything.
func closedLine(never string) string { return "images-dir " + never + "\n" }

// unread is how many bytes written to the FIFO no reader has taken.
func unread(f *os.File) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var ierr error
	if err := rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.TIOCINQ) }); err != nil {
		return 0, err
	}
	return n, ierr
}

// drained waits until a reader has taken everything written to f, or
// runc has exited (done), or timeout passes. Only CRIU reads the FIFO, so
// an empty one means CRIU holds it open: closing the write end then ends
// CRIU's read, where before it would drop what was written and leave CRIU
// waiting for a writer.
func drained(f *os.File, done <-chan struct{}, timeout time.Duration) bool {
	return pollGate(func() (bool, error) {
		n, err := unread(f)
		return n == 0, err
	}, done, timeout)
}

// pollGate polls, every 200 us, whether CRIU has come to a gate (there), a
// few milliseconds' wait at most when all goes well: true once there says
// so, false once it fails, done is closed (runc ended) or timeout passed.
func pollGate(there func() (bool, error), done <-chan struct{}, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := there()
		if err != nil {
			return false
		}
		if ok {
			return true
		}
		select {
		case <-done:
			return false
		default:
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// Go writes the restore's configuration into the gate and waits for the
// restore. It restores anew when runc ended before CRIU came to the gate,
// or when the images' descriptors.json is not the one runc read.
func (g *restoreGate) Go(ctx context.Context) (int, error) {
	received, err := os.ReadFile(filepath.Join(g.o.ImagesDir, descriptorsFile))
	if err != nil || !sameStdio(received, g.t.stdio) {
		g.Cancel()
		return g.t.Restore(ctx, g.o)
	}
	conf := g.t.restoreConfig(g.o)
	conf.ImagesDir = g.o.ImagesDir
	if !driver.ConfigSafe(conf.ImagesDir) {
		g.Cancel()
		return g.t.Restore(ctx, g.o) // which says why
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return 0, errors.New("the early restore was cancelled")
	}
	g.closed = true
	if !drained(g.fifo, g.done, gateReachTimeout) {
		g.shut()
		return g.t.Restore(ctx, g.o)
	}
	_, err = g.fifo.WriteString(conf.String())
	g.fifo.Close()
	if err != nil {
		g.kill()
		<-g.done
		return 0, fmt.Errorf("opening the restore's gate: %w", err)
	}
	// CRIU holds the FIFO and reads it to its end; a later dump of this
	// container reads the file anew, empty.
	_ = driver.ClearCRIUConfig(g.t.criuConf())
	select {
	case <-g.done:
	case <-ctx.Done():
		g.kill()
		<-g.done
	}
	if g.err != nil {
		return 0, g.err
	}
	return g.t.restored()
}

// Cancel closes the gate with nothing but its failing line in it and
// waits for runc restore to end.
func (g *restoreGate) Cancel() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return
	}
	g.closed = true
	g.shut()
}

// shut fails the restore: once CRIU has read the failing line, closing
// the write end ends its read and it fails; runc cleans up after it.
// Where CRIU never came to the gate in time, runc is killed.
func (g *restoreGate) shut() {
	if !drained(g.fifo, g.done, gateReachTimeout) {
		g.kill()
	}
	g.fifo.Close()
	<-g.done
	g.kill()
	_ = driver.LeaveStopped(g.t.criuConf())
}

// failLeftGate fails a restore still waiting at a gate that an agent
// which died left at path: its CRIU reads the failing line (or, still
// opening the FIFO, finds a writer and then reads it), and the path holds
// a plain file again.
func failLeftGate(path, never string) {
	st, err := os.Lstat(path)
	if err != nil || st.Mode()&os.ModeNamedPipe == 0 {
		return
	}
	if f, err := os.OpenFile(path, os.O_RDWR, 0); err == nil {
		if _, err := f.WriteString(closedLine(never)); err == nil {
			drained(f, nil, time.Second)
		}
		f.Close()
	}
	_ = driver.LeaveStopped(path)
}
