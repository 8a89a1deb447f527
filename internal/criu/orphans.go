package criu

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/ferry-migrate/ferry/internal/procs"
)

// KillWorkingIn kills (SIGKILL, by PID) every CRIU process with a file
// open, or its working directory, at or below dir, and returns their
// PIDs, sparing those working in a spare directory (a pull a restarted
// agent takes over). A migration's CRIU processes log into its work directory, so they
// are found even after the agent that started them died and they were
// reparented: a dump's page server left running would put back the
// freezer state it found when it ends, freezing again a container resumed
// meanwhile, and a stuck restore would hold its cgroups and mounts.
func KillWorkingIn(dir string, spare ...string) []int {
	dir = filepath.Clean(dir)
	var killed []int
	for _, pid := range procs.Named("criu") {
		if pid == os.Getpid() || !usesDir(pid, dir) || slices.ContainsFunc(spare, func(s string) bool { return usesDir(pid, filepath.Clean(s)) }) {
			continue
		}
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			killed = append(killed, pid)
		}
	}
	return killed
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
