package engine

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/procs/procstest"
)

// CRIU's lazy-pages daemon, played by this test binary: the fake criu
// script (source_test.go) execs it for `criu lazy-pages`, with the
// descriptors criu.StartLazyPages hands the daemon (3: its end of the
// page-server socketpair, 4: a held copy of the agent's end). A Go
// program, not bash: it speaks the binary page-server protocol.

const (
	// lazyDaemonEnv names the test binary the fake criu execs for
	// `criu lazy-pages`; unset, the fake criu has no such command.
	lazyDaemonEnv = "FERRY_TEST_LAZY_DAEMON"
	// lazyPulledEnv names the file where the daemon writes the pages it
	// pulled, in the order it asked for them.
	lazyPulledEnv = "FERRY_TEST_LAZY_PULLED"
	// lazyFailEnv makes the daemon exit 1 once it has pulled this many
	// pages (a daemon dying mid-pull).
	lazyFailEnv = "FERRY_TEST_LAZY_FAIL_AFTER"
)

// lazyPlanFile, in the images directory, lists the memory a fake lazy
// dump left at the source, and how the daemon asks for it: one line per
// region, "fault PID ADDR N" (one request per page, as faults come) or
// "background PID ADDR N" (one request for all N, as CRIU's background
// fetch asks).
const lazyPlanFile = "lazy-pages.fake"

// The page-server protocol's words the fakes use (criu/page-xfer.c; see
// internal/pagestream): a 32-byte header of u32 cmd (flags<<16 | command),
// padding, u64 nr_pages, u64 vaddr, u64 dst_id.
const (
	psHeaderSize    = 32
	psIOVAddFCmd    = 6
	psIOVGetCmd     = 7
	psIOVCloseCmd   = 0x1023
	psIOVForceClose = 0x1024
	psPEPresent     = 1 << 2
)

func psHeader(cmd uint32, n, vaddr, id uint64) []byte {
	b := make([]byte, psHeaderSize)
	binary.LittleEndian.PutUint32(b[0:], cmd)
	binary.LittleEndian.PutUint64(b[8:], n)
	binary.LittleEndian.PutUint64(b[16:], vaddr)
	binary.LittleEndian.PutUint64(b[24:], id)
	return b
}

func parsePSHeader(b []byte) (cmd uint32, n, vaddr, id uint64) {
	return binary.LittleEndian.Uint32(b[0:]), binary.LittleEndian.Uint64(b[8:]),
		binary.LittleEndian.Uint64(b[16:]), binary.LittleEndian.Uint64(b[24:])
}

func TestMain(m *testing.M) {
	if os.Getenv(lazyDaemonEnv) != "" && len(os.Args) > 1 && os.Args[1] == "lazy-pages" {
		os.Exit(fakeLazyPages(os.Args[2:]))
	}
	if os.Getenv(procstest.MapperEnv) == "1" {
		procstest.PlayMapper(os.Stdin, os.Stdout)
		return
	}
	os.Exit(m.Run())
}

// lazyRegion is one run of pages a lazy dump left at the source.
type lazyRegion struct {
	fault bool // asked for page by page; else in one background request
	pid   uint32
	addr  uint64
	data  []byte
}

func (r lazyRegion) pages() int { return len(r.data) / pageSize }

func writeLazyPlan(path string, regions []lazyRegion) error {
	var b strings.Builder
	for _, r := range regions {
		how := "background"
		if r.fault {
			how = "fault"
		}
		fmt.Fprintf(&b, "%s %d %#x %d\n", how, r.pid, r.addr, r.pages())
	}
	return os.WriteFile(path, []byte(b.String()), 0o600)
}

func readLazyPlan(path string) ([]lazyRegion, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var regions []lazyRegion
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var how string
		var r lazyRegion
		var n int
		if _, err := fmt.Sscanf(line, "%s %d %v %d", &how, &r.pid, &r.addr, &n); err != nil {
			return nil, fmt.Errorf("plan line %q: %v", line, err)
		}
		r.fault = how == "fault"
		r.data = make([]byte, n*pageSize)
		regions = append(regions, r)
	}
	return regions, nil
}

// fakeLazyPages is the daemon: it takes `lazy-pages --page-server
// --ps-socket 3 --images-dir D --work-dir W -o LOG -v4`, creates
// W/lazy-pages.socket, waits for the restore to connect there, pulls every
// page of D's plan over fd 3, logs what CRIU logs of it (the lines
// criu.LazyCounts reads), closes the page server and exits 0.
func fakeLazyPages(args []string) int {
	// A daemon its test lost (killed mid-run) must not linger.
	time.AfterFunc(time.Minute, func() { os.Exit(3) })
	var images, work, logName string
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "--images-dir":
			images = args[i+1]
		case "--work-dir":
			work = args[i+1]
		case "-o":
			logName = args[i+1]
		}
	}
	if images == "" || work == "" || logName == "" {
		fmt.Fprintf(os.Stderr, "fake lazy-pages: arguments %q\n", args)
		return 2
	}
	logf, err := os.Create(filepath.Join(work, logName))
	if err != nil {
		return 2
	}
	defer logf.Close()
	start := time.Now()
	logLine := func(format string, a ...any) {
		fmt.Fprintf(logf, "(%09.6f) "+format+"\n", append([]any{time.Since(start).Seconds()}, a...)...)
	}
	fail := func(err error) int {
		logLine("Error (fake lazy-pages): %v", err)
		return 1
	}
	pulledPath := os.Getenv(lazyPulledEnv)
	// The test kills a daemon left running by this pid.
	if err := os.WriteFile(pulledPath+".pid", []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		return fail(err)
	}
	failAfter, _ := strconv.Atoi(os.Getenv(lazyFailEnv))
	plan, err := readLazyPlan(filepath.Join(images, lazyPlanFile))
	if err != nil {
		return fail(err)
	}
	l, err := net.Listen("unix", filepath.Join(work, "lazy-pages.socket"))
	if err != nil {
		return fail(err)
	}
	// The restore hands over its userfaultfds here; this one says who it
	// restored and hangs up.
	c, err := l.Accept()
	if err != nil {
		return fail(err)
	}
	hello, _ := io.ReadAll(c)
	c.Close()
	l.Close()
	logLine("uffd: restore connected: %s", strings.TrimSpace(string(hello)))

	ps := os.NewFile(3, "page-server")
	in := bufio.NewReader(ps)
	out, err := os.Create(pulledPath)
	if err != nil {
		return fail(err)
	}
	defer out.Close()
	pulled := 0
	transferred := map[uint32]int{}
	total := map[uint32]int{}
	for _, r := range plan {
		total[r.pid] += r.pages()
	}
	get := func(r lazyRegion, addr uint64, n int) error {
		if _, err := ps.Write(psHeader(psIOVGetCmd, uint64(n), addr, uint64(r.pid))); err != nil {
			return err
		}
		hdr := make([]byte, psHeaderSize)
		if _, err := io.ReadFull(in, hdr); err != nil {
			return fmt.Errorf("page server: %w", err)
		}
		cmd, rn, rvaddr, _ := parsePSHeader(hdr)
		if cmd != psPEPresent<<16|psIOVAddFCmd || rn != uint64(n) || rvaddr != addr {
			return fmt.Errorf("asked for %d pages at %#x, got cmd %#x with %d at %#x", n, addr, cmd, rn, rvaddr)
		}
		if _, err := io.CopyN(out, in, int64(n)*pageSize); err != nil {
			return fmt.Errorf("page server: %w", err)
		}
		pulled += n
		transferred[r.pid] += n
		if failAfter > 0 && pulled >= failAfter {
			return fmt.Errorf("injected: gave up after %d pages", pulled)
		}
		return nil
	}
	for _, r := range plan {
		if !r.fault {
			logLine("uffd: %d: background fetch of %d pages at %#x", r.pid, r.pages(), r.addr)
			if err := get(r, r.addr, r.pages()); err != nil {
				return fail(err)
			}
			continue
		}
		for i := 0; i < r.pages(); i++ {
			addr := r.addr + uint64(i*pageSize)
			logLine("uffd: %d-%d: #PF at %#x", r.pid, r.pid, addr)
			if err := get(r, addr, 1); err != nil {
				return fail(err)
			}
		}
	}
	for pid, n := range transferred {
		logLine("uffd: %d: UFFD transferred pages: (%d/%d)", pid, n, total[pid])
	}
	if _, err := ps.Write(psHeader(psIOVCloseCmd, 0, 0, 0)); err != nil {
		return fail(err)
	}
	var status [4]byte
	if _, err := io.ReadFull(in, status[:]); err != nil {
		return fail(fmt.Errorf("page server's close: %w", err))
	}
	return 0
}

// fakeLazyDaemon has the fake criu play `criu lazy-pages` for t, the
// daemon exiting 1 after failAfter pages when that is above 0. It returns
// the file where the daemon leaves the pages it pulled. A daemon still
// running when t ends is killed (the engine stops its own; this is for a
// test that failed early).
func fakeLazyDaemon(t *testing.T, failAfter int) (pulled string) {
	t.Helper()
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	pulled = filepath.Join(t.TempDir(), "pulled")
	t.Setenv(lazyDaemonEnv, bin)
	t.Setenv(lazyPulledEnv, pulled)
	t.Setenv(lazyFailEnv, strconv.Itoa(failAfter))
	t.Cleanup(func() {
		b, err := os.ReadFile(pulled + ".pid")
		if err != nil {
			return
		}
		if pid, err := strconv.Atoi(string(b)); err == nil && isOurChild(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return pulled
}

// isOurChild says whether pid is a live child of this process (so a pid
// reused meanwhile is left alone).
func isOurChild(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return false
	}
	f := strings.Fields(s[i+1:]) // state, ppid, ...
	return len(f) > 1 && f[0] != "Z" && f[1] == strconv.Itoa(os.Getpid())
}

// daemonGone fails the test if the daemon that wrote pulled's pid file
// still runs.
func daemonGone(t *testing.T, pulled string) {
	t.Helper()
	b, err := os.ReadFile(pulled + ".pid")
	if err != nil {
		t.Errorf("the lazy-pages daemon never ran: %v", err)
		return
	}
	pid, _ := strconv.Atoi(string(b))
	if isOurChild(pid) {
		t.Errorf("the lazy-pages daemon (pid %d) still runs after the migration ended", pid)
	}
}

// lazyRestore is the fake restore's part in a lazy restore: CRIU's
// restore connects to the daemon's socket in the work directory and
// hands it the restored processes' memory.
func lazyRestore(workDir string, pid int) error {
	c, err := net.Dial("unix", filepath.Join(workDir, "lazy-pages.socket"))
	if err != nil {
		return fmt.Errorf("fake restore: the lazy-pages daemon: %w", err)
	}
	defer c.Close()
	_, err = fmt.Fprintf(c, "pid %d\n", pid)
	return errors.Join(err, c.(*net.UnixConn).CloseWrite())
}
