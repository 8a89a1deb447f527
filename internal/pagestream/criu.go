package pagestream

import (
	"encoding/binary"
	"fmt"
	"math"
)

// CRIU page-server protocol constants (criu/page-xfer.c, criu/include/pagemap.h).
const (
	psIOVAdd        = 1
	psIOVHole       = 2
	psIOVOpen       = 3
	psIOVOpen2      = 4
	psIOVParent     = 5
	psIOVAddF       = 6
	psIOVGet        = 7
	psIOVClose      = 0x1023
	psIOVForceClose = 0x1024

	psCmdBits  = 16
	psTypeBits = 8
	psTypePID  = 1

	pePresent = 1 << 2

	// headerSize is sizeof(struct page_server_iov) on 64-bit Linux: u32 cmd,
	// 4 bytes of alignment padding, then three u64.
	headerSize = 32
)

// header is a decoded page_server_iov.
type header struct {
	cmd     uint32 // flags<<16 | command
	nrPages uint64
	vaddr   uint64
	dstID   uint64
}

func parseHeader(b []byte) header {
	return header{
		cmd:     binary.LittleEndian.Uint32(b[0:]),
		nrPages: binary.LittleEndian.Uint64(b[8:]),
		vaddr:   binary.LittleEndian.Uint64(b[16:]),
		dstID:   binary.LittleEndian.Uint64(b[24:]),
	}
}

// encode is parseHeader's inverse (the padding after cmd stays zero).
func (h header) encode() [headerSize]byte {
	var b [headerSize]byte
	binary.LittleEndian.PutUint32(b[0:], h.cmd)
	binary.LittleEndian.PutUint64(b[8:], h.nrPages)
	binary.LittleEndian.PutUint64(b[16:], h.vaddr)
	binary.LittleEndian.PutUint64(b[24:], h.dstID)
	return b
}

// isGet says whether the header is a lazy-pages daemon's GET.
func (h header) isGet() bool { return h.cmd&(1<<psCmdBits-1) == psIOVGet }

func (h header) encodeBytes() []byte {
	b := h.encode()
	return b[:]
}

// check rejects commands the page server does not know: their payload
// length cannot be known.
func (h header) check() error {
	switch h.cmd & (1<<psCmdBits - 1) {
	case psIOVAdd, psIOVHole, psIOVOpen, psIOVOpen2, psIOVParent, psIOVAddF, psIOVGet,
		psIOVClose, psIOVForceClose:
		return nil
	}
	return fmt.Errorf("%w: unknown page-server command %#x", ErrMalformed, h.cmd)
}

// payloadPages is how many pages of data follow the header.
func (h header) payloadPages() uint64 {
	switch h.cmd & (1<<psCmdBits - 1) {
	case psIOVAdd:
		return h.nrPages
	case psIOVAddF:
		if (h.cmd>>psCmdBits)&pePresent != 0 {
			return h.nrPages
		}
	}
	return 0
}

// wantsReply says whether the client waits for the server after this header.
func (h header) wantsReply() bool {
	switch h.cmd & (1<<psCmdBits - 1) {
	case psIOVOpen2, psIOVParent, psIOVGet, psIOVClose, psIOVForceClose:
		return true
	}
	return false
}

// lazyRequest says whether a lazy-pages daemon may send this: a GET or a
// close (every other command is a dump's).
func (h header) lazyRequest() bool {
	switch h.cmd & (1<<psCmdBits - 1) {
	case psIOVGet, psIOVClose, psIOVForceClose:
		return true
	}
	return false
}

// pid returns the pagemap id when the header addresses a task's pagemap;
// shmem pagemaps are not keyed and always go in full.
func (h header) pid() (uint32, bool) {
	if h.dstID&(1<<psTypeBits-1) != psTypePID {
		return 0, false
	}
	id := h.dstID >> psTypeBits
	if id > math.MaxUint32 {
		return 0, false
	}
	return uint32(id), true
}
