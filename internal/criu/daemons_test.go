package criu

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/procs/procstest"
)

// uffdHolderEnv makes the test binary play a lazy-pages daemon's part that
// HoldFaults sees: a process whose userfaultfds come and go.
const uffdHolderEnv = "FERRY_TEST_UFFD_HOLDER"

func TestMain(m *testing.M) {
	if os.Getenv(uffdHolderEnv) == "1" {
		uffdHolder(os.Stdin, os.Stdout)
		return
	}
	if role := os.Getenv(strandEnv); role != "" {
		playStrand(role, os.Stdin, os.Stdout)
		return
	}
	if os.Getenv(procstest.MapperEnv) == "1" {
		procstest.PlayMapper(os.Stdin, os.Stdout)
		return
	}
	if pid, err := strconv.Atoi(os.Getenv(compelEnv)); err == nil {
		playCompel(pid, os.Stdin, os.Stdout)
		return
	}
	os.Exit(m.Run())
}

// uffdUserModeOnly lets a process without privileges make a userfaultfd
// (for faults in user mode only, all the test needs).
const uffdUserModeOnly = 1

// uffdHolder opens a userfaultfd for each "open" line and closes the
// newest for each "close", answering each line with "ok" or the error.
func uffdHolder(in io.Reader, out io.Writer) {
	var fds []int
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		switch sc.Text() {
		case "open":
			fd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|uffdUserModeOnly, 0, 0)
			if errno != 0 {
				fmt.Fprintln(out, "userfaultfd:", errno)
				continue
			}
			fds = append(fds, int(fd))
		case "close":
			unix.Close(fds[len(fds)-1])
			fds = fds[:len(fds)-1]
		}
		fmt.Fprintln(out, "ok")
	}
}

// The hold follows the daemon's userfaultfds as a restored process forks
// (one more) and a child exits (one fewer), costs no more descriptors
// than the daemon holds, and outlives the daemon.
func TestHoldFaultsFollowsTheDaemon(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), uffdHolderEnv+"=1")
	stdin, answers := procstest.StartTalking(t, cmd)
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	tell := func(line string) {
		t.Helper()
		fmt.Fprintln(stdin, line)
		if !answers.Scan() {
			t.Fatalf("the holder did not answer %q", line)
		}
		if a := answers.Text(); a != "ok" {
			t.Skipf("this machine will not make a userfaultfd here: %s", a)
		}
	}
	lp := &LazyPages{pid: cmd.Process.Pid}
	hold := func(want int) {
		t.Helper()
		n, err := lp.HoldFaults()
		if err != nil && strings.Contains(err.Error(), "operation not permitted") {
			t.Skipf("may not copy another process's descriptors here: %v", err)
		}
		if err != nil || n != want {
			t.Fatalf("HoldFaults = %d, %v; want %d held", n, err, want)
		}
		if got := descriptorsHere(userfaultfdLink); got != want {
			t.Fatalf("%d userfaultfds open in the test, want %d (copies replaced, not added)", got, want)
		}
	}
	tell("open")
	hold(1)
	tell("open") // a restored process forked
	hold(2)
	tell("close") // a child exited
	hold(1)
	hold(1)

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if n, err := lp.HoldFaults(); err == nil || n != 1 {
		t.Fatalf("after the daemon died: HoldFaults = %d, %v; want its last copy kept and an error", n, err)
	}
	if got := descriptorsHere(userfaultfdLink); got != 1 {
		t.Fatalf("after the daemon died %d userfaultfds are held, want 1", got)
	}
	lp.ReleaseFaults()
	if got := descriptorsHere(userfaultfdLink); got != 0 {
		t.Fatalf("after the release %d userfaultfds are open", got)
	}
	if n, err := lp.HoldFaults(); n != 0 || err != nil {
		t.Fatalf("HoldFaults after the release = %d, %v; want nothing held", n, err)
	}
}

// descriptorsHere counts this process's descriptors pointing at link
// ("anon_inode:[userfaultfd]"...).
func descriptorsHere(link string) int {
	n := 0
	for _, l := range procs.OpenFiles(os.Getpid()) {
		if l == link {
			n++
		}
	}
	return n
}

// A daemon's log says it finished when every task it was handed has its
// summary and nothing went wrong; one killed midway wrote neither.
func TestLazyPagesFinished(t *testing.T) {
	dir := t.TempDir()
	const start = "(00.000834) uffd: Waiting for incoming connections on lazy-pages.socket\n" +
		"(00.001066) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted\n" +
		"(00.027301) uffd: Received PID: 1, uffd: 8\n"
	for _, c := range []struct {
		log  string
		want bool
	}{
		{start + "(00.563310) uffd: 1-8: UFFD transferred pages: (16633/16633)\n", true},
		{start + "(00.100000) uffd: 1-8: #PF at 0x6a0000\n", false}, // killed mid-pull
		{start + "(00.560000) Error (criu/uffd.c:700): uffd: 1-8: failed reading pages at 6a0000\n(00.563310) uffd: 1-8: UFFD transferred pages: (10/16633)\n", false},
		{"", false},
	} {
		if err := os.WriteFile(filepath.Join(dir, "lazy-pages.log"), []byte(c.log), 0o600); err != nil {
			t.Fatal(err)
		}
		if got, _ := LazyPagesFinished(dir); got != c.want {
			t.Errorf("LazyPagesFinished(%q) = %v, want %v", c.log, got, c.want)
		}
	}
	if done, _ := LazyPagesFinished(t.TempDir()); done {
		t.Error("a missing log says finished")
	}
}
