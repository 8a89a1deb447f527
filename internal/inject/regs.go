//go:build linux && amd64

package inject

import (
	"bytes"
	"fmt"
	"os"
	"strconv"

	"github.com/ferry-migrate/ferry/internal/procs"
	"golang.org/x/sys/unix"
)

// Errors a system call interrupted by a stop returns inside the kernel;
// the kernel restarts the call on the way back to user space unless a
// signal handler runs.
const (
	errRestartSys        = 512
	errRestartNoIntr     = 513
	errRestartNoHand     = 514
	errRestartBlock      = 516
	sysRestartSyscall    = 219 // restart_syscall(2)
	syscallInsnLen       = 2   // 0f 05
	maxSyscallSearchSize = 1 << 20
)

// restartable returns registers that resume the thread where it stopped,
// with a system call it was interrupted in made again, as the kernel
// would have: the calls made in between must not see the kernel's
// restart applied to their registers, so the restart is done here and
// the kernel is told the thread is in no system call.
func restartable(r unix.PtraceRegs) unix.PtraceRegs {
	if int64(r.Orig_rax) >= 0 {
		switch -int64(r.Rax) {
		case errRestartSys, errRestartNoIntr, errRestartNoHand:
			r.Rax = r.Orig_rax
			r.Rip -= syscallInsnLen
		case errRestartBlock:
			r.Rax = sysRestartSyscall
			r.Rip -= syscallInsnLen
		}
	}
	r.Orig_rax = ^uint64(0)
	return r
}

// syscallInsn finds a syscall instruction (0f 05) in the process's vDSO,
// or else in its first executable mapping.
func syscallInsn(tid int) (uintptr, error) {
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", tid))
	if err != nil {
		return 0, fmt.Errorf("inject: %w", err)
	}
	var candidates [][2]uint64
	for _, m := range procs.ParseMaps(maps) {
		if !m.Readable() || !m.Executable() {
			continue
		}
		r := [2]uint64{m.Start, min(m.End, m.Start+maxSyscallSearchSize)}
		if m.Path == "[vdso]" {
			candidates = append([][2]uint64{r}, candidates...)
		} else {
			candidates = append(candidates, r)
		}
	}
	for _, r := range candidates {
		buf := make([]byte, r[1]-r[0])
		n, err := readMem(tid, r[0], buf)
		if err != nil || n < syscallInsnLen {
			continue
		}
		if i := bytes.Index(buf[:n], []byte{0x0f, 0x05}); i >= 0 {
			return uintptr(r[0]) + uintptr(i), nil
		}
	}
	return 0, fmt.Errorf("inject: no syscall instruction found in the executable mappings of %d", tid)
}

// readMem reads the process's memory through /proc/PID/mem, which reads
// mappings without read permission too.
func readMem(tid int, addr uint64, buf []byte) (int, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/mem", tid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.ReadAt(buf, int64(addr))
}

// tgidOf returns the process a thread belongs to.
func tgidOf(tid int) (int, error) {
	v, ok, err := procs.Status(tid, "Tgid")
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, fmt.Errorf("inject: no Tgid in /proc/%d/status", tid)
	}
	return strconv.Atoi(v)
}
