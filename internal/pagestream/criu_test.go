package pagestream

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/ferry-migrate/ferry/internal/testroot"

	"golang.org/x/sys/unix"
)

const (
	holderEnv  = "FERRY_PAGESTREAM_HOLDER"
	holderSize = 16 << 20
)

func TestMain(m *testing.M) {
	if seed := os.Getenv(holderEnv); seed != "" {
		holdMemory(seed)
		return
	}
	os.Exit(m.Run())
}

func holderContent(seed uint64) []byte {
	b := make([]byte, holderSize)
	rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), 'f', 'e', 'r', 'r', 'y'}).Read(b)
	return b
}

// holdMemory is the process the integration test dumps: it fills 16 MiB,
// reports the buffer's address on fd 3 and sleeps. It ends by itself, in
// case a killed test run never gets to clean up.
func holdMemory(seed string) {
	n, err := strconv.ParseUint(seed, 10, 64)
	if err != nil {
		os.Exit(2)
	}
	holderBuf = holderContent(n)
	buf := holderBuf
	ready := os.NewFile(3, "ready")
	fmt.Fprintf(ready, "%d\n", uintptr(unsafe.Pointer(&buf[0])))
	ready.Close()
	time.Sleep(10 * time.Minute)
	os.Exit(0)
}

// holderBuf keeps the holder's memory reachable while it sleeps.
var holderBuf []byte

// startHolder starts the memory holder in its own session and returns its
// pid and buffer address.
func startHolder(t *testing.T, seed uint64) (*exec.Cmd, uint64) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", holderEnv, seed))
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		t.Fatal(err)
	}
	w.Close()
	pid := cmd.Process.Pid
	t.Cleanup(func() { killPID(pid) })
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil {
		t.Fatalf("holder did not start: %v", err)
	}
	addr, err := strconv.ParseUint(strings.TrimSpace(line), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return cmd, addr
}

// killPID kills and reaps pid if it is still there and ours to reap.
func killPID(pid int) {
	if syscall.Kill(pid, syscall.SIGKILL) == nil {
		var ws syscall.WaitStatus
		syscall.Wait4(pid, &ws, 0, nil)
	}
}

// readMemory is the plain first reading: every readable mapping of pid,
// page by page, as the destination would hold it after a pre-copy round.
func readMemory(t *testing.T, pid int) store {
	t.Helper()
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	held := store{}
	for _, line := range strings.Split(strings.TrimSpace(string(maps)), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[1][0] != 'r' {
			continue
		}
		lo, hi, _ := strings.Cut(f[0], "-")
		start, _ := strconv.ParseUint(lo, 16, 64)
		end, _ := strconv.ParseUint(hi, 16, 64)
		buf := make([]byte, end-start)
		if _, err := mem.ReadAt(buf, int64(start)); err != nil {
			continue // [vvar], [vsyscall] and the like
		}
		for a := start; a < end; a += PageSize {
			held[PageKey{PID: uint32(pid), Addr: a}] = buf[a-start : a-start+PageSize]
		}
	}
	return held
}

func runLogged(t *testing.T, logf string, args ...string) {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s\n%s", strings.Join(args, " "), err, out, logTail(logf))
	}
}

func logTail(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-25):], "\n")
}

// TestCRIUDumpThroughDedup dumps a real process with CRIU's page-server
// client, carries the stream through Dedup and Expand into a real CRIU page
// server, restores from what it wrote and checks the restored memory.
func TestCRIUDumpThroughDedup(t *testing.T) {
	testroot.Require(t, "needs root for CRIU")
	criu, err := exec.LookPath("criu")
	if err != nil {
		t.Skip("criu not in PATH")
	}
	// The restored holder is reparented to us so that cleanup can reap it.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) })

	tmp := t.TempDir()
	dir1, dir2, logs := filepath.Join(tmp, "dump"), filepath.Join(tmp, "pages"), filepath.Join(tmp, "logs")
	for _, d := range []string{dir1, dir2, logs} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}

	const seed = 77
	holder, bufAddr := startHolder(t, seed)
	pid := holder.Process.Pid
	held := readMemory(t, pid)
	// Pages changed since the destination's copy: these must go in full.
	const stale = 16
	for i := range stale {
		k := PageKey{PID: uint32(pid), Addr: bufAddr + uint64(i)*PageSize}
		if _, ok := held[k]; !ok {
			t.Fatalf("first reading lacks buffer page %#x", k.Addr)
		}
		held[k] = bytes.Repeat([]byte{byte(i)}, PageSize)
	}

	// The destination: CRIU's page server on one end of a socketpair.
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	psFile := os.NewFile(uintptr(fds[1]), "ps-socket")
	psLog := filepath.Join(logs, "page-server.log")
	ps := exec.Command(criu, "page-server", "--images-dir", dir2, "--ps-socket", "3", "-v4", "-o", psLog)
	ps.ExtraFiles = []*os.File{psFile}
	if err := ps.Start(); err != nil {
		t.Fatal(err)
	}
	psFile.Close()
	t.Cleanup(func() { killPID(ps.Process.Pid) })
	psConn := fileConn(t, fds[0])

	// The source: a loopback port for CRIU's page-server client.
	l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	dumpLog := filepath.Join(logs, "dump.log")
	dump := exec.Command(criu, "dump", "-t", strconv.Itoa(pid), "--shell-job", "--leave-running",
		"--page-server", "--address", "127.0.0.1", "--port", port, "-D", dir1, "-v4", "-o", dumpLog)
	var dumpOut bytes.Buffer
	dump.Stdout, dump.Stderr = &dumpOut, &dumpOut
	if err := dump.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { killPID(dump.Process.Pid) })

	l.SetDeadline(time.Now().Add(60 * time.Second))
	conn, err := l.AcceptTCP()
	if err != nil {
		t.Fatalf("CRIU did not connect: %v\n%s", err, logTail(dumpLog))
	}
	t.Cleanup(func() { conn.Close() })

	type result struct {
		name string
		err  error
	}
	results := make(chan result, 3)
	pr, pw := io.Pipe() // ferry's channel
	var dst DedupStats
	var est ExpandStats
	go func() {
		var err error
		dst, err = Dedup(pw, conn, held.lookup)
		pw.CloseWithError(err)
		results <- result{"dedup", err}
	}()
	go func() {
		var err error
		est, err = Expand(psConn, pr, held.source)
		pr.CloseWithError(err)
		results <- result{"expand", err}
	}()
	go func() {
		_, err := io.Copy(conn, psConn)
		if err == nil {
			err = conn.CloseWrite()
		}
		results <- result{"replies", err}
	}()

	waitCmd := func(name string, cmd *exec.Cmd, logf string) {
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: %v\n%s", name, err, logTail(logf))
			}
		case <-time.After(120 * time.Second):
			t.Fatalf("%s hung\n%s", name, logTail(logf))
		}
	}
	waitCmd("criu dump", dump, dumpLog)
	waitCmd("criu page-server", ps, psLog)
	for range 3 {
		select {
		case r := <-results:
			if r.err != nil {
				t.Fatalf("%s: %v", r.name, r.err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("pipeline hung")
		}
	}
	t.Logf("dedup: %+v; expand: %+v", dst, est)
	if dst.Referenced < holderSize/PageSize-stale || dst.Pages-dst.Referenced < stale {
		t.Fatalf("referenced %d of %d pages: want the %d-page buffer but %d stale pages referenced",
			dst.Referenced, dst.Pages, holderSize/PageSize, stale)
	}
	if est.Pages != dst.Pages || est.Referenced != dst.Referenced {
		t.Fatalf("expand saw %d/%d pages, dedup %d/%d", est.Referenced, est.Pages, dst.Referenced, dst.Pages)
	}

	// Restore from the page server's images plus the dump's other images.
	if err := copyImages(dir1, dir2); err != nil {
		t.Fatal(err)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	holder.Wait()
	pidFile := filepath.Join(tmp, "restored.pid")
	restoreLog := filepath.Join(logs, "restore.log")
	runLogged(t, restoreLog, criu, "restore", "-D", dir2, "--shell-job", "-d", "--pidfile", pidFile, "-v4", "-o", restoreLog)
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	rpid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { killPID(rpid) })
	got := make([]byte, holderSize)
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", rpid))
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	if _, err := mem.ReadAt(got, int64(bufAddr)); err != nil {
		t.Fatalf("reading restored memory: %v", err)
	}
	if !bytes.Equal(got, holderContent(seed)) {
		t.Fatal("restored process memory differs from the original")
	}
}

func fileConn(t *testing.T, fd int) net.Conn {
	t.Helper()
	f := os.NewFile(uintptr(fd), "socket")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// copyImages copies the dump's images into dir, which must not have them.
func copyImages(from, to string) error {
	ents, err := os.ReadDir(from)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			return err
		}
		f, err := os.OpenFile(filepath.Join(to, e.Name()), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return fmt.Errorf("copy image: %w", err)
		}
		_, err = f.Write(b)
		if err := errors.Join(err, f.Close()); err != nil {
			return err
		}
	}
	return nil
}
