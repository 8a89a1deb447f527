package procs

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
)

// A process's working set, as the kernel's page-table accessed bits see it:
// ClearReferenced clears them (/proc/PID/clear_refs), and Referenced sums,
// over the mappings whose pages CRIU moves, the memory touched since
// (smaps' Referenced). This kernel has no idle page tracking; the two
// files are what is left, and what a post-copy restore must fault in
// first.

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
