package procs

import (
	"os"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/testroot"
)

func TestParseSyscallPC(t *testing.T) {
	for _, c := range []struct {
		in      string
		pc      uint64
		running bool
		bad     bool
	}{
		{in: "running\n", running: true},
		{in: "-1 0x7ffd6a2c1e48 0x4019a2\n", pc: 0x4019a2},
		{in: "230 0x1 0x0 0x7ffc0 0x0 0x0 0x0 0x7ffc1 0x7f3b2c4e13b5\n", pc: 0x7f3b2c4e13b5},
		{in: "", bad: true},
		{in: "-1 0x1\n", bad: true},
		{in: "-1 0x1 zz\n", bad: true},
	} {
		pc, running, err := parseSyscallPC(c.in)
		if c.bad != (err != nil) || pc != c.pc || running != c.running {
			t.Errorf("%q: pc %#x running %v err %v", c.in, pc, running, err)
		}
	}
}

// A thread no one traces has no tracer; a stopped thread's program
// counter is read (internal/criu's TestKillWorkingIn* cover a traced
// one).
func TestTraceesAndProgramCounter(t *testing.T) {
	testroot.Require(t, "needs root: reads other processes' /proc/PID/syscall")
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if slices.Contains(Tracees(os.Getpid()), cmd.Process.Pid) {
		t.Fatal("an untraced child is listed as our tracee")
	}
	var pc uint64
	var err error
	// Until it sleeps in its own code: just started, it may still run, or
	// wait inside its exec with no program counter of its own yet.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var running bool
		if pc, running, err = ProgramCounter(cmd.Process.Pid); err != nil || (!running && pc != 0) {
			break
		}
	}
	if err != nil || pc == 0 {
		t.Fatalf("pc %#x: %v", pc, err)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/maps")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(ParseMaps(b), func(m Mapping) bool { return m.Executable() && pc >= m.Start && pc < m.End }) {
		t.Fatalf("pc %#x is in no executable mapping", pc)
	}
}

// A zombie is dying; a live process and a PID that is gone are not.
func TestDying(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	for st, _ := State(pid); st != 'Z'; st, _ = State(pid) {
		time.Sleep(time.Millisecond)
	}
	if !Dying(pid) {
		t.Error("a zombie is not Dying")
	}
	_ = cmd.Wait()
	if Dying(pid) {
		t.Error("a reaped PID is Dying")
	}
	if Dying(os.Getpid()) {
		t.Error("this test is Dying")
	}
}
