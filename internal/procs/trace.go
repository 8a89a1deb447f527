package procs

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Tracees lists the threads tracer traces (ptrace): every thread on the
// host whose own status names it as TracerPid.
func Tracees(tracer int) []int {
	want := strconv.Itoa(tracer)
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		tasks, _ := os.ReadDir("/proc/" + e.Name() + "/task") // gone meanwhile: none
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			if v, ok, err := Status(tid, "TracerPid"); err == nil && ok && v == want {
				out = append(out, tid)
			}
		}
	}
	return out
}

// ProgramCounter is the address of a thread's next user instruction, from
// /proc/TID/syscall's last field; running is true when the thread runs,
// of which the kernel tells nothing.
func ProgramCounter(tid int) (pc uint64, running bool, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/syscall", tid))
	if err != nil {
		return 0, false, err
	}
	return parseSyscallPC(string(b))
}

// parseSyscallPC reads "running", "NR ARG1..ARG6 SP PC" (in a system call)
// or "-1 SP PC" (not in one).
func parseSyscallPC(s string) (pc uint64, running bool, err error) {
	s = strings.TrimSpace(s)
	if s == "running" {
		return 0, true, nil
	}
	f := strings.Fields(s)
	if len(f) != 3 && len(f) != 9 {
		return 0, false, fmt.Errorf("unexpected /proc/TID/syscall: %q", s)
	}
	pc, err = strconv.ParseUint(strings.TrimPrefix(f[len(f)-1], "0x"), 16, 64)
	return pc, false, err
}

// Dying says whether pid is a zombie or dumping core: a process killed by
// a signal can take a while to write its core, and its runtime calls it
// running meanwhile. A PID that is gone is not dying (its runtime knows).
func Dying(pid int) bool {
	if v, ok, err := Status(pid, "CoreDumping"); err == nil && ok && v == "1" {
		return true
	}
	st, ok := State(pid)
	return ok && (st == 'Z' || st == 'X')
}
