package dirty

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// userfaultfd(2)'s flag and ioctls, from linux/userfaultfd.h (x/sys has
// the system call's number only).
const (
	uffdUserModeOnly = 1

	uffdAPI = 0xaa

	uffdioAPI      = 0xc018aa3f // _IOWR(0xaa, 0x3f, struct uffdio_api)
	uffdioRegister = 0xc020aa00 // _IOWR(0xaa, 0x00, struct uffdio_register)

	featureWPAsync       = 1 << 15
	featureWPUnpopulated = 1 << 13

	registerModeWP = 2
)

type uffdioAPIArg struct{ API, Features, Ioctls uint64 }

type uffdRange struct{ Start, Len uint64 }

type uffdioRegisterArg struct {
	Range        uffdRange
	Mode, Ioctls uint64
}

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if errno != 0 {
		return errno
	}
	return nil
}

// enableWPAsync turns a new userfaultfd's asynchronous write protection
// on: a write to a protected page is never held, the kernel just lifts
// the protection, and PAGEMAP_SCAN reports the page as written.
func enableWPAsync(fd int) error {
	a := uffdioAPIArg{API: uffdAPI, Features: featureWPAsync | featureWPUnpopulated}
	if err := ioctl(fd, uffdioAPI, unsafe.Pointer(&a)); err != nil {
		return fmt.Errorf("dirty: UFFDIO_API with asynchronous write protection: %w", err)
	}
	return nil
}

// registerWP registers [start, end) for write protection.
func registerWP(fd int, start, end uint64) error {
	r := uffdioRegisterArg{Range: uffdRange{Start: start, Len: end - start}, Mode: registerModeWP}
	return ioctl(fd, uffdioRegister, unsafe.Pointer(&r))
}
