// Package pagestream shrinks CRIU's page-server stream for content-based
// pre-copy: pages the destination already holds with the same hash are sent
// as short references and re-expanded at the destination.
//
// CRIU's page-server client (criu/page-xfer.c, CRIU 4.2.1) sends a sequence of
// 32-byte headers, each the host-order struct
//
//	struct page_server_iov { u32 cmd; /* 4 bytes padding */ u64 nr_pages; u64 vaddr; u64 dst_id; }
//
// with cmd = flags<<16 | command. PS_IOV_ADD and PS_IOV_ADD_F with PE_PRESENT
// in its flags are followed by nr_pages*4096 bytes of page data; nothing else
// carries a payload from the client. OPEN2, PARENT, CLOSE, FORCE_CLOSE and
// GET make the client wait for a reply, which travels the other way and is
// not handled here.
//
// Dedup turns that stream into ferry's encoded stream:
//
//	stream = magic record* end
//	magic  = "FPS" 0x01
//	record = 'H' header[32]                      a CRIU header, verbatim
//	       | 'P' n:u32 data[n*4096]              n >= 1 pages in full
//	       | 'R' pid:u32 addr:u64 hi:u64 lo:u64  one page by reference
//	end    = 'E'
//
// Integers are little-endian; hi and lo are the halves of the page's XXH3-128.
// 'P' and 'R' records appear only inside a header's payload and together
// cover exactly its nr_pages pages, in order. The end record tells a clean end
// from a channel that broke at a record boundary.
//
// Both sides flush their buffered output before any read that would block, so
// a header that makes CRIU wait for a reply is always delivered.
package pagestream

import (
	"errors"

	"github.com/zeebo/xxh3"

	"github.com/ferry-migrate/ferry/internal/pages"
)

// PageKey identifies a page the destination may hold: PID is the CRIU
// pagemap id (the pid inside the container's pid namespace, the id in a
// dst_id of type PS_TYPE_PID), Addr the page's virtual address. It is the
// key pre-copy's rounds use, so stores and lookups need no conversion.
type PageKey = pages.Key

// Hash is a page's XXH3-128.
type Hash = xxh3.Uint128

// HashPage returns the hash Dedup and Expand compare pages by.
func HashPage(page []byte) Hash { return xxh3.Hash128(page) }

// Lookup says what hash the destination's copy of a page has, if any.
type Lookup func(k PageKey) (Hash, bool)

// Source gives the destination's copy of a page (data valid until the next
// call) and its hash.
type Source func(k PageKey) (data []byte, h Hash, ok bool)

// DedupStats counts what Dedup did. Pages counts page payloads seen,
// Referenced those sent as references; BytesIn is CRIU stream bytes read,
// BytesOut encoded bytes written.
type DedupStats struct {
	Pages, Referenced uint64
	BytesIn, BytesOut int64
}

// ExpandStats counts what Expand did. Pages counts pages written to CRIU,
// Referenced those taken from the Source; BytesIn is encoded bytes read,
// BytesOut CRIU stream bytes written.
type ExpandStats struct {
	Pages, Referenced uint64
	BytesIn, BytesOut int64
}

var (
	// ErrMalformed reports a stream that breaks the CRIU protocol or the
	// encoded format.
	ErrMalformed = errors.New("pagestream: malformed stream")
	// ErrPageMismatch reports a reference to a page the destination lacks
	// or holds with other content than the source dumped.
	ErrPageMismatch = errors.New("pagestream: referenced page missing or different")
)

// PageSize is the page size CRIU's stream uses (x86_64, arm64 with 4K pages).
const PageSize = 4096

// bufSize is the size of every read and write buffer.
const bufSize = 1 << 20

var magic = [4]byte{'F', 'P', 'S', 1}

const (
	tagHeader byte = 'H'
	tagPages  byte = 'P'
	tagRef    byte = 'R'
	tagEnd    byte = 'E'

	refSize = 4 + 8 + 8 + 8
)
