package rootfs

import (
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// CopyTree makes dst a copy of src with owners, modes, mtimes, symlinks,
// device nodes, fifos and extended attributes; hard links become separate
// files. dst is created if missing; what it already holds is brought in line
// with src, so a repeated copy only transfers changes. The root directory's
// own owner, mode and mtime are copied too.
func CopyTree(src, dst string) error {
	var st unix.Stat_t
	if err := unix.Stat(src, &st); err != nil {
		return fmt.Errorf("rootfs: copy: %s: %w", src, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("rootfs: copy: %s is not a directory", src)
	}
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return fmt.Errorf("rootfs: copy: %w", err)
	}
	have, err := Scan(dst)
	if err != nil {
		return err
	}
	want, err := Scan(src)
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := WriteDelta(pw, src, Diff(have, want))
		pw.CloseWithError(err)
		done <- err
	}()
	_, err = ApplyDelta(pr, dst)
	pr.CloseWithError(io.ErrClosedPipe) // unblock the writer if apply stopped early
	if werr := <-done; err == nil && werr != nil {
		err = werr
	}
	if err != nil {
		return fmt.Errorf("rootfs: copy %s to %s: %w", src, dst, err)
	}
	if err := os.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil && os.Geteuid() == 0 {
		return fmt.Errorf("rootfs: copy: %w", err)
	}
	if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
		return fmt.Errorf("rootfs: copy: chmod %s: %w", dst, err)
	}
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, 0); err != nil {
		return fmt.Errorf("rootfs: copy: utimes %s: %w", dst, err)
	}
	return nil
}
