package images

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/checkpoint-restore/go-criu/v7/magic"
	"google.golang.org/protobuf/encoding/protowire"
)

// PageSize is the page size of the images' memory.
const PageSize = 4096

// Pagemap entry flags (criu/include/pagemap.h).
const (
	PageParent  = 1 << 0 // the pages are in the parent images
	PageLazy    = 1 << 1 // restored by a lazy-pages daemon; alone: not in pages-*.img
	PagePresent = 1 << 2 // in this directory's pages-*.img, in entry order
)

// PagemapEntry is one run of pages of a task's memory.
type PagemapEntry struct {
	Vaddr   uint64
	NrPages uint32
	Flags   uint32
}

// Pagemap is one task's pagemap-<pid>.img: which pages its dump holds and
// where their contents are.
type Pagemap struct {
	PID     uint32 // the task's pid in its own namespace, as CRIU names it
	PagesID uint32 // the contents are in pages-<PagesID>.img
	Entries []PagemapEntry
}

// ReadPagemaps decodes every pagemap image in dir.
func ReadPagemaps(dir string) ([]Pagemap, error) {
	names, err := filepath.Glob(filepath.Join(dir, "pagemap-*.img"))
	if err != nil {
		return nil, err
	}
	var out []Pagemap
	for _, path := range names {
		pid, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(path), "pagemap-"), ".img"), 10, 32)
		if err != nil {
			continue // pagemap-shmem-*.img and the like are not a task's
		}
		pm, err := readPagemap(path)
		if err != nil {
			return nil, err
		}
		pm.PID = uint32(pid)
		out = append(out, pm)
	}
	return out, nil
}

// CRIU image framing: a common magic, the image's magic, then entries, each
// a little-endian u32 length and a protobuf message. The messages are
// decoded with protowire: CRIU 4 moved nr_pages to field 5 (uint64), which
// the generated types in go-criu v7 predate.
var (
	magics       = magic.LoadMagic()
	magicCommon  = uint32(magics.ByName["IMG_COMMON"])
	magicPagemap = uint32(magics.ByName["PAGEMAP"])
)

// pagemap.proto field numbers.
const (
	fieldPagesID       = 1 // pagemap_head
	fieldVaddr         = 1 // pagemap_entry
	fieldCompatNrPages = 2
	fieldInParent      = 3
	fieldFlags         = 4
	fieldNrPages       = 5
)

// maxEntry bounds one image entry: pagemap entries are a few bytes.
const maxEntry = 1 << 16

func readPagemap(path string) (Pagemap, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Pagemap{}, err
	}
	pm, err := decodePagemap(b)
	if err != nil {
		return Pagemap{}, fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	return pm, nil
}

// decodePagemap decodes a pagemap image's bytes.
func decodePagemap(b []byte) (Pagemap, error) {
	if len(b) < 8 || binary.LittleEndian.Uint32(b) != magicCommon || binary.LittleEndian.Uint32(b[4:]) != magicPagemap {
		return Pagemap{}, errors.New("not a pagemap image")
	}
	b = b[8:]
	var pm Pagemap
	for first := true; len(b) > 0; first = false {
		if len(b) < 4 {
			return Pagemap{}, errors.New("truncated entry")
		}
		n := binary.LittleEndian.Uint32(b)
		if n > maxEntry || int(n) > len(b)-4 {
			return Pagemap{}, fmt.Errorf("entry of %d bytes", n)
		}
		fields, err := varintFields(b[4 : 4+n])
		if err != nil {
			return Pagemap{}, err
		}
		b = b[4+n:]
		if first {
			pm.PagesID = uint32(fields[fieldPagesID])
			continue
		}
		e := PagemapEntry{Vaddr: fields[fieldVaddr], Flags: uint32(fields[fieldFlags])}
		nr, ok := fields[fieldNrPages]
		if !ok {
			nr = fields[fieldCompatNrPages]
		}
		if nr > 1<<32-1 || e.Vaddr%PageSize != 0 {
			return Pagemap{}, fmt.Errorf("bad entry: %d pages at %#x", nr, e.Vaddr)
		}
		e.NrPages = uint32(nr)
		if _, ok := fields[fieldFlags]; !ok {
			// Images older than the flags field: in_parent or present.
			e.Flags = PagePresent
			if fields[fieldInParent] != 0 {
				e.Flags = PageParent
			}
		}
		pm.Entries = append(pm.Entries, e)
	}
	return pm, nil
}

// varintFields decodes a message whose fields are all varints.
func varintFields(b []byte) (map[protowire.Number]uint64, error) {
	fields := map[protowire.Number]uint64{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		if typ != protowire.VarintType {
			// Not a pagemap field ferry knows: skip it.
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		fields[num] = v
		b = b[n:]
	}
	return fields, nil
}

// encodePagemap is decodePagemap's inverse.
func encodePagemap(pm Pagemap) []byte {
	var buf []byte
	buf = binary.LittleEndian.AppendUint32(buf, magicCommon)
	buf = binary.LittleEndian.AppendUint32(buf, magicPagemap)
	entry := func(fields ...uint64) {
		var m []byte
		for i := 0; i < len(fields); i += 2 {
			m = protowire.AppendTag(m, protowire.Number(fields[i]), protowire.VarintType)
			m = protowire.AppendVarint(m, fields[i+1])
		}
		buf = binary.LittleEndian.AppendUint32(buf, uint32(len(m)))
		buf = append(buf, m...)
	}
	entry(fieldPagesID, uint64(pm.PagesID))
	for _, e := range pm.Entries {
		entry(fieldVaddr, e.Vaddr, fieldCompatNrPages, uint64(e.NrPages), fieldFlags, uint64(e.Flags), fieldNrPages, uint64(e.NrPages))
	}
	return buf
}

// writePagemap replaces dir's pagemap-<pid>.img with pm.
func writePagemap(dir string, pm Pagemap) error {
	path := filepath.Join(dir, fmt.Sprintf("pagemap-%d.img", pm.PID))
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, encodePagemap(pm), 0o600); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// PageSource supplies the pages a lazy dump left out of its images.
type PageSource struct {
	// Local copies the page at addr of task pid into dst (PageSize bytes)
	// when this host holds its current contents.
	Local func(pid uint32, addr uint64, dst []byte) bool
	// Fetch fills dst (a multiple of PageSize) with the pages from addr on,
	// from the dumped task itself; called for the runs Local lacks.
	Fetch func(pid uint32, addr uint64, dst []byte) error
	// ParentRun, when set, says how many pages from addr on, at most n,
	// the dump's parent image holds current (ParentImage.HeldRun): those
	// become parent references, no copy.
	ParentRun func(pid uint32, addr, n uint64) uint64
}

// inParent is how many pages from addr on, at most n, the parent holds.
func (s PageSource) inParent(pid uint32, addr, n uint64) uint64 {
	if s.ParentRun == nil {
		return 0
	}
	return s.ParentRun(pid, addr, n)
}

// FillStats counts where the pages of a filled-in dump came from.
type FillStats struct {
	Local   uint64 // from this host's copy
	Fetched uint64 // asked from the source
	Dumped  uint64 // already in the dump's own pages image
	Parent  uint64 // left to the parent image
}

// FillLazy turns the images of a lazy dump (memory left for a lazy page
// server) in dir into complete images that a plain restore reads: every
// lazy run's pages are written into the task's pages image, in pagemap
// order, and marked present. Pre-copy's switchover uses it with the pages
// its rounds brought: the dump itself carried no memory.
func FillLazy(dir string, src PageSource) (FillStats, error) { return fill(dir, src, 0) }

// FillForLazyRestore is FillLazy for a lazy restore whose lazy-pages
// daemon reads dir: the pages written stay marked lazy (present, or in
// the parent image, and lazy), so that a restore leaves them to the
// daemon instead of copying them into the process. The pages the dump
// carried itself are restored as before. The restore itself may as well
// read the dump as it came (LinkDir keeps it): it never reads a lazy
// page, and a runtime that copies the restore's images then copies only
// what the dump carried.
func FillForLazyRestore(dir string, src PageSource) (FillStats, error) {
	return fill(dir, src, PageLazy)
}

func fill(dir string, src PageSource, keep uint32) (FillStats, error) {
	var st FillStats
	err := rewriteEach(dir, 1<<20, nil, func(w *bufio.Writer, old io.Reader, pm *Pagemap) error {
		return fillEntries(w, old, pm, src, keep, &st)
	})
	return st, err
}

// FillPicked makes the picked pages of a lazy dump's lazy runs (each
// task's addresses, sorted) part of the images, present and no longer
// lazy, so that the restore writes them into the process itself; local
// supplies them (a page it lacks stays lazy). Every other lazy page stays
// as the dump left it, for the lazy-pages daemon. Hybrid's destination
// picks the pages the container wrote last: the first ones it touches
// once it runs, which would each have cost a fault's round trip.
func FillPicked(dir string, picked map[uint32][]uint64, local func(pid uint32, addr uint64, dst []byte) bool) (FillStats, error) {
	var st FillStats
	// A few MiB at most: buffers of 1 MiB cost more to fault in than they
	// save in system calls.
	some := func(pm Pagemap) bool { return len(picked[pm.PID]) > 0 }
	err := rewriteEach(dir, 64<<10, some, func(w *bufio.Writer, old io.Reader, pm *Pagemap) error {
		return pickEntries(w, old, pm, picked[pm.PID], local, &st)
	})
	return st, err
}

// entriesFunc writes one task's pages in pagemap order (old is its pages
// image as it was) and sets its pagemap's new entries.
type entriesFunc func(w *bufio.Writer, old io.Reader, pm *Pagemap) error

// rewriteEach rewrites the images of each task in dir that want accepts
// (want nil: every task).
func rewriteEach(dir string, bufSize int, want func(Pagemap) bool, entries entriesFunc) error {
	pms, err := ReadPagemaps(dir)
	if err != nil {
		return err
	}
	for _, pm := range pms {
		if want != nil && !want(pm) {
			continue
		}
		if err := rewrite(dir, pm, bufSize, entries); err != nil {
			return fmt.Errorf("task %d: %w", pm.PID, err)
		}
	}
	return nil
}

// rewrite writes a task's pages image and pagemap anew through buffers
// of bufSize, as entries says. Until the last rename the images are as
// they were.
func rewrite(dir string, pm Pagemap, bufSize int, entries entriesFunc) error {
	pagesPath := filepath.Join(dir, fmt.Sprintf("pages-%d.img", pm.PagesID))
	var old io.Reader = bytes.NewReader(nil) // no pages image: every page was lazy
	if f, err := os.Open(pagesPath); err == nil {
		defer f.Close()
		old = bufio.NewReaderSize(f, bufSize)
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	tmp := pagesPath + ".tmp"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer os.Remove(tmp) // after the rename, a no-op
	w := bufio.NewWriterSize(out, bufSize)
	if err := entries(w, old, &pm); err != nil {
		out.Close()
		return err
	}
	if err := w.Flush(); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, pagesPath); err != nil {
		return err
	}
	return writePagemap(dir, pm)
}

// maxFetchRun bounds one request for missing pages.
const maxFetchRun = 256

// fillEntries writes the pages; keep is the flag (PageLazy or 0) the
// pages that were lazy keep.
func fillEntries(w *bufio.Writer, old io.Reader, pm *Pagemap, src PageSource, keep uint32, st *FillStats) error {
	page := make([]byte, PageSize)
	missing := make([]byte, 0, maxFetchRun*PageSize)
	var missingAt uint64
	flush := func() error {
		if len(missing) == 0 {
			return nil
		}
		if src.Fetch == nil {
			return fmt.Errorf("page %#x is neither in the dump nor held here", missingAt)
		}
		if err := src.Fetch(pm.PID, missingAt, missing); err != nil {
			return fmt.Errorf("fetch %d pages at %#x: %w", len(missing)/PageSize, missingAt, err)
		}
		st.Fetched += uint64(len(missing) / PageSize)
		_, err := w.Write(missing)
		missing = missing[:0]
		return err
	}
	// The new entries: a lazy run may split into pages written here and
	// pages left to the parent image.
	var out []PagemapEntry
	emit := func(addr uint64, flags uint32) {
		if n := len(out); n > 0 && out[n-1].Flags == flags && out[n-1].Vaddr+uint64(out[n-1].NrPages)*PageSize == addr {
			out[n-1].NrPages++
			return
		}
		out = append(out, PagemapEntry{Vaddr: addr, NrPages: 1, Flags: flags})
	}
	for _, e := range pm.Entries {
		switch {
		case e.Flags&PageParent != 0:
			return fmt.Errorf("pages at %#x are in a parent image: a lazy dump has none", e.Vaddr)
		case e.Flags&PageLazy != 0:
			for p := uint64(0); p < uint64(e.NrPages); p++ {
				addr := e.Vaddr + p*PageSize
				if k := src.inParent(pm.PID, addr, uint64(e.NrPages)-p); k > 0 {
					if err := flush(); err != nil {
						return err
					}
					st.Parent += k
					for j := uint64(0); j < k; j++ {
						emit(addr+j*PageSize, PageParent|keep)
					}
					p += k - 1
					continue
				}
				emit(addr, PagePresent|keep)
				if src.Local != nil && src.Local(pm.PID, addr, page) {
					if err := flush(); err != nil {
						return err
					}
					st.Local++
					if _, err := w.Write(page); err != nil {
						return err
					}
					continue
				}
				if len(missing) == 0 {
					missingAt = addr
				}
				missing = missing[:len(missing)+PageSize]
				if len(missing) == cap(missing) {
					if err := flush(); err != nil {
						return err
					}
				}
			}
			if err := flush(); err != nil {
				return err
			}
		default:
			n := int64(e.NrPages) * PageSize
			if _, err := io.CopyN(w, old, n); err != nil {
				return fmt.Errorf("pages image ends before the pages at %#x: %w", e.Vaddr, err)
			}
			st.Dumped += uint64(e.NrPages)
			out = append(out, PagemapEntry{Vaddr: e.Vaddr, NrPages: e.NrPages, Flags: PagePresent})
		}
	}
	pm.Entries = out
	return nil
}

// pickEntries writes a lazy dump's pages with the picked ones (sorted
// addresses) among its lazy runs filled in from local.
func pickEntries(w *bufio.Writer, old io.Reader, pm *Pagemap, picked []uint64, local func(pid uint32, addr uint64, dst []byte) bool, st *FillStats) error {
	page := make([]byte, PageSize)
	var out []PagemapEntry
	lastPicked := false // out's last entry holds picked pages only
	keep := func(e PagemapEntry) {
		if e.NrPages > 0 {
			out, lastPicked = append(out, e), false
		}
	}
	pick := func(addr uint64) {
		if k := len(out); lastPicked && out[k-1].Vaddr+uint64(out[k-1].NrPages)*PageSize == addr {
			out[k-1].NrPages++
			return
		}
		out, lastPicked = append(out, PagemapEntry{Vaddr: addr, NrPages: 1, Flags: PagePresent}), true
	}
	for _, e := range pm.Entries {
		end := e.Vaddr + uint64(e.NrPages)*PageSize
		switch {
		case e.Flags&PageParent != 0:
			return fmt.Errorf("pages at %#x are in a parent image: a lazy dump has none", e.Vaddr)
		case e.Flags&PageLazy != 0:
			// Only the picked pages are visited: a run of a GiB has few.
			at := e.Vaddr
			i, _ := slices.BinarySearch(picked, e.Vaddr)
			for ; i < len(picked) && picked[i] < end; i++ {
				addr := picked[i]
				if addr < at || !local(pm.PID, addr, page) {
					continue // listed twice, or not held: the daemon's
				}
				keep(PagemapEntry{Vaddr: at, NrPages: uint32((addr - at) / PageSize), Flags: e.Flags})
				if _, err := w.Write(page); err != nil {
					return err
				}
				pick(addr)
				st.Local++
				at = addr + PageSize
			}
			keep(PagemapEntry{Vaddr: at, NrPages: uint32((end - at) / PageSize), Flags: e.Flags})
		default:
			if _, err := io.CopyN(w, old, int64(e.NrPages)*PageSize); err != nil {
				return fmt.Errorf("pages image ends before the pages at %#x: %w", e.Vaddr, err)
			}
			st.Dumped += uint64(e.NrPages)
			keep(e)
		}
	}
	pm.Entries = out
	return nil
}

// LinkDir makes dst a copy of the images in src that costs no copying:
// a hard link to each file, the same symbolic links (a parent image's is
// relative, so dst must sit beside src). Writing a file anew in one
// (FillLazy writes and renames) leaves the other's as it was.
func LinkDir(src, dst string) error {
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return err
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		from, to := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		switch {
		case e.Type().IsRegular():
			err = os.Link(from, to)
		case e.Type()&os.ModeSymlink != 0:
			var target string
			if target, err = os.Readlink(from); err == nil {
				err = os.Symlink(target, to)
			}
		default:
			err = fmt.Errorf("%s is neither a file nor a link", from)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
