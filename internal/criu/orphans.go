package criu

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ferry-migrate/ferry/internal/procs"
)

// InsidePatience is how long KillWorkingIn waits for a CRIU whose code
// runs inside a process it dumps to step out before killing it anyway.
const InsidePatience = 30 * time.Second

// KillWorkingIn kills (SIGKILL, by PID) every CRIU process with a file
// open, or its working directory, at or below dir, and returns their
// PIDs, sparing those working in a spare directory (a pull a restarted
// agent takes over). A migration's CRIU processes log into its work
// directory, so they are found even after the agent that started them
// died and they were reparented: a dump's page server left running would
// put back the freezer state it found when it ends, freezing again a
// container resumed meanwhile, and a stuck restore would hold its cgroups
// and mounts.
//
// A CRIU is never killed while its code runs inside a process it dumps
// (Inside): that process would go on from CRIU's registers and die. It is
// waited for, up to InsidePatience; forced lists those killed inside all
// the same, when the wait ran out.
func KillWorkingIn(dir string, spare ...string) (killed, forced []int) {
	return killWorkingIn(dir, InsidePatience, spare...)
}

func killWorkingIn(dir string, patience time.Duration, spare ...string) (killed, forced []int) {
	dir = filepath.Clean(dir)
	deadline := time.Now().Add(patience)
	for _, pid := range procs.Named("criu") {
		if pid == os.Getpid() || !usesDir(pid, dir) || slices.ContainsFunc(spare, func(s string) bool { return usesDir(pid, filepath.Clean(s)) }) {
			continue
		}
		inside, ok := killOutside(pid, deadline)
		if ok {
			killed = append(killed, pid)
		}
		if ok && inside {
			forced = append(forced, pid)
		}
	}
	return killed, forced
}

// killOutside stops CRIU pid (SIGSTOP), so that it cannot go into a
// process between the look and the kill, and kills it once it is not
// Inside one; until deadline, a CRIU inside is let go on (SIGCONT) and
// looked at again. killed is false when pid was gone.
func killOutside(pid int, deadline time.Time) (inside, killed bool) {
	if !procs.StopWhen(pid, 20*time.Millisecond, func() bool {
		inside = Inside(pid)
		return !inside || !time.Now().Before(deadline)
	}) {
		return false, false
	}
	return inside, syscall.Kill(pid, syscall.SIGKILL) == nil
}

// Inside says whether the code of CRIU tracer runs inside a process it
// traces, the way CRIU's compel library runs it: a thread of that process
// runs while traced (a system call CRIU injected, the parasite), or is
// stopped in the first bytes of an executable mapping, where compel
// writes the system call it injects, or in a shared executable mapping,
// the parasite's (memfd:CRIUMFD). Let go by CRIU's death, such a thread
// would run on from CRIU's registers and code, and die.
func Inside(tracer int) bool {
	for _, tid := range procs.Tracees(tracer) {
		pc, running, err := procs.ProgramCounter(tid)
		if err != nil {
			continue // gone
		}
		if running {
			return true
		}
		maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", tid))
		if err == nil && compelAt(procs.ParseMaps(maps), pc) {
			return true
		}
	}
	return false
}

// compelCode covers the system call compel writes at the start of an
// executable mapping (8 bytes) and where a thread stops after it.
const compelCode = 16

// compelAt says whether pc is where compel's code would be: the first
// compelCode bytes of an executable mapping, or a shared executable one
// (a program's own code is private).
func compelAt(maps []procs.Mapping, pc uint64) bool {
	for _, m := range maps {
		if m.Executable() && pc >= m.Start && pc < m.End {
			return !m.Private() || pc-m.Start < compelCode
		}
	}
	return false
}

// usesDir says whether pid's working directory or an open file is at or
// below dir.
func usesDir(pid int, dir string) bool {
	under := func(p string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }
	proc := filepath.Join("/proc", strconv.Itoa(pid))
	if cwd, err := os.Readlink(filepath.Join(proc, "cwd")); err == nil && under(cwd) {
		return true
	}
	for _, t := range procs.OpenFiles(pid) {
		if under(t) {
			return true
		}
	}
	return false
}

// Abandoned lists the CRIU processes working in any of dirs that a CRIU
// which died left behind (procs.Stranded). A restore's CRIU forks the
// container's tasks (and helpers of its own) before it restores them,
// and they hold the socket its runtime (runc) reads CRIU's answer from.
// When that CRIU is killed, they wait for its word for ever, and the
// runtime, which would reap it once the socket ends, waits on them. They
// are the container half restored, no use to anyone.
func Abandoned(dirs ...string) []int {
	var out []int
	for pid, parent := range procs.Stranded("criu") {
		// ferry reaps its own CRIUs (a page server's corpse lasts until
		// its Wait): their children are not the runtime's.
		if parent != os.Getpid() && slices.ContainsFunc(dirs, func(d string) bool { return usesDir(pid, filepath.Clean(d)) }) {
			out = append(out, pid)
		}
	}
	slices.Sort(out)
	return out
}

// WatchAbandoned kills (SIGKILL, by PID) the CRIU processes working in
// any of dirs that a dead CRIU left behind (Abandoned), each once seen at
// two looks every apart (not a child caught between its parent's death
// and the reap), until stop is first called. killed is told each PID it
// killed.
func WatchAbandoned(every time.Duration, killed func(pid int), dirs ...string) (stop func()) {
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		t := time.NewTicker(every)
		defer t.Stop()
		var seen []int
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			now := Abandoned(dirs...)
			for _, pid := range now {
				if slices.Contains(seen, pid) && syscall.Kill(pid, syscall.SIGKILL) == nil {
					killed(pid)
				}
			}
			seen = now
		}
	}()
	return sync.OnceFunc(func() { close(done); <-ended })
}
