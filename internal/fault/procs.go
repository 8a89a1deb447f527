package fault

import (
	"os"
	"strconv"
	"strings"
)

// proc is one line of the process table.
type proc struct {
	pid, ppid int
	comm      string
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
	if err != nil {
		return proc{}, false
	}
	return proc{pid: pid, ppid: ppid, comm: s[open+1 : end]}, true
}

// Descendants lists the processes below pid whose command name is comm.
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
			if c.comm == comm {
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
