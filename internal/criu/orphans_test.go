//go:build linux && amd64

package criu

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/internal/procs"
)

// compelEnv makes the test binary, started under the name criu, play
// compel's part on the process whose PID it holds.
const compelEnv = "FERRY_TEST_COMPEL"

// playCompel seizes and stops process pid, then on "enter" does to it
// what compel does to run a system call inside it: int3s written over the
// start of its first executable mapping and its registers pointed there
// (not run yet); "leave" puts code and registers back. Each line is
// answered "ok" or the error. It stays attached until killed.
func playCompel(pid int, in io.Reader, out io.Writer) {
	goruntime.LockOSThread() // ptrace requests come from the tracing thread
	answer := func(err error) {
		if err != nil {
			fmt.Fprintln(out, err)
			return
		}
		fmt.Fprintln(out, "ok")
	}
	var ws unix.WaitStatus
	err := unix.PtraceSeize(pid)
	if err == nil {
		err = unix.PtraceInterrupt(pid)
	}
	if err == nil {
		_, err = unix.Wait4(pid, &ws, unix.WALL, nil)
	}
	answer(err)
	var saved unix.PtraceRegs
	var code [8]byte
	var at uintptr
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		switch sc.Text() {
		case "enter":
			answer(func() error {
				b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
				if err != nil {
					return err
				}
				i := slices.IndexFunc(procs.ParseMaps(b), procs.Mapping.Executable)
				if i < 0 {
					return errors.New("no executable mapping")
				}
				at = uintptr(procs.ParseMaps(b)[i].Start)
				if err := unix.PtraceGetRegs(pid, &saved); err != nil {
					return err
				}
				if _, err := unix.PtracePeekData(pid, at, code[:]); err != nil {
					return err
				}
				int3s := [8]byte{0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc}
				if _, err := unix.PtracePokeData(pid, at, int3s[:]); err != nil {
					return err
				}
				regs := saved
				regs.Rip = uint64(at)
				regs.Orig_rax = ^uint64(0) // no system call to restart, as compel leaves it
				return unix.PtraceSetRegs(pid, &regs)
			}())
		case "leave":
			answer(func() error {
				if _, err := unix.PtracePokeData(pid, at, code[:]); err != nil {
					return err
				}
				return unix.PtraceSetRegs(pid, &saved)
			}())
		}
	}
	select {}
}

// sleeper is a sleeping process for a tracer (or CRIU) to take hold of,
// in a session of its own (CRIU dumps it as a shell job).
type sleeper struct {
	cmd *exec.Cmd
	end chan error // its exit
}

func startSleeper(t *testing.T) *sleeper {
	t.Helper()
	s := &sleeper{cmd: exec.Command("sleep", "600"), end: make(chan error, 1)}
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.end <- s.cmd.Wait() }()
	t.Cleanup(func() { _ = s.cmd.Process.Kill(); <-s.end })
	return s
}

// alive says whether the process still runs half a second on (after its
// tracer went), and if not, how it ended.
func (s *sleeper) alive() (bool, error) {
	select {
	case err := <-s.end:
		s.end <- err
		return false, err
	case <-time.After(500 * time.Millisecond):
		return true, nil
	}
}

// lab is a sleeping process and a CRIU-named tracer playing compel on it,
// working in the directory dir.
type lab struct {
	dir    string
	victim *sleeper
	tracer *exec.Cmd
	tell   func(line string)
}

func newLab(t *testing.T) *lab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: ptrace of another process and SIGKILL of it")
	}
	l := &lab{dir: t.TempDir(), victim: startSleeper(t)}

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	criu := filepath.Join(l.dir, "criu") // its command name is what KillWorkingIn looks for
	if err := os.Symlink(self, criu); err != nil {
		t.Fatal(err)
	}
	l.tracer = exec.Command(criu, "-test.run=^$")
	l.tracer.Dir = l.dir
	l.tracer.Env = append(os.Environ(), compelEnv+"="+strconv.Itoa(l.victim.cmd.Process.Pid))
	stdin, err := l.tracer.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := l.tracer.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := l.tracer.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.tracer.Process.Kill(); _ = l.tracer.Wait() })
	answers := bufio.NewScanner(stdout)
	expect := func(what string) {
		t.Helper()
		if !answers.Scan() || answers.Text() != "ok" {
			t.Fatalf("%s: %q %v", what, answers.Text(), answers.Err())
		}
	}
	expect("seize")
	l.tell = func(line string) {
		t.Helper()
		fmt.Fprintln(stdin, line)
		expect(line)
	}
	return l
}

// A CRIU attached to a process but not inside it is killed at once, and
// the process runs on.
func TestKillWorkingInKillsACRIUOutside(t *testing.T) {
	l := newLab(t)
	if Inside(l.tracer.Process.Pid) {
		t.Fatal("a tracer with the process stopped where it was is Inside")
	}
	killed, forced := killWorkingIn(l.dir, time.Minute)
	if !slices.Equal(killed, []int{l.tracer.Process.Pid}) || forced != nil {
		t.Fatalf("killed %v forced %v, want the tracer %d killed", killed, forced, l.tracer.Process.Pid)
	}
	if alive, err := l.victim.alive(); !alive {
		t.Fatalf("the process died with its tracer: %v", err)
	}
}

// A CRIU inside a process is waited for: killed once it stepped out, the
// process runs on.
func TestKillWorkingInWaitsForACRIUInside(t *testing.T) {
	l := newLab(t)
	l.tell("enter")
	if !Inside(l.tracer.Process.Pid) {
		t.Fatal("a tracer that pointed the process at its injected code is not Inside")
	}
	type result struct{ killed, forced []int }
	done := make(chan result, 1)
	go func() {
		k, f := killWorkingIn(l.dir, time.Minute)
		done <- result{k, f}
	}()
	select {
	case r := <-done:
		t.Fatalf("returned while the tracer was inside: killed %v forced %v", r.killed, r.forced)
	case <-time.After(500 * time.Millisecond):
	}
	if !procs.Alive(l.tracer.Process.Pid) {
		t.Fatal("the tracer was killed while inside")
	}
	l.tell("leave")
	r := <-done
	if !slices.Equal(r.killed, []int{l.tracer.Process.Pid}) || r.forced != nil {
		t.Fatalf("killed %v forced %v, want the tracer %d killed", r.killed, r.forced, l.tracer.Process.Pid)
	}
	if alive, err := l.victim.alive(); !alive {
		t.Fatalf("the process died with its tracer: %v", err)
	}
}

// Why the wait: a CRIU killed inside, once the patience ran out, takes
// the process with it (it runs on into compel's code, and dies of its
// SIGTRAP).
func TestKillWorkingInForcedKillsTheProcess(t *testing.T) {
	l := newLab(t)
	l.tell("enter")
	killed, forced := killWorkingIn(l.dir, 100*time.Millisecond)
	if !slices.Equal(killed, []int{l.tracer.Process.Pid}) || !slices.Equal(forced, killed) {
		t.Fatalf("killed %v forced %v, want the tracer %d killed and forced", killed, forced, l.tracer.Process.Pid)
	}
	alive, err := l.victim.alive()
	var exit *exec.ExitError
	if alive || !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTRAP {
		t.Fatalf("the process, let go inside compel's code: alive %v, %v; want dead of SIGTRAP", alive, err)
	}
}

// A real CRIU serving a lazy dump's pages holds the process it dumped
// (traced, stopped) but has left it: it is not Inside, KillWorkingIn
// kills it at once, and the process runs on, as after every migration
// whose lazy dump ferry ends that way.
func TestKillWorkingInALazyDumpsCRIU(t *testing.T) {
	needCRIU(t)
	victim := startSleeper(t)
	sleep := victim.cmd

	dir := t.TempDir()
	ready, status, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer ready.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0") // a free port for CRIU's page server
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	dump := exec.Command("criu", "dump", "-t", strconv.Itoa(sleep.Process.Pid), "-D", dir, "-o", "dump.log",
		"--shell-job", "--leave-running", "--lazy-pages", "--address", "127.0.0.1", "--port", port, "--status-fd", "3")
	dump.Dir = dir
	dump.ExtraFiles = []*os.File{status}
	if err := dump.Start(); err != nil {
		t.Fatal(err)
	}
	status.Close()
	dumpEnd := make(chan error, 1)
	go func() { dumpEnd <- dump.Wait() }()
	t.Cleanup(func() { _ = dump.Process.Kill(); <-dumpEnd })
	if n, err := ready.Read(make([]byte, 1)); n != 1 {
		log, _ := os.ReadFile(filepath.Join(dir, "dump.log"))
		t.Fatalf("CRIU never said its page server is ready: %v\n%s", err, log)
	}
	criu := dump.Process.Pid
	if tracees := procs.Tracees(criu); !slices.Contains(tracees, sleep.Process.Pid) {
		t.Fatalf("CRIU %d traces %v, not the process it dumped (%d)", criu, tracees, sleep.Process.Pid)
	}
	if Inside(criu) {
		t.Fatal("CRIU serving a lazy dump's pages is Inside the process")
	}
	killed, forced := killWorkingIn(dir, time.Minute)
	if !slices.Equal(killed, []int{criu}) || forced != nil {
		t.Fatalf("killed %v forced %v, want CRIU %d killed", killed, forced, criu)
	}
	if alive, err := victim.alive(); !alive {
		t.Fatalf("the process died with CRIU: %v", err)
	}
}

func TestCompelAt(t *testing.T) {
	maps := procs.ParseMaps([]byte(`00400000-00401000 r--p 00000000 08:01 1 /bin/x
00401000-00500000 r-xp 00001000 08:01 1 /bin/x
7f0000000000-7f0000010000 r-xs 00000000 00:01 9 /memfd:CRIUMFD (deleted)
7f0000010000-7f0000020000 rw-s 00010000 00:01 9 /memfd:CRIUMFD (deleted)
7ffc00000000-7ffc00002000 r-xp 00000000 00:00 0 [vdso]
`))
	for _, c := range []struct {
		pc   uint64
		want bool
	}{
		{0x401000, true},  // where compel's call starts
		{0x401003, true},  // stopped after its syscall and int3
		{0x401010, false}, // the program's own code
		{0x4ffff0, false},
		{0x7f0000000800, true},  // the parasite
		{0x7f0000010800, false}, // its data: no code runs there
		{0x7ffc00000900, false}, // the vDSO, past its start
		{0x400010, false},       // not executable
		{0x900000, false},       // nowhere
	} {
		if got := compelAt(maps, c.pc); got != c.want {
			t.Errorf("%#x: %v, want %v", c.pc, got, c.want)
		}
	}
}
