package criu

import (
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// MinLazyPipeSize is the smallest fs.pipe-max-size with which CRIU's lazy
// page server works: CRIU grows its page pipes with F_SETPIPE_SZ, which is
// capped by this sysctl even for root, and with the 1 MiB default the first
// page fault fails ("page-pipe: splice: -1: Bad file descriptor").
const MinLazyPipeSize = 4 << 20

// Features are the optional capabilities that decide which migration
// strategies a host can use.
type Features struct {
	// DirtyTracking: the kernel has soft-dirty bits and CRIU can use them,
	// so CRIU pre-dump (iterative pre-copy) works.
	DirtyTracking bool
	// UffdNoncoop: userfaultfd as CRIU needs it for lazy pages.
	UffdNoncoop bool
	// LazyPages: post-copy is possible (UffdNoncoop and a large enough
	// PipeMaxSize).
	LazyPages bool
	// PipeMaxSize is fs.pipe-max-size in bytes, 0 when unreadable.
	PipeMaxSize int64
	// TCPRepair: this process can put a TCP socket into repair mode, which
	// CRIU needs to migrate established connections.
	TCPRepair bool
	// MPTCP: net.mptcp.enabled is 1 and an MPTCP socket can be opened.
	MPTCP bool
}

// ProbeFeatures checks every optional feature, running the probes that shell
// out to CRIU concurrently.
func ProbeFeatures(ctx context.Context) Features {
	var f Features
	var softDirty bool
	var wg sync.WaitGroup
	wg.Go(func() { f.UffdNoncoop = HasFeature(ctx, "uffd-noncoop") })
	wg.Go(func() { softDirty = HasFeature(ctx, "mem_dirty_track") })
	f.PipeMaxSize = PipeMaxSize()
	f.TCPRepair = canTCPRepair()
	f.MPTCP = canMPTCP()
	kernel, err := KernelOption("CONFIG_MEM_SOFT_DIRTY")
	wg.Wait()
	// Without a readable kernel config, CRIU's own answer has to do.
	f.DirtyTracking = softDirty && (err != nil || kernel == "y")
	f.LazyPages = f.UffdNoncoop && f.PipeMaxSize >= MinLazyPipeSize
	return f
}

// PipeMaxSize returns fs.pipe-max-size in bytes, or 0 if it cannot be read.
func PipeMaxSize() int64 {
	n, err := readSysctlInt("/proc/sys/fs/pipe-max-size")
	if err != nil {
		return 0
	}
	return n
}

func readSysctlInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// ErrNoKernelConfig means neither /proc/config.gz nor /boot/config-RELEASE
// could be read.
var ErrNoKernelConfig = errors.New("no readable kernel config")

// KernelOption returns the value of a kernel build option ("y", "m", a
// string) from /proc/config.gz or /boot/config-RELEASE, or "" when the
// option is not set.
func KernelOption(name string) (string, error) {
	r, closeFn, err := openKernelConfig()
	if err != nil {
		return "", err
	}
	defer closeFn()
	return findOption(r, name)
}

func openKernelConfig() (io.Reader, func(), error) {
	if f, err := os.Open("/proc/config.gz"); err == nil {
		zr, err := gzip.NewReader(f)
		if err == nil {
			return zr, func() { zr.Close(); f.Close() }, nil
		}
		f.Close()
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err == nil {
		if f, err := os.Open("/boot/config-" + unix.ByteSliceToString(u.Release[:])); err == nil {
			return f, func() { f.Close() }, nil
		}
	}
	return nil, nil, ErrNoKernelConfig
}

func findOption(r io.Reader, name string) (string, error) {
	sc := bufio.NewScanner(r)
	prefix := name + "="
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), prefix); ok {
			return strings.Trim(v, `"`), nil
		}
	}
	return "", sc.Err()
}

// canTCPRepair opens a TCP socket and switches on TCP_REPAIR, which needs
// CAP_NET_ADMIN; this is exactly what CRIU does for established connections.
func canTCPRepair() bool {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR, 1) == nil
}

// canMPTCP checks the sysctl an operator would change and then that the
// kernel really hands out an MPTCP socket (CONFIG_MPTCP).
func canMPTCP() bool {
	if n, err := readSysctlInt("/proc/sys/net/mptcp/enabled"); err != nil || n != 1 {
		return false
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_MPTCP)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}
