package procs

import (
	"bufio"
	"bytes"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// A process's working set, as the kernel's page-table accessed bits see it:
// ClearReferenced clears them (/proc/PID/clear_refs), and Referenced sums,
// over the mappings whose pages CRIU moves, the memory touched since
// (smaps' Referenced). This kernel has no idle page tracking; these two
// files are what is left. (A service's working set did not predict how
// long its first requests wait after a post-copy restore: docs/MODEL.md.)

// ClearReferenced clears the accessed bits of pid's pages.
func ClearReferenced(pid int) error {
	return os.WriteFile("/proc/"+strconv.Itoa(pid)+"/clear_refs", []byte("1"), 0)
}

// Referenced returns the bytes of pid's private memory referenced since
// the last ClearReferenced.
func Referenced(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps")
	if err != nil {
		return 0, err
	}
	return referencedPrivate(b), nil
}

// referencedPrivate sums the Referenced lines of an smaps table's private
// mappings (PrivateMappings' rule).
func referencedPrivate(smaps []byte) int64 {
	var total int64
	counting := false
	sc := bufio.NewScanner(bytes.NewReader(smaps))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if f := bytes.Fields(line); len(f) >= 5 && bytes.IndexByte(f[0], '-') > 0 && !bytes.HasSuffix(f[0], []byte(":")) {
			counting = len(PrivateMappings(append(line, '\n'))) == 1
			continue
		}
		if v, ok := bytes.CutPrefix(line, []byte("Referenced:")); ok && counting {
			f := bytes.Fields(v)
			if len(f) == 2 && string(f[1]) == "kB" {
				if kb, err := strconv.ParseInt(string(f[0]), 10, 64); err == nil {
					total += kb << 10
				}
			}
		}
	}
	return total
}

// SharedMemory returns the bytes held by the shared memory objects the
// processes map (anonymous shared mappings, System V and POSIX shared
// memory, memfds: whatever tmpfs backs), each object counted once,
// whatever the processes touched of it. CRIU dumps these whole, and while
// the container is frozen: no pre-copy round reads them and no lazy dump
// leaves them behind.
func SharedMemory(pids []int) int64 {
	type object struct{ dev, ino uint64 }
	seen := map[object]bool{}
	var total int64
	for _, pid := range pids {
		dir := "/proc/" + strconv.Itoa(pid) + "/"
		maps, err := os.ReadFile(dir + "maps")
		if err != nil {
			continue
		}
		for _, m := range ParseMaps(maps) {
			if m.Private() {
				continue
			}
			path := dir + "map_files/" + strconv.FormatUint(m.Start, 16) + "-" + strconv.FormatUint(m.End, 16)
			var fs unix.Statfs_t
			var st unix.Stat_t
			if unix.Statfs(path, &fs) != nil || fs.Type != unix.TMPFS_MAGIC || unix.Stat(path, &st) != nil {
				continue
			}
			if o := (object{st.Dev, st.Ino}); !seen[o] {
				seen[o] = true
				total += st.Blocks * 512
			}
		}
	}
	return total
}
