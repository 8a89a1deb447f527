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
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/testroot"

	gocriu "github.com/checkpoint-restore/go-criu/v7"
	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/procs/procstest"
	"github.com/ferry-migrate/ferry/internal/tail"
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
	testroot.Require(t, "needs root: ptrace of another process and SIGKILL of it")
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
	stdin, answers := procstest.StartTalking(t, l.tracer)
	t.Cleanup(func() { _ = l.tracer.Process.Kill(); _ = l.tracer.Wait() })
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

// strandEnv makes the test binary play one part of a restore whose CRIU
// died: "runtime", a child subreaper that runs the command after "--"
// with the write end of a pipe as descriptor 3 and, as runc with its
// socket, reads the other end to its EOF ("eof") before it reaps the
// command; "criu", which forks a "task" that inherits descriptor 3, says
// both PIDs, and dies at a line on its input; and that task.
const strandEnv = "FERRY_TEST_STRAND"

func playStrand(role string, in io.Reader, out io.Writer) {
	fail := func(err error) {
		fmt.Fprintln(out, err)
		os.Exit(1)
	}
	switch role {
	case "runtime":
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			fail(err)
		}
		argv := os.Args[slices.Index(os.Args, "--")+1:]
		if argv[0] == "restore-as-runc" {
			restoreAsRunc(argv[1], argv[2], in, out)
			break
		}
		r, w, err := os.Pipe()
		if err != nil {
			fail(err)
		}
		c := exec.Command(argv[0], argv[1:]...)
		c.Stdin, c.Stdout, c.ExtraFiles = in, out, []*os.File{w}
		c.Env = append(os.Environ(), strandEnv+"=criu")
		if err := c.Start(); err != nil {
			fail(err)
		}
		w.Close()
		_, _ = io.Copy(io.Discard, r)
		fmt.Fprintln(out, "eof")
		_ = c.Wait()
	case "criu":
		task := exec.Command(os.Args[0], "-test.run=^$") // as the runtime ran it: criu
		task.Env = append(os.Environ(), strandEnv+"=task")
		task.ExtraFiles = []*os.File{os.NewFile(3, "runtime")}
		if err := task.Start(); err != nil {
			fail(err)
		}
		fmt.Fprintln(out, os.Getpid(), task.Process.Pid)
		bufio.NewScanner(in).Scan()
		os.Exit(0)
	}
	time.Sleep(time.Hour)
}

// restoreAsRunc has CRIU restore the images as runc does (criu swrk,
// through go-criu, the process restored as its sibling), and says "eof"
// when CRIU's socket answered or ended. At CRIU's setup-namespaces
// notification (the process forked into its namespaces, waiting for
// CRIU), it says "forked PID" and answers once told a line.
func restoreAsRunc(images, work string, in io.Reader, out io.Writer) {
	var fds []int32
	for _, dir := range []string{images, work} {
		f, err := os.Open(dir)
		if err != nil {
			fmt.Fprintln(out, err)
			return
		}
		fds = append(fds, int32(f.Fd()))
	}
	c := gocriu.MakeCriu()
	_ = c.Restore(&rpc.CriuOpts{ImagesDirFd: proto.Int32(fds[0]), WorkDirFd: proto.Int32(fds[1]),
		LogFile: proto.String("restore.log"), LogLevel: proto.Int32(4), ShellJob: proto.Bool(true), RstSibling: proto.Bool(true)},
		holdAtNamespaces{in: bufio.NewScanner(in), out: out})
	fmt.Fprintln(out, "eof")
	_ = c.Cleanup()
}

type holdAtNamespaces struct {
	gocriu.NoNotify
	in  *bufio.Scanner
	out io.Writer
}

func (h holdAtNamespaces) SetupNamespaces(pid int32) error {
	fmt.Fprintln(h.out, "forked", pid)
	h.in.Scan()
	return nil
}

// strandedRestore is a "runtime" running argv in dir.
type strandedRestore struct {
	runtime *exec.Cmd
	tell    io.Writer
	lines   *bufio.Scanner
	eof     chan bool // the runtime saw its pipe's end
}

func startStranded(t *testing.T, dir string, argv ...string) *strandedRestore {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	s := &strandedRestore{runtime: exec.Command(self, append([]string{"-test.run=^$", "--"}, argv...)...), eof: make(chan bool, 1)}
	s.runtime.Dir = dir
	s.runtime.Env = append(os.Environ(), strandEnv+"=runtime")
	s.tell, s.lines = procstest.StartTalking(t, s.runtime)
	t.Cleanup(func() {
		// Whatever is left below the runtime, then the runtime.
		for _, pid := range procs.Descendants(s.runtime.Process.Pid, "") {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		_ = s.runtime.Process.Kill()
		_ = s.runtime.Wait()
	})
	return s
}

// watchEOF reports, from now on, the runtime's "eof" on s.eof.
func (s *strandedRestore) watchEOF() {
	go func() {
		for s.lines.Scan() {
			if s.lines.Text() == "eof" {
				s.eof <- true
				return
			}
		}
	}()
}

// killAndExpectEOF shows the runtime waiting for ever, then has
// WatchAbandoned find in dir and kill want, which ends its wait.
func (s *strandedRestore) killAndExpectEOF(t *testing.T, dir string, want []int) {
	t.Helper()
	s.watchEOF()
	select {
	case <-s.eof:
		t.Fatal("the runtime saw its pipe end with the abandoned tasks alive: nothing to watch for")
	case <-time.After(500 * time.Millisecond):
	}
	if got := Abandoned(dir); !slices.Equal(got, want) {
		t.Fatalf("Abandoned = %v, want %v", got, want)
	}
	if got := Abandoned(t.TempDir()); got != nil {
		t.Fatalf("abandoned in another directory: %v", got)
	}
	var mu sync.Mutex
	var killed []int
	stop := WatchAbandoned(10*time.Millisecond, func(pid int) { mu.Lock(); killed = append(killed, pid); mu.Unlock() }, t.TempDir(), dir)
	defer stop()
	select {
	case <-s.eof:
	case <-time.After(5 * time.Second):
		t.Fatal("the runtime still waits: the abandoned tasks were not killed")
	}
	stop()
	slices.Sort(killed)
	if !slices.Equal(killed, want) {
		t.Fatalf("killed %v, want %v", killed, want)
	}
}

// dead waits for pid to be a zombie or gone.
func dead(t *testing.T, pid int) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if st, ok := procs.State(pid); !ok || st == 'Z' {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%d did not die", pid)
		}
	}
}

// A CRIU that died leaves the task it forked beside its unreaped corpse,
// holding what its runtime waits on: Abandoned finds that task (only
// then, and only in its directory), and WatchAbandoned kills it.
func TestAbandoned(t *testing.T) {
	testroot.Require(t, "needs root, as the package's other process tests")
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	fakeCRIU := filepath.Join(dir, "criu") // its command name is what Abandoned looks for
	if err := os.Symlink(self, fakeCRIU); err != nil {
		t.Fatal(err)
	}
	s := startStranded(t, dir, fakeCRIU, "-test.run=^$")
	var criu, task int
	if !s.lines.Scan() {
		t.Fatalf("no PIDs from the runtime's CRIU: %v", s.lines.Err())
	}
	if _, err := fmt.Sscan(s.lines.Text(), &criu, &task); err != nil {
		t.Fatalf("the runtime's CRIU said %q", s.lines.Text())
	}
	if got := Abandoned(dir); got != nil {
		t.Fatalf("with its CRIU alive, the task is abandoned: %v", got)
	}
	fmt.Fprintln(s.tell, "die")
	dead(t, criu)
	s.killAndExpectEOF(t, dir, []int{task})
}

// The same with a real CRIU restoring a process for a runtime as runc
// has it do (criu swrk, the process its sibling, in a PID namespace of
// its own): killed while the process it forked waits in its namespace for
// CRIU, CRIU leaves it holding the runtime's socket.
func TestAbandonedByARealRestore(t *testing.T) {
	needCRIU(t)
	images, work := t.TempDir(), t.TempDir()
	// A process alone in a PID namespace: CRIU restores the namespace
	// too, and tells its runtime once the process is in it.
	ns := exec.Command("unshare", "--pid", "--fork", "setsid", "sleep", "600") // its own session leader, as a container's init
	if err := ns.Start(); err != nil {
		t.Fatal(err)
	}
	nsEnd := make(chan error, 1)
	go func() { nsEnd <- ns.Wait() }()
	t.Cleanup(func() { _ = ns.Process.Kill(); <-nsEnd })
	var init []int
	for end := time.Now().Add(5 * time.Second); len(init) == 0; time.Sleep(5 * time.Millisecond) {
		if init = procs.Descendants(ns.Process.Pid, "sleep"); time.Now().After(end) {
			t.Fatal("the namespace's process did not start")
		}
	}
	t.Cleanup(func() { _ = syscall.Kill(init[0], syscall.SIGKILL) }) // unshare's end leaves it
	dump := exec.Command("criu", "dump", "-t", strconv.Itoa(init[0]), "-D", images, "-o", "dump.log", "--shell-job")
	if out, err := dump.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(images, "dump.log"))
		t.Fatalf("dump: %v %s\n%s", err, out, tail.Lines(string(log), 15))
	}

	s := startStranded(t, work, "restore-as-runc", images, work)
	var forked int
	if !s.lines.Scan() {
		t.Fatalf("the runtime said nothing: %v", s.lines.Err())
	}
	if _, err := fmt.Sscanf(s.lines.Text(), "forked %d", &forked); err != nil {
		log, _ := os.ReadFile(filepath.Join(work, "restore.log"))
		t.Fatalf("the runtime said %q, not the process CRIU forked\n%s", s.lines.Text(), tail.Lines(string(log), 15))
	}
	t.Cleanup(func() { _ = syscall.Kill(forked, syscall.SIGKILL) }) // a namespace's init: its namespace goes with it
	var criu int
	for _, p := range procs.Descendants(s.runtime.Process.Pid, "criu") {
		if pp, _ := procs.Parent(p); pp == s.runtime.Process.Pid && p != forked {
			criu = p
		}
	}
	if criu == 0 {
		t.Fatal("no CRIU beside the process it forked")
	}
	_ = syscall.Kill(criu, syscall.SIGKILL)
	dead(t, criu)
	fmt.Fprintln(s.tell, "go on") // the runtime answers CRIU, and waits for its end
	left := slices.DeleteFunc(procs.Descendants(s.runtime.Process.Pid, "criu"), func(p int) bool { return p == criu })
	if !slices.Contains(left, forked) {
		t.Fatalf("the forked process %d is not left as CRIU's (%v)", forked, left)
	}
	s.killAndExpectEOF(t, work, left)
}
