package criu

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/tail"
	"golang.org/x/sys/unix"
)

// The CRIU processes ferry starts itself, where no runtime has a verb for
// them: the destination's page server and the lazy-pages daemon of a
// post-copy restore, each fed through a socketpair, so that no CRIU port
// is ever open there.

// PageServer runs `criu page-server` writing pages into imagesDir, on one
// end of a socketpair, while feed drives the other end. It returns once
// feed is done and CRIU has exited.
func PageServer(ctx context.Context, imagesDir, workDir string, feed func(*net.UnixConn) error) error {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	criuEnd := os.NewFile(uintptr(fds[0]), "criu-ps")
	ourEnd := os.NewFile(uintptr(fds[1]), "ferry-ps")
	defer ourEnd.Close()
	conn, err := net.FileConn(ourEnd)
	if err != nil {
		criuEnd.Close()
		return err
	}
	defer conn.Close()
	const logName = "page-server.log"
	cmd := exec.CommandContext(ctx, bin(), "page-server", "--images-dir", imagesDir,
		"--work-dir", workDir, "--ps-socket", "3", "-o", logName, "-v2")
	cmd.ExtraFiles = []*os.File{criuEnd}
	if err := cmd.Start(); err != nil {
		criuEnd.Close()
		return fmt.Errorf("start criu page-server: %w", err)
	}
	criuEnd.Close()
	serr := feed(conn.(*net.UnixConn))
	if serr != nil {
		// CRIU may wait for more of a stream that broke: it must not
		// outlive the migration.
		conn.Close()
	}
	if werr := cmd.Wait(); werr != nil {
		return errors.Join(serr, fmt.Errorf("criu page-server: %v: %s", werr, tail.File(filepath.Join(workDir, logName), 3)))
	}
	return serr
}

// LazyPages is a running `criu lazy-pages` daemon: it serves a lazy
// restore's page faults and pushes the rest, fetching pages through a
// socketpair whose other end the caller serves.
type LazyPages struct {
	pid     int
	kill    func() error
	logPath string
	started time.Time
	exited  chan error
	// Copies of the daemon's userfaultfds (HoldFaults), none once released.
	mu       sync.Mutex
	held     []*os.File
	released bool
}

// DaemonConn is the caller's end of a lazy-pages daemon's page-server
// socketpair. The daemon holds a copy of it (see StartLazyPages), so Close
// shuts the connection down for every holder before it lets go.
type DaemonConn struct{ *net.UnixConn }

// Close ends the connection: the daemon reads end-of-stream.
func (c DaemonConn) Close() error {
	_ = c.CloseRead()
	_ = c.CloseWrite()
	return c.UnixConn.Close()
}

// LazyPagesLink is the socketpair a lazy-pages daemon fetches its pages
// through. It is made before the daemon, which needs the images, so that
// what will serve it (a relay: a process to exec) can start while the
// images are still on their way.
type LazyPagesLink struct {
	daemonEnd, ourEnd *os.File
	// Conn is the page server's end: the caller answers the daemon's page
	// requests there.
	Conn DaemonConn
}

// NewLazyPagesLink makes the socketpair.
func NewLazyPagesLink() (*LazyPagesLink, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	l := &LazyPagesLink{daemonEnd: os.NewFile(uintptr(fds[0]), "criu-lazy-ps"), ourEnd: os.NewFile(uintptr(fds[1]), "ferry-lazy-ps")}
	fc, err := net.FileConn(l.ourEnd) // a descriptor of its own
	if err != nil {
		l.closeEnds()
		return nil, err
	}
	l.Conn = DaemonConn{fc.(*net.UnixConn)}
	return l, nil
}

// Close drops a link no daemon was started on: whoever holds its
// connection reads end-of-stream.
func (l *LazyPagesLink) Close() {
	l.closeEnds()
	l.Conn.Close()
}

func (l *LazyPagesLink) closeEnds() {
	l.daemonEnd.Close()
	l.ourEnd.Close()
}

// StartLazyPages starts the daemon for the images in imagesDir on link and
// returns at once (Listening waits until a restore can connect). No port
// is open: nothing else can ask for pages or answer them. The daemon also holds a copy of the caller's end, so that
// the caller dying is not its page server closing: a daemon that saw that
// would exit, and the kernel would fill the restored process's missing
// pages with zeros; this one waits, the faults blocked, until someone
// stops it.
//
// servedHere says the caller answers from pages held on this host (or on
// their way to it), not from the source across the link: ferry's CRIU then
// keeps its background requests large through faults and goes on after
// each fault (CRIU_LAZY_PAGES_LOCAL, scripts/criu-patches/0004); another
// CRIU ignores it.
func StartLazyPages(link *LazyPagesLink, imagesDir, workDir string, servedHere bool) (*LazyPages, error) {
	defer link.closeEnds() // the daemon has its copies
	cmd := lazyPagesCmd(imagesDir, workDir, "--page-server", "--ps-socket", "3")
	// fd 3 is the daemon's end; fd 4, ours, only held.
	cmd.ExtraFiles = []*os.File{link.daemonEnd, link.ourEnd}
	if servedHere {
		cmd.Env = append(os.Environ(), "CRIU_LAZY_PAGES_LOCAL=1")
	}
	lp, err := startLazyPages(cmd, workDir)
	if err != nil {
		link.Conn.Close()
	}
	return lp, err
}

// StartLocalLazyPages starts a lazy-pages daemon that reads the pages from
// the images in imagesDir (filled for a lazy restore: images.FillForLazyRestore)
// instead of asking a page server, and returns at once (Listening waits
// until a restore can connect). Pre-copy restores so: the restore maps
// the memory without copying it, and the daemon copies it in after the
// copy already runs. Nothing outside this host is asked for anything.
func StartLocalLazyPages(imagesDir, workDir string) (*LazyPages, error) {
	return startLazyPages(lazyPagesCmd(imagesDir, workDir), workDir)
}

// The lazy-pages daemon's log and socket, in its work directory.
const (
	lazyPagesLog    = "lazy-pages.log"
	lazyPagesSocket = "lazy-pages.socket"
)

// lazyPagesCmd is `criu lazy-pages` for the images in imagesDir, logging
// in workDir, with extra options.
func lazyPagesCmd(imagesDir, workDir string, extra ...string) *exec.Cmd {
	args := append([]string{"lazy-pages"}, extra...)
	return exec.Command(bin(), append(args, "--images-dir", imagesDir, "--work-dir", workDir, "-o", lazyPagesLog, "-v4")...)
}

// startLazyPages starts cmd and keeps the daemon's exit for Wait.
func startLazyPages(cmd *exec.Cmd, workDir string) (*LazyPages, error) {
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start criu lazy-pages: %w", err)
	}
	lp := &LazyPages{logPath: filepath.Join(workDir, lazyPagesLog), exited: make(chan error, 1),
		started: time.Now(), pid: cmd.Process.Pid, kill: cmd.Process.Kill}
	go func() { lp.exited <- cmd.Wait() }()
	return lp, nil
}

// Listening returns once the daemon's socket exists, so that a restore can
// connect (the caller starts what else it needs meanwhile: the daemon
// takes a few milliseconds). A daemon that exits or does not listen in 10
// s is an error; the caller stops it.
func (lp *LazyPages) Listening() error {
	sock := filepath.Join(filepath.Dir(lp.logPath), lazyPagesSocket)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			return nil
		}
		select {
		case err := <-lp.exited:
			lp.exited <- err
			return fmt.Errorf("criu lazy-pages exited early: %v: %s", err, tail.File(lp.logPath, 3))
		default:
		}
		if time.Now().After(deadline) {
			return errors.New("criu lazy-pages did not start in 10 s")
		}
	}
}

// HoldFaults takes a copy of each userfaultfd the daemon holds (the
// restored processes' missing memory). If the daemon dies, the kernel
// would fill every page it had not yet copied with zeros once no one held
// them, and the processes would run on memory that was never theirs;
// while a copy is held here, their faults wait instead. Call it once the
// daemon has all of them (it has when it first asks for pages), again
// whenever it may have more (a restored process that forks hands it the
// child's userfaultfd, UFFD_EVENT_FORK), and ReleaseFaults once the
// daemon has copied every page, or after the processes were frozen for
// good. Each call's copies replace the last call's, so a process that
// forks often costs no more descriptors here than the daemon holds; if
// the daemon is gone, the last copies stay. Returns how many it holds.
func (lp *LazyPages) HoldFaults() (int, error) {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	if lp.released {
		return 0, nil
	}
	held, err := copyUserfaultfds(lp.pid)
	if err != nil {
		for _, f := range held {
			f.Close()
		}
		return len(lp.held), err
	}
	for _, f := range lp.held {
		f.Close()
	}
	lp.held = held
	return len(held), nil
}

// copyUserfaultfds copies every userfaultfd process pid holds into this
// process.
func copyUserfaultfds(pid int) ([]*os.File, error) {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd of criu lazy-pages: %w", err)
	}
	defer unix.Close(pidfd)
	files := procs.OpenFiles(pid)
	if files == nil {
		return nil, fmt.Errorf("criu lazy-pages (pid %d) is gone", pid)
	}
	var held []*os.File
	for n, l := range files {
		if l != userfaultfdLink {
			continue
		}
		fd, err := unix.PidfdGetfd(pidfd, n, 0)
		if err != nil {
			return held, fmt.Errorf("copy userfaultfd %d of criu lazy-pages: %w", n, err)
		}
		held = append(held, os.NewFile(uintptr(fd), "userfaultfd"))
	}
	return held, nil
}

// userfaultfdLink is what /proc/PID/fd shows for a userfaultfd.
const userfaultfdLink = "anon_inode:[userfaultfd]"

// ReleaseFaults closes the copies HoldFaults took.
func (lp *LazyPages) ReleaseFaults() {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	lp.released = true
	for _, f := range lp.held {
		f.Close()
	}
	lp.held = nil
}

// LazyResult is what a lazy-pages daemon did.
type LazyResult struct {
	Elapsed         time.Duration // from its start until it exited
	Faulted, Pushed uint64        // pages served on a fault, pushed in the background
	Err             error
}

// Wait returns once the daemon has transferred every page or failed.
func (lp *LazyPages) Wait() LazyResult {
	err := <-lp.exited
	lp.exited <- err
	r := LazyResult{Elapsed: time.Since(lp.started)}
	r.Faulted, r.Pushed = LazyCounts(lp.logPath)
	if err != nil {
		r.Err = fmt.Errorf("criu lazy-pages: %v: %s", err, tail.File(lp.logPath, 3))
	}
	return r
}

// Stop kills the daemon if it still runs.
func (lp *LazyPages) Stop() {
	select {
	case err := <-lp.exited:
		lp.exited <- err
	default:
		_ = lp.kill()
		lp.exited <- <-lp.exited
	}
}

// LogPath is the daemon's log.
func (lp *LazyPages) LogPath() string { return lp.logPath }

// Pid is the daemon's process ID.
func (lp *LazyPages) Pid() int { return lp.pid }

// AttachLazyPages takes over a daemon an earlier process started for the
// images worked on in workDir (an agent that died mid-pull): it can then
// hold, wait for and stop it as its starter could. Its exit status is not
// this process's to read: Wait's Err stays nil, and the caller judges the
// pull by whether the daemon asked to close (every page in).
func AttachLazyPages(pid int, workDir string) (*LazyPages, error) {
	cmdline, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if !strings.Contains(string(cmdline), "lazy-pages") || !usesDir(pid, filepath.Clean(workDir)) {
		return nil, fmt.Errorf("no criu lazy-pages of %s runs as pid %d", workDir, pid)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd of criu lazy-pages: %w", err)
	}
	lp := &LazyPages{pid: pid, logPath: filepath.Join(workDir, lazyPagesLog), started: time.Now(), exited: make(chan error, 1)}
	var mu sync.Mutex // pidfd is closed once the daemon exited: never signal a reused number
	lp.kill = func() error {
		mu.Lock()
		defer mu.Unlock()
		if pidfd < 0 {
			return nil
		}
		return unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
	}
	go func() {
		// A pidfd reads as ready once its process has exited.
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); err != unix.EINTR {
				break
			}
		}
		mu.Lock()
		unix.Close(pidfd)
		pidfd = -1
		mu.Unlock()
		lp.exited <- nil
	}()
	return lp, nil
}

var transferredRE = regexp.MustCompile(`UFFD transferred pages: \((\d+)/(\d+)\)`)

// LazyCounts reads from a lazy-pages daemon's log how many pages it served
// on a fault and how many more it copied.
func LazyCounts(logPath string) (faulted, pushed uint64) {
	f, err := os.Open(logPath)
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	var copied uint64
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, "#PF at") {
			faulted++
		} else if m := transferredRE.FindStringSubmatch(line); m != nil {
			n, _ := strconv.ParseUint(m[1], 10, 64)
			copied += n
		}
	}
	if copied > faulted {
		pushed = copied - faulted
	}
	return faulted, pushed
}

// LazyPagesFinished says whether the log of the lazy-pages daemon that
// worked in workDir shows it done: a summary for every task the restore
// handed it (and for those they forked), and no error; if not, why is what
// the log says went wrong, "" when it says nothing. A daemon killed before
// it finished writes neither its last summaries nor an error; only its log
// is left to ask when it was not this process's child.
func LazyPagesFinished(workDir string) (done bool, why string) {
	path := filepath.Join(workDir, lazyPagesLog)
	b, err := os.ReadFile(path)
	if err != nil {
		return false, ""
	}
	if why := logErrors(path, b); why != "" {
		return false, why
	}
	received := strings.Count(string(b), "uffd: Received PID:")
	return received > 0 && len(transferredRE.FindAllIndex(b, -1)) >= received, ""
}

// LogErrors quotes what a CRIU log says went wrong, for an error
// message: its error lines, lines saying it "Can't" do something (a page
// server it cannot reach is not logged as an error), and the two lines
// before its "FAILED", where it often says why without calling it an
// error. "" when the log is missing or says nothing.
func LogErrors(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return logErrors(path, b)
}

// logErrors is LogErrors for the log at path, read already into b.
func logErrors(path string, b []byte) string {
	lines := strings.Split(string(b), "\n")
	var errs []string
	for i, l := range lines {
		// CRIU cannot raise RLIMIT_NOFILE above the hard limit here and
		// says so as an error on every run: never the cause.
		if strings.Contains(l, "Can't setup RLIMIT_NOFILE") {
			continue
		}
		if strings.Contains(l, "FAILED") {
			for _, before := range lines[max(0, i-2):i] {
				if !isCRIUError(before) {
					errs = append(errs, strings.TrimSpace(before))
				}
			}
		}
		if isCRIUError(l) {
			errs = append(errs, strings.TrimSpace(l))
		}
	}
	if len(errs) == 0 {
		return ""
	}
	return "\nCRIU " + filepath.Base(path) + ": " + tail.Lines(strings.Join(errs, "\n"), 5)
}

func isCRIUError(l string) bool {
	return strings.Contains(l, "Error") || strings.Contains(l, "BUG") ||
		(strings.Contains(l, "Can't ") && !strings.Contains(l, "Can't setup RLIMIT_NOFILE"))
}
