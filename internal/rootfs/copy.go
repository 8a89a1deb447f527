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
	attrs, err := ReadRootAttrs(src)
	if err != nil {
		return err
	}
	return attrs.Apply(dst)
}

// RootAttrs are the root directory's own owner, mode and mtime, which a
// manifest (paths below the root) does not carry. CRIU cares: a restored
// task must be able to open its root.
type RootAttrs struct {
	Mode    uint32 `json:"mode"`
	UID     int    `json:"uid"`
	GID     int    `json:"gid"`
	MtimeNs int64  `json:"mtime_ns"`
}

// ReadRootAttrs reads dir's own attributes.
func ReadRootAttrs(dir string) (RootAttrs, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return RootAttrs{}, fmt.Errorf("rootfs: %s: %w", dir, err)
	}
	return RootAttrs{Mode: st.Mode & 0o7777, UID: int(st.Uid), GID: int(st.Gid), MtimeNs: st.Mtim.Nano()}, nil
}

// Apply gives dir these attributes.
func (a RootAttrs) Apply(dir string) error {
	if err := os.Lchown(dir, a.UID, a.GID); err != nil && os.Geteuid() == 0 {
		return fmt.Errorf("rootfs: chown %s: %w", dir, err)
	}
	if err := unix.Chmod(dir, a.Mode&0o7777); err != nil {
		return fmt.Errorf("rootfs: chmod %s: %w", dir, err)
	}
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(a.MtimeNs)}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dir, ts, 0); err != nil {
		return fmt.Errorf("rootfs: utimes %s: %w", dir, err)
	}
	return nil
}
