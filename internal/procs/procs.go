// Package procs reads the host's process table from /proc: who a
// process's parent is, what it is called, what state it is in, what it
// holds open, how much memory it has resident. Callers
// find processes here and signal them by PID.
package procs

import (
	"fmt"
	"net"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// proc is one line of the process table.
type proc struct {
	pid, ppid int
	comm      string
	state     byte // R, S, D, T (stopped), Z (zombie)...
}

// table reads /proc: every process's PID, parent and command name.
func table() []proc {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		if p, ok := parseStat(pid, string(b)); ok {
			out = append(out, p)
		}
	}
	return out
}

// parseStat reads "PID (COMM) STATE PPID ...": the name may hold spaces
// and parentheses, so it ends at the last ')'.
func parseStat(pid int, s string) (proc, bool) {
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return proc{}, false
	}
	f := strings.Fields(s[end+1:])
	if len(f) < 2 {
		return proc{}, false
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil || len(f[0]) != 1 {
		return proc{}, false
	}
	return proc{pid: pid, ppid: ppid, comm: s[open+1 : end], state: f[0][0]}, true
}

// Descendants lists the processes below pid whose command name is comm
// (every one for "").
func Descendants(pid int, comm string) []int {
	t := table()
	children := map[int][]proc{}
	for _, p := range t {
		children[p.ppid] = append(children[p.ppid], p)
	}
	var out []int
	stack := []int{pid}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, c := range children[n] {
			if comm == "" || c.comm == comm {
				out = append(out, c.pid)
			}
			stack = append(stack, c.pid)
		}
	}
	return out
}

// Named lists every process on the host whose command name is comm (to
// find what outlived a migration).
func Named(comm string) []int {
	var out []int
	for _, p := range table() {
		if p.comm == comm {
			out = append(out, p.pid)
		}
	}
	return out
}

// Stranded maps each live process named comm whose parent, not itself
// named comm, also holds the corpse (an unreaped zombie) of a process of
// that name, to that parent. Such a process was forked by the one that
// died: as its sibling (CLONE_PARENT, as runc has CRIU restore), or as its
// child, handed on its death to the nearest child subreaper (runc run and
// restore are ones). The parent has not reaped the dead one: it waits for
// something the living still hold. (A process named comm reaping its own
// helpers late is no sign of that.)
func Stranded(comm string) map[int]int { return stranded(table(), comm) }

func stranded(t []proc, comm string) map[int]int {
	named := map[int]bool{}
	for _, p := range t {
		named[p.pid] = p.comm == comm
	}
	corpses := map[int]bool{} // parents of a zombie named comm
	for _, p := range t {
		if p.comm == comm && p.state == 'Z' && !named[p.ppid] {
			corpses[p.ppid] = true
		}
	}
	out := map[int]int{}
	for _, p := range t {
		if p.comm == comm && p.state != 'Z' && corpses[p.ppid] {
			out[p.pid] = p.ppid
		}
	}
	return out
}

// State is a process's state letter (R, S, D, T for stopped, Z for a
// zombie...); false when it is gone.
func State(pid int) (byte, bool) {
	p, ok := stat(pid)
	return p.state, ok
}

// Parent is a process's parent's PID; false when it is gone.
func Parent(pid int) (int, bool) {
	p, ok := stat(pid)
	return p.ppid, ok
}

// stat is pid's line of the process table.
func stat(pid int) (proc, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return proc{}, false
	}
	return parseStat(pid, string(b))
}

// OpenFiles maps each of pid's descriptors to what it points at: a path,
// "socket:[INODE]", "anon_inode:[userfaultfd]"... Empty when pid is gone.
func OpenFiles(pid int) map[int]string {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd/"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	out := make(map[int]string, len(ents))
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, err := os.Readlink(dir + e.Name()); err == nil {
			out[fd] = l // a descriptor closed meanwhile is left out
		}
	}
	return out
}

// HoldsSocket says whether pid has a descriptor open on the socket whose
// inode is ino.
func HoldsSocket(pid int, ino uint32) bool {
	want := "socket:[" + strconv.FormatUint(uint64(ino), 10) + "]"
	for _, l := range OpenFiles(pid) {
		if l == want {
			return true
		}
	}
	return false
}

// Status returns the value of field key (such as "Tgid") in
// /proc/PID/status, trimmed, and whether the file has that field. pid
// may be a thread's id: each thread has a status of its own.
func Status(pid int, key string) (string, bool, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return "", false, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, key+":"); ok {
			return strings.TrimSpace(rest), true, nil
		}
	}
	return "", false, nil
}

// StatusBytes returns a size in /proc/PID/status (key such as "VmRSS",
// "VmHWM", "RssAnon"), in bytes.
func StatusBytes(pid int, key string) (int64, error) {
	v, ok, err := Status(pid, key)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, fmt.Errorf("no %s in /proc/%d/status", key, pid)
	}
	kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(v, "kB")), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/status: %s: %w", pid, key, err)
	}
	return kb << 10, nil
}

// Resident is a process's resident memory (VmRSS); 0 when it is gone.
func Resident(pid int) int64 {
	n, _ := StatusBytes(pid, "VmRSS")
	return n
}

// TreeResident sums the resident memory of pid and its descendants (a
// container's processes, found through each task's children).
func TreeResident(pid int) int64 {
	var total int64
	seen := map[int]bool{}
	var walk func(int)
	walk = func(p int) {
		if seen[p] {
			return
		}
		seen[p] = true
		total += Resident(p)
		tasks, _ := os.ReadDir("/proc/" + strconv.Itoa(p) + "/task")
		for _, t := range tasks {
			b, err := os.ReadFile("/proc/" + strconv.Itoa(p) + "/task/" + t.Name() + "/children")
			if err != nil {
				continue
			}
			for _, c := range strings.Fields(string(b)) {
				if n, err := strconv.Atoi(c); err == nil {
					walk(n)
				}
			}
		}
	}
	walk(pid)
	return total
}

// WrittenFiles lists the files pid and the processes below it hold open
// for writing or map shared and writable, as those processes name them
// (their own root and mounts). A write through a shared mapping changes a
// file without a word to inotify; a rescan of what changed must look at
// these too.
func WrittenFiles(pid int) []string {
	seen := map[string]bool{}
	for _, p := range append([]int{pid}, Descendants(pid, "")...) {
		dir := "/proc/" + strconv.Itoa(p) + "/"
		for fd, path := range OpenFiles(p) {
			if !strings.HasPrefix(path, "/") {
				continue // a socket, pipe or anonymous inode
			}
			info, err := os.ReadFile(dir + "fdinfo/" + strconv.Itoa(fd))
			if err != nil {
				continue
			}
			if flags, ok := fdFlags(info); ok && flags&unix.O_ACCMODE != unix.O_RDONLY {
				seen[path] = true
			}
		}
		maps, err := os.ReadFile(dir + "maps")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(maps), "\n") {
			// start-end perms offset dev inode path
			f := strings.Fields(line)
			if len(f) >= 6 && len(f[1]) == 4 && f[1][1] == 'w' && f[1][3] == 's' && strings.HasPrefix(f[5], "/") {
				seen[strings.Join(f[5:], " ")] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for p := range seen {
		if !strings.HasSuffix(p, " (deleted)") {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

// fdFlags reads the octal "flags:" line of an fdinfo file.
func fdFlags(info []byte) (int, bool) {
	for _, line := range strings.Split(string(info), "\n") {
		if v, ok := strings.CutPrefix(line, "flags:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 8, 64)
			return int(n), err == nil
		}
	}
	return 0, false
}

// CmdlineHas says whether process pid runs with every one of args among
// its arguments: a PID read from a record is that process still, not
// another that took the number since.
func CmdlineHas(pid int, args ...string) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	have := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	for _, a := range args {
		if !slices.Contains(have, a) {
			return false
		}
	}
	return true
}

// SocketServer is the PID of the process that accepted a connection to
// the unix socket at path (SO_PEERCRED): who serves it now.
func SocketServer(path string) (int, error) {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	raw, err := c.(*net.UnixConn).SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) { cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return 0, err
	}
	if credErr != nil {
		return 0, credErr
	}
	return int(cred.Pid), nil
}

// StartTime is when pid started, in clock ticks after boot (field 22 of
// /proc/PID/stat): with the PID, it names one process for good, since a
// PID may be reused but not with the same start. False when pid is gone.
func StartTime(pid int) (uint64, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	s := string(b)
	end := strings.LastIndexByte(s, ')')
	if end < 0 {
		return 0, false
	}
	// After the name: state is field 3, so start time is the 20th.
	f := strings.Fields(s[end+1:])
	if len(f) < 20 {
		return 0, false
	}
	t, err := strconv.ParseUint(f[19], 10, 64)
	return t, err == nil
}

// InNamespace lists the processes in the namespace nsPath names (a
// bind-mounted namespace file such as /run/netns/NAME, or a process's
// /proc/PID/ns/KIND): those whose /proc/PID/ns/KIND is the same one.
func InNamespace(nsPath, kind string) ([]int, error) {
	var want unix.Stat_t
	if err := unix.Stat(nsPath, &want); err != nil {
		return nil, err
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Stat("/proc/"+e.Name()+"/ns/"+kind, &st) == nil && st.Dev == want.Dev && st.Ino == want.Ino {
			out = append(out, pid)
		}
	}
	return out, nil
}
