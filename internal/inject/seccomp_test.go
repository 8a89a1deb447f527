//go:build linux && amd64

package inject

import (
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// filter is a seccomp program as the kernel runs it, in x/net/bpf's VM:
// ret for system call nr, SECCOMP_RET_ALLOW for any other.
func filter(t *testing.T, nr uintptr, ret uint32) *bpf.VM {
	t.Helper()
	return vm(t, []bpf.Instruction{
		bpf.LoadAbsolute{Off: 0, Size: 4}, // seccomp_data.nr
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(nr), SkipFalse: 1},
		bpf.RetConstant{Val: ret},
		bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW},
	})
}

func vm(t *testing.T, prog []bpf.Instruction) *bpf.VM {
	t.Helper()
	v, err := bpf.NewVM(prog)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Every filter runs and the most severe verdict wins, as in the kernel
// (a process kill above all, its action's top bit set); a call is made
// only if it is allowed, logged, or failed with an errno.
func TestVerdict(t *testing.T) {
	const nr = unix.SYS_USERFAULTFD
	errno := unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	// Like every container runtime's profile: anything but x86-64's
	// system calls is killed, so seccomp_data's arch must be read right.
	x8664Only := vm(t, []bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4}, // seccomp_data.arch
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AUDIT_ARCH_X86_64, SkipTrue: 1},
		bpf.RetConstant{Val: unix.SECCOMP_RET_KILL_PROCESS},
		bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW},
	})
	for _, c := range []struct {
		name    string
		filters []*bpf.VM
		want    uint32
		through bool
	}{
		{"no filter", nil, unix.SECCOMP_RET_ALLOW, true},
		{"x86-64 only", []*bpf.VM{x8664Only}, unix.SECCOMP_RET_ALLOW, true},
		{"another call killed", []*bpf.VM{filter(t, unix.SYS_PTRACE, unix.SECCOMP_RET_KILL_PROCESS)}, unix.SECCOMP_RET_ALLOW, true},
		{"logged", []*bpf.VM{filter(t, nr, unix.SECCOMP_RET_LOG)}, unix.SECCOMP_RET_LOG, true},
		{"failed with EPERM", []*bpf.VM{x8664Only, filter(t, nr, errno)}, errno, true},
		{"trapped", []*bpf.VM{filter(t, nr, unix.SECCOMP_RET_TRAP)}, unix.SECCOMP_RET_TRAP, false},
		{"traced", []*bpf.VM{filter(t, nr, unix.SECCOMP_RET_TRACE)}, unix.SECCOMP_RET_TRACE, false},
		{"a supervisor's", []*bpf.VM{filter(t, nr, unix.SECCOMP_RET_USER_NOTIF)}, unix.SECCOMP_RET_USER_NOTIF, false},
		{"the thread killed", []*bpf.VM{filter(t, nr, unix.SECCOMP_RET_KILL_THREAD)}, unix.SECCOMP_RET_KILL_THREAD, false},
		{"a trap over an errno", []*bpf.VM{filter(t, nr, errno), filter(t, nr, unix.SECCOMP_RET_TRAP)}, unix.SECCOMP_RET_TRAP, false},
		{"an errno over a log", []*bpf.VM{filter(t, nr, unix.SECCOMP_RET_LOG), filter(t, nr, errno)}, errno, true},
		{"a process kill over a thread kill", []*bpf.VM{filter(t, nr, unix.SECCOMP_RET_KILL_THREAD), filter(t, nr, unix.SECCOMP_RET_KILL_PROCESS)},
			unix.SECCOMP_RET_KILL_PROCESS, false},
		{"a process kill over an errno", []*bpf.VM{filter(t, nr, unix.SECCOMP_RET_KILL_PROCESS), filter(t, nr, errno)},
			unix.SECCOMP_RET_KILL_PROCESS, false},
	} {
		got, err := verdict(c.filters, nr)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got != c.want || letsThrough(got) != c.through {
			t.Errorf("%s: verdict %#x (through: %v), want %#x (%v)", c.name, got, letsThrough(got), c.want, c.through)
		}
	}
}

// seccomp_data as a filter reads it: nr in the first word, the arch in
// the second, the instruction pointer and arguments (unknown here) zero.
func TestSeccompData(t *testing.T) {
	for word, want := range map[uint32]uint32{0: unix.SYS_CLOSE, 4: unix.AUDIT_ARCH_X86_64, 8: 0, 16: 0, 60: 0} {
		got, err := vm(t, []bpf.Instruction{bpf.LoadAbsolute{Off: word, Size: 4}, bpf.RetA{}}).Run(seccompData(unix.SYS_CLOSE))
		if err != nil {
			t.Fatal(err)
		}
		if uint32(got) != want {
			t.Errorf("word at %d: %#x, want %#x", word, got, want)
		}
	}
	if n := len(seccompData(0)); n != 64 {
		t.Errorf("seccomp_data of %d bytes", n)
	}
}
