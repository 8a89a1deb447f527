package criu

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// IrmapScanPaths are the top of process pid's root filesystem (each
// directory and file at its top on the root's own filesystem, as the
// process names it: CRIU scans a directory whole) where CRIU looks for a path to an inode whose file handle it
// cannot open: an inotify watch on a file of an overlay root, whose
// handles the kernel does not export. CRIU scans them only for such a
// watch, and scans none of its own hints there (/etc, /var/log and a few
// more), so without them such a container does not dump ("fsnotify:
// Can't dump that handle").
func IrmapScanPaths(pid int) []string {
	root := fmt.Sprintf("/proc/%d/root", pid)
	var rst syscall.Stat_t
	if err := syscall.Stat(root, &rst); err != nil {
		return nil
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() && !e.Type().IsRegular() {
			continue
		}
		var st syscall.Stat_t
		// A mount point (proc, sys, dev, a volume) is another filesystem.
		if err := syscall.Lstat(filepath.Join(root, e.Name()), &st); err != nil || st.Dev != rst.Dev {
			continue
		}
		out = append(out, "/"+e.Name())
	}
	return out
}
