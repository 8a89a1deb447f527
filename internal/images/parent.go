package images

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
)

// PageRef names one page of a task: its pid (in its own namespace, as CRIU
// names it) and its address.
type PageRef struct {
	PID  uint32
	Addr uint64
}

// ParentImage is a page image the destination of a pre-copy builds from the
// first round as its pages arrive, and keeps current with every later
// change: per task, a pagemap of present runs and a pages image. The
// switchover's completed dump names it as its parent (entries flagged
// PageParent), so CRIU reads those pages from it and nothing has to be
// copied while the container is down.
//
// The first round reads each task's memory in address order, so its pages
// are laid out as they come; a page out of that order is left out (the
// switchover then writes it itself). Put and Forget come from one goroutine
// (the page store's writer); Has may be called from any.
type ParentImage struct {
	dir string

	mu sync.Mutex
	at map[PageRef]int64 // offset of each page in its task's pages image
	// gone holds the pages laid out, then forgotten: the pagemaps' runs
	// less these are what at holds (a page forgotten never comes back).
	gone   map[PageRef]struct{}
	files  map[uint32]*os.File
	maps   map[uint32]*Pagemap
	sealed bool
	broken error

	// The task being laid out, while not sealed.
	cur  uint32
	curW *bufio.Writer
	end  int64 // its pages image's length so far
}

// NewParent starts an empty parent image in dir.
func NewParent(dir string) (*ParentImage, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return &ParentImage{dir: dir, at: map[PageRef]int64{}, gone: map[PageRef]struct{}{}, files: map[uint32]*os.File{}, maps: map[uint32]*Pagemap{}}, nil
}

// Put records a page's contents: before Seal it lays the page out (when it
// comes in address order); after, it rewrites a page the image holds.
func (p *ParentImage) Put(r PageRef, data []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.broken != nil {
		return p.broken
	}
	if off, ok := p.at[r]; ok {
		return p.fail(p.rewrite(r, off, data))
	}
	if p.sealed {
		return nil
	}
	return p.fail(p.append(r, data))
}

// fail keeps the first error: a broken image is never offered as a parent.
func (p *ParentImage) fail(err error) error {
	if err != nil && p.broken == nil {
		p.broken = err
	}
	return err
}

func (p *ParentImage) append(r PageRef, data []byte) error {
	pm := p.maps[r.PID]
	if pm == nil {
		if err := p.flushCurrent(); err != nil {
			return err
		}
		f, err := os.OpenFile(filepath.Join(p.dir, fmt.Sprintf("pages-%d.img", r.PID)), os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o600)
		if err != nil {
			return err
		}
		pm = &Pagemap{PID: r.PID, PagesID: r.PID}
		p.maps[r.PID], p.files[r.PID] = pm, f
		p.cur, p.curW, p.end = r.PID, bufio.NewWriterSize(f, 1<<20), 0
	}
	if r.PID != p.cur {
		return nil // an earlier task again: out of order, left out
	}
	n := len(pm.Entries)
	switch {
	case n > 0 && pm.Entries[n-1].Vaddr+uint64(pm.Entries[n-1].NrPages)*PageSize == r.Addr:
		pm.Entries[n-1].NrPages++
	case n == 0 || r.Addr > pm.Entries[n-1].Vaddr:
		pm.Entries = append(pm.Entries, PagemapEntry{Vaddr: r.Addr, NrPages: 1, Flags: PagePresent})
	default:
		return nil // out of order, left out
	}
	if _, err := p.curW.Write(data[:PageSize]); err != nil {
		return err
	}
	p.at[r] = p.end
	p.end += PageSize
	return nil
}

// rewrite puts a page at its place, through the writer while it still
// buffers the end of the current task's image.
func (p *ParentImage) rewrite(r PageRef, off int64, data []byte) error {
	if !p.sealed && r.PID == p.cur {
		if err := p.curW.Flush(); err != nil {
			return err
		}
	}
	_, err := p.files[r.PID].WriteAt(data[:PageSize], off)
	return err
}

func (p *ParentImage) flushCurrent() error {
	if p.curW == nil {
		return nil
	}
	err := p.curW.Flush()
	p.curW = nil
	return err
}

// Seal ends the layout (the first round is in): the pagemaps are written,
// and from now on Has answers.
func (p *ParentImage) Seal() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sealed {
		return p.broken
	}
	p.sealed = true
	if err := p.flushCurrent(); err != nil {
		return p.fail(err)
	}
	for _, pm := range p.maps {
		if err := writePagemap(p.dir, *pm); err != nil {
			return p.fail(err)
		}
	}
	return p.broken
}

// Forget drops a page: its copy here is no longer current.
func (p *ParentImage) Forget(r PageRef) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.at[r]; ok {
		delete(p.at, r)
		p.gone[r] = struct{}{}
	}
}

// Has reports whether the sealed, intact image holds the page's current
// contents.
func (p *ParentImage) Has(pid uint32, addr uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.sealed || p.broken != nil {
		return false
	}
	_, ok := p.at[PageRef{pid, addr}]
	return ok
}

// HeldRun is how many pages from addr on, at most n, the sealed, intact
// image holds current: Has for a run of pages, answered from the task's
// pagemap (one search) and the few pages forgotten since, not a look-up
// per page (at 1 GiB those took ~50 ms of pre-copy's downtime).
func (p *ParentImage) HeldRun(pid uint32, addr, n uint64) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	pm := p.maps[pid]
	if !p.sealed || p.broken != nil || pm == nil {
		return 0
	}
	es := pm.Entries
	i := sort.Search(len(es), func(i int) bool { return es[i].Vaddr+uint64(es[i].NrPages)*PageSize > addr })
	if i == len(es) || es[i].Vaddr > addr {
		return 0
	}
	k := min(n, (es[i].Vaddr+uint64(es[i].NrPages)*PageSize-addr)/PageSize)
	if len(p.gone) > 0 {
		for j := uint64(0); j < k; j++ {
			if _, ok := p.gone[PageRef{pid, addr + j*PageSize}]; ok {
				return j
			}
		}
	}
	return k
}

// Usable reports whether the image is sealed and intact.
func (p *ParentImage) Usable() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sealed && p.broken == nil
}

// Dir is the image's directory, for a dump's parent link.
func (p *ParentImage) Dir() string { return p.dir }

// Close closes the image's files.
func (p *ParentImage) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, f := range p.files {
		errs = append(errs, f.Close())
	}
	p.files = map[uint32]*os.File{}
	p.fail(errors.New("parent image closed"))
	return errors.Join(errs...)
}
