package dirty

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// PAGEMAP_SCAN (linux/fs.h, Linux 6.7): an ioctl on /proc/PID/pagemap that
// reports ranges of pages by category and can write-protect the matching
// ones in the same walk.
const (
	pagemapScan = 0xc0606610 // _IOWR('f', 16, struct pm_scan_arg)

	scanWPMatching = 1 << 0

	pageWPAllowed = 1 << 0
	pageWritten   = 1 << 1
	pageFile      = 1 << 2
	pagePresent   = 1 << 3
	pageSwapped   = 1 << 4
	pagePFNZero   = 1 << 5
)

type pmScanArg struct {
	Size, Flags, Start, End, WalkEnd, Vec, VecLen, MaxPages       uint64
	CategoryInverted, CategoryMask, CategoryAnyofMask, ReturnMask uint64
}

// region is the kernel's struct page_region: [Start, End) with the
// categories asked for.
type region struct{ Start, End, Categories uint64 }

// scanRegions walks [start, end) of the process whose pagemap fd is given
// and appends the ranges of private memory pages it holds (present or
// swapped, not the page cache's or shared memory), each with whether it
// was written since the last scan and whether it can be tracked. With
// protect, the walk write-protects what it reports, so that the next
// scan reports what is written from now on. With anon, [start, end) holds
// only private anonymous memory, which has no page cache pages: the
// kernel then need not look up each page to tell (at 1 GiB, 3 ms against
// 19 here).
func scanRegions(pagemap int, start, end uint64, protect, anon bool, vec []region) ([]region, uint64, error) {
	a := pmScanArg{
		Start:             start,
		End:               end,
		Vec:               uint64(uintptr(unsafe.Pointer(&vec[:cap(vec)][0]))),
		VecLen:            uint64(cap(vec)),
		CategoryAnyofMask: pagePresent | pageSwapped,
		ReturnMask:        pageWritten | pageWPAllowed | pagePFNZero,
	}
	if !anon {
		a.CategoryInverted, a.CategoryMask = pageFile, pageFile
	}
	a.Size = uint64(unsafe.Sizeof(a))
	if protect {
		a.Flags = scanWPMatching
	}
	n, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(pagemap), pagemapScan, uintptr(unsafe.Pointer(&a)))
	if errno != 0 {
		return nil, 0, errno
	}
	return vec[:n], a.WalkEnd, nil
}
