package procs

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	p, ok := parseStat(42, "42 (a (b) c) S 7 42 42 0 -1")
	if !ok || p.comm != "a (b) c" || p.ppid != 7 || p.pid != 42 || p.state != 'S' {
		t.Fatalf("%+v %v", p, ok)
	}
	for _, bad := range []string{"", "42 a S 7", "42 (x)", "42 (x) S y"} {
		if _, ok := parseStat(1, bad); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}

// A child's child is found by its name, and only below the given PID.
func TestDescendants(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 30 & wait")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var found []int
	for i := 0; i < 200 && len(found) == 0; i++ {
		found = Descendants(cmd.Process.Pid, "sleep")
		if len(found) == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if len(found) != 1 {
		t.Fatalf("found %v below %d", found, cmd.Process.Pid)
	}
	defer syscall.Kill(found[0], syscall.SIGKILL)
	if !slices.Contains(Named("sleep"), found[0]) {
		t.Errorf("Named(sleep) misses %d", found[0])
	}
	if got := Descendants(found[0], "sleep"); len(got) != 0 {
		t.Errorf("a leaf has descendants: %v", got)
	}
}

// Only a living process beside a corpse of its name is stranded, only
// under that corpse's parent, and not under a parent of that name.
func TestStranded(t *testing.T) {
	table := []proc{
		{pid: 10, ppid: 1, comm: "runc", state: 'S'},
		{pid: 11, ppid: 10, comm: "criu", state: 'Z'}, // the CRIU that died
		{pid: 12, ppid: 10, comm: "criu", state: 'S'}, // what it forked, now runc's
		{pid: 13, ppid: 10, comm: "sleep", state: 'S'},
		{pid: 20, ppid: 1, comm: "agent", state: 'S'},
		{pid: 21, ppid: 20, comm: "criu", state: 'S'}, // a CRIU at work
		{pid: 22, ppid: 21, comm: "criu", state: 'S'},
		{pid: 23, ppid: 21, comm: "criu", state: 'Z'}, // a helper of its, not reaped yet
		{pid: 30, ppid: 1, comm: "runc", state: 'S'},
		{pid: 31, ppid: 30, comm: "other", state: 'Z'},
		{pid: 32, ppid: 30, comm: "criu", state: 'S'},
	}
	got := stranded(table, "criu")
	if len(got) != 1 || got[12] != 10 {
		t.Fatalf("stranded = %v, want 12 (beside 11 under 10) alone", got)
	}
}

func TestState(t *testing.T) {
	if st, ok := State(os.Getpid()); !ok || (st != 'R' && st != 'S') {
		t.Errorf("this process: %q %v", st, ok)
	}
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	st := byte(0)
	for i := 0; i < 200 && st != 'T'; i++ {
		st, _ = State(cmd.Process.Pid)
		time.Sleep(5 * time.Millisecond)
	}
	if st != 'T' {
		t.Errorf("a stopped process is %q", st)
	}
}

// OpenFiles shows what a process holds open; Resident and TreeResident
// its memory, and that of its children.
func TestOpenFilesAndResident(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "held")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got := OpenFiles(os.Getpid())[int(f.Fd())]; got != f.Name() {
		t.Errorf("descriptor %d: %q, want %q", f.Fd(), got, f.Name())
	}
	if OpenFiles(1<<30) != nil {
		t.Error("a process that does not exist has open files")
	}
	self := Resident(os.Getpid())
	if self <= 0 {
		t.Fatalf("resident memory of this process: %d", self)
	}
	cmd := exec.Command("sleep", "10")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	child := Resident(cmd.Process.Pid)
	if tree := TreeResident(os.Getpid()); child <= 0 || tree < self+child/2 {
		t.Errorf("tree %d, self %d, child %d: the child is not counted", tree, self, child)
	}
	if Resident(1<<30) != 0 || TreeResident(1<<30) != 0 {
		t.Error("a process that does not exist has memory")
	}
}

// A process's files open for writing and mapped shared are listed; those
// it only reads are not.
func TestWrittenFiles(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"read", "written", "mapped"} {
		if err := os.WriteFile(filepath.Join(dir, f), make([]byte, 4096), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A child holds "read" open read-only, "written" for writing, and maps
	// "mapped" shared and writable (python3's mmap), then waits.
	script := `import mmap, sys, time
r = open(sys.argv[1] + "/read", "rb")
w = open(sys.argv[1] + "/written", "r+b")
m = open(sys.argv[1] + "/mapped", "r+b")
mm = mmap.mmap(m.fileno(), 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
m.close()
print("ready", flush=True)
time.sleep(60)
`
	cmd := exec.Command("python3", "-c", script, dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Skipf("needs python3 to hold files open: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	var got []string // its stdin and stderr, /dev/null, count too
	for _, f := range WrittenFiles(cmd.Process.Pid) {
		if strings.HasPrefix(f, dir+"/") {
			got = append(got, f)
		}
	}
	want := []string{filepath.Join(dir, "mapped"), filepath.Join(dir, "written")}
	if !slices.Equal(got, want) {
		t.Errorf("WrittenFiles = %q, want %q", got, want)
	}
	if got := WrittenFiles(1 << 30); len(got) != 0 {
		t.Errorf("a process that does not exist holds %q", got)
	}
}

// TestFromPIDFileAndTerminate: a PID file names a live process of the
// executable it says, not once the process is gone or of another name;
// Terminate ends one that ignores nothing within the grace period.
func TestFromPIDFileAndTerminate(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	pidFile := filepath.Join(t.TempDir(), "pid")
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := FromPIDFile(pidFile, "sleep"); got != cmd.Process.Pid {
		t.Fatalf("FromPIDFile = %d, want %d", got, cmd.Process.Pid)
	}
	if got := FromPIDFile(pidFile, "containerd"); got != 0 {
		t.Errorf("another executable's name: %d", got)
	}
	if got := FromPIDFile(filepath.Join(t.TempDir(), "none"), "sleep"); got != 0 {
		t.Errorf("no file: %d", got)
	}
	if err := Terminate([]int{cmd.Process.Pid}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	<-done
	if got := FromPIDFile(pidFile, "sleep"); got != 0 {
		t.Errorf("after Terminate: %d", got)
	}
}

// AwaitReady returns once ready succeeds, and says so at once when the
// process exits first.
func TestAwaitReady(t *testing.T) {
	log := filepath.Join(t.TempDir(), "log")
	p, err := StartDetached([]string{"sh", "-c", "echo started; exit 3"}, "", log, nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = p.AwaitReady(t.Context(), time.Minute, 10*time.Millisecond, func(context.Context) error { return errors.New("not yet") })
	if err == nil || !strings.Contains(err.Error(), "exited") || time.Since(start) > 10*time.Second {
		t.Fatalf("a process that exited: %v after %v", err, time.Since(start))
	}
	if b, _ := os.ReadFile(log); string(b) != "started\n" {
		t.Errorf("log %q", b)
	}
	q, err := StartDetached([]string{"sleep", "60"}, "", log, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = Terminate([]int{q.PID}, time.Second) }()
	n := 0
	if err := q.AwaitReady(t.Context(), time.Minute, 10*time.Millisecond, func(context.Context) error {
		if n++; n < 3 {
			return errors.New("not yet")
		}
		return nil
	}); err != nil || n != 3 {
		t.Fatalf("ready on the third try: %v after %d", err, n)
	}
}

// StatusBytes reads a size field in bytes, and says when there is none.
func TestStatusBytes(t *testing.T) {
	rss, err := StatusBytes(os.Getpid(), "VmRSS")
	if err != nil || rss <= 0 {
		t.Fatalf("VmRSS: %d, %v", rss, err)
	}
	if hwm, err := StatusBytes(os.Getpid(), "VmHWM"); err != nil || hwm < rss {
		t.Errorf("VmHWM %d below VmRSS %d (%v)", hwm, rss, err)
	}
	if _, err := StatusBytes(os.Getpid(), "NoSuchField"); err == nil {
		t.Error("a missing field read as a size")
	}
	if _, err := StatusBytes(os.Getpid(), "Name"); err == nil {
		t.Error("a name read as a size")
	}
	if _, err := StatusBytes(1<<30, "VmRSS"); err == nil {
		t.Error("a process that does not exist has a size")
	}
}

// StartTime tells a process from a later one with its PID; InNamespace
// finds a child in this process's namespaces (no root needed: reading
// one's own children's ns links is allowed).
func TestStartTimeAndInNamespace(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	mine, ok1 := StartTime(os.Getpid())
	child, ok2 := StartTime(cmd.Process.Pid)
	if !ok1 || !ok2 || child < mine {
		t.Errorf("start times: this process %d %v, its child %d %v", mine, ok1, child, ok2)
	}
	if _, ok := StartTime(1 << 30); ok {
		t.Error("a start time for a PID no process has")
	}
	pids, err := InNamespace("/proc/self/ns/mnt", "mnt")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(pids, os.Getpid()) || !slices.Contains(pids, cmd.Process.Pid) {
		t.Errorf("InNamespace(own mnt) = %v, lacks %d or %d", pids, os.Getpid(), cmd.Process.Pid)
	}
}
