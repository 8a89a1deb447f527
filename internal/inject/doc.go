// Package inject runs system calls inside another process, as one of its
// own threads would: the way CRIU's compel drives a parasite, reduced to
// single system calls. ferry uses it to create a userfaultfd in a
// container's process (a userfaultfd watches the memory of the process
// that created it) and to close that process's copy once the agent took
// it over with pidfd_getfd.
//
// The thread is stopped with PTRACE_SEIZE and PTRACE_INTERRUPT, its
// registers are saved, each call is made by single-stepping over a
// syscall instruction the process already maps (its vDSO's), and the
// registers are put back. Nothing is written into the process's memory.
// A system call the thread was sleeping in is restarted as the kernel
// would have restarted it. Before anything runs, the thread's seccomp
// filters are evaluated for each call: a call they would not let through
// (kill, trap, a supervisor) is never made.
//
// The one hazard is compel's too: if the tracer dies between putting the
// call's registers in and putting the thread's back (microseconds), the
// kernel detaches and the thread runs on with the call's registers.
// Nothing here can guard against that; keep sessions short.
package inject

import "errors"

// ErrSeccomp is returned, before anything ran, when the thread's seccomp
// filters would do anything but let a call through or fail it with an
// errno.
var ErrSeccomp = errors.New("inject: the process's seccomp filters would not let the call through")

// ErrStopped is returned when the thread is in a group stop (SIGSTOP):
// running a call would resume it.
var ErrStopped = errors.New("inject: the process is stopped")
