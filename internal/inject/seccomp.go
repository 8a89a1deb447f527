//go:build linux && amd64

package inject

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"

	"github.com/ferry-migrate/ferry/internal/procs"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// allowed evaluates the stopped thread's seccomp filters (read with
// PTRACE_SECCOMP_GET_FILTER) for each call, as the kernel would: every
// filter runs and the most severe action wins. A call may be made if the
// verdict is to allow it, log it, or fail it with an errno (the caller
// then sees the errno); a kill, a trap, a tracer's or a supervisor's
// verdict makes ErrSeccomp. The arguments are not known here, so a
// filter that looks at them is evaluated with zeros.
func allowed(tid int, calls []uintptr) error {
	mode, err := seccompMode(tid)
	if err != nil {
		return err
	}
	if mode == 0 {
		return nil
	}
	if mode == 1 {
		return fmt.Errorf("%w (strict mode)", ErrSeccomp)
	}
	filters, err := seccompFilters(tid)
	if err != nil {
		return err
	}
	for _, nr := range calls {
		v, err := verdict(filters, nr)
		if err != nil {
			return fmt.Errorf("inject: evaluating a seccomp filter of %d: %w", tid, err)
		}
		if !letsThrough(v) {
			return fmt.Errorf("%w (system call %d: action %#x)", ErrSeccomp, nr, v&unix.SECCOMP_RET_ACTION_FULL)
		}
	}
	return nil
}

// verdict is what filters say of system call nr: every one runs and the
// most severe verdict wins.
func verdict(filters []*bpf.VM, nr uintptr) (uint32, error) {
	v := uint32(unix.SECCOMP_RET_ALLOW)
	for _, vm := range filters {
		ret, err := vm.Run(seccompData(nr))
		if err != nil {
			return 0, err
		}
		if action(uint32(ret)) < action(v) {
			v = uint32(ret)
		}
	}
	return v, nil
}

// letsThrough says whether a call may be made under verdict v: allowed,
// logged, or failed with an errno.
func letsThrough(v uint32) bool {
	switch v & unix.SECCOMP_RET_ACTION_FULL {
	case unix.SECCOMP_RET_ALLOW, unix.SECCOMP_RET_LOG, unix.SECCOMP_RET_ERRNO:
		return true
	}
	return false
}

// action orders verdicts by severity, as the kernel does: the lower, the
// more severe.
func action(ret uint32) int32 { return int32(ret & unix.SECCOMP_RET_ACTION_FULL) }

// seccompMode reads the thread's Seccomp line: 0 none, 1 strict, 2 filter.
func seccompMode(tid int) (int, error) {
	v, ok, err := procs.Status(tid, "Seccomp")
	if err != nil {
		return 0, fmt.Errorf("inject: %w", err)
	}
	switch {
	case !ok || v == "0":
		return 0, nil // none, or a kernel without seccomp
	case v == "1":
		return 1, nil
	default:
		return 2, nil
	}
}

// seccompFilters reads the thread's filters, newest first. The thread
// must be in a ptrace stop.
func seccompFilters(tid int) ([]*bpf.VM, error) {
	var vms []*bpf.VM
	for i := 0; ; i++ {
		n, err := ptraceFilter(tid, i, nil)
		if errors.Is(err, unix.ENOENT) {
			return vms, nil
		}
		if err != nil {
			return nil, fmt.Errorf("inject: seccomp filter %d of %d: %w", i, tid, err)
		}
		raw := make([]sockFilter, n)
		if _, err := ptraceFilter(tid, i, raw); err != nil {
			return nil, fmt.Errorf("inject: seccomp filter %d of %d: %w", i, tid, err)
		}
		prog := make([]bpf.Instruction, len(raw))
		for j, f := range raw {
			prog[j] = bpf.RawInstruction{Op: f.Code, Jt: f.Jt, Jf: f.Jf, K: f.K}.Disassemble()
		}
		vm, err := bpf.NewVM(prog)
		if err != nil {
			return nil, fmt.Errorf("inject: seccomp filter %d of %d: %w", i, tid, err)
		}
		vms = append(vms, vm)
	}
}

// sockFilter is the kernel's struct sock_filter.
type sockFilter struct {
	Code   uint16
	Jt, Jf uint8
	K      uint32
}

func ptraceFilter(tid, index int, out []sockFilter) (int, error) {
	var p unsafe.Pointer
	if len(out) > 0 {
		p = unsafe.Pointer(&out[0])
	}
	n, _, errno := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SECCOMP_GET_FILTER, uintptr(tid), uintptr(index), uintptr(p), 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// seccompData is struct seccomp_data for a call on x86-64, laid out for
// x/net/bpf, whose loads read 32-bit words big-endian where the kernel's
// read them in the machine's order: each word is stored big-endian here.
func seccompData(nr uintptr) []byte {
	words := [16]uint32{0: uint32(nr), 1: unix.AUDIT_ARCH_X86_64}
	b := make([]byte, 64)
	for i, w := range words {
		binary.BigEndian.PutUint32(b[4*i:], w)
	}
	return b
}
