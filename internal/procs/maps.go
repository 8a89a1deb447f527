package procs

import (
	"bytes"
	"strconv"
	"strings"
)

// Mapping is one line of /proc/PID/maps.
type Mapping struct {
	Start, End uint64
	Perms      string // "rw-p": read, write, execute, private or shared
	Path       string // a file, "[stack]", "[vdso]"...; "" for anonymous memory
}

// Readable, Executable and Private read the mapping's permissions.
func (m Mapping) Readable() bool   { return m.Perms[0] == 'r' }
func (m Mapping) Executable() bool { return m.Perms[2] == 'x' }
func (m Mapping) Private() bool    { return m.Perms[3] == 'p' }

// Anonymous says the mapping is private memory with no file behind it
// (anonymous, the heap, a stack, or named with PR_SET_VMA_ANON_NAME): its
// pages are all the process's own, none the page cache's.
func (m Mapping) Anonymous() bool {
	if !m.Private() {
		return false
	}
	switch {
	case m.Path == "", m.Path == "[heap]", m.Path == "[stack]",
		strings.HasPrefix(m.Path, "[anon:"), strings.HasPrefix(m.Path, "[stack:"):
		return true
	}
	return false
}

// ParseMaps reads the lines of a /proc/PID/maps, skipping any it cannot
// parse.
func ParseMaps(maps []byte) []Mapping {
	var out []Mapping
	for len(maps) > 0 {
		line := maps
		if i := bytes.IndexByte(maps, '\n'); i >= 0 {
			line, maps = maps[:i], maps[i+1:]
		} else {
			maps = nil
		}
		// start-end perms offset dev inode [path]
		f := bytes.Fields(line)
		if len(f) < 5 || len(f[1]) < 4 {
			continue
		}
		lo, hi, ok := bytes.Cut(f[0], []byte("-"))
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(string(lo), 16, 64)
		end, err2 := strconv.ParseUint(string(hi), 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			continue
		}
		m := Mapping{Start: start, End: end, Perms: string(f[1])}
		if len(f) >= 6 {
			m.Path = string(bytes.Join(f[5:], []byte(" ")))
		}
		out = append(out, m)
	}
	return out
}

// PrivateMappings picks the mappings a process's own private memory lives
// in (what CRIU dumps pages of): those OwnMemory says so of.
func PrivateMappings(maps []byte) []Mapping {
	var out []Mapping
	for _, m := range ParseMaps(maps) {
		if m.OwnMemory() {
			out = append(out, m)
		}
	}
	return out
}

// OwnMemory says the mapping holds the process's own private memory:
// private, readable or writable, and not the kernel's (vsyscall, vvar,
// vdso).
func (m Mapping) OwnMemory() bool {
	if !m.Private() || m.Perms[0] != 'r' && m.Perms[1] != 'w' {
		return false
	}
	switch m.Path {
	case "[vsyscall]", "[vvar]", "[vdso]", "[vvar_vclock]":
		return false
	}
	return true
}
