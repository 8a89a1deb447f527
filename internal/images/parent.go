package images

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
)

// PageRef names one page of a task: its pid (in its own namespace, as CRIU
// names it) and its address.
type PageRef struct {
	PID  uint32
	Addr uint64
}

// ParentImage is a page image the destination of a pre-copy keeps up to
// date while rounds arrive: per task, a pagemap of present runs and a pages
// image laid out from the pages it holds. The switchover's completed dump
// names it as its parent (entries flagged PageParent), so CRIU reads those
// pages from it and nothing has to be copied while the container is down.
// It must hold a page's current contents for as long as Has says it has it:
// every change to a held page goes through Update, a forgotten page through
// Forget.
type ParentImage struct {
	dir string

	mu      sync.Mutex
	at      map[PageRef]int64 // offset of each page in its task's pages image
	files   map[uint32]*os.File
	built   bool
	pending map[PageRef]struct{} // changed while the image was being written
	done    chan struct{}
	err     error
}

// StartParent writes, in the background, a parent image in dir of the pages
// refs names, taking their contents from read (which must see every Update
// made meanwhile: the image re-reads those pages once written). Wait says
// when it is ready.
func StartParent(dir string, refs []PageRef, read func(PageRef, []byte) bool) (*ParentImage, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &ParentImage{dir: dir, at: make(map[PageRef]int64, len(refs)), files: map[uint32]*os.File{},
		pending: map[PageRef]struct{}{}, done: make(chan struct{})}
	refs = slices.Clone(refs)
	slices.SortFunc(refs, func(a, b PageRef) int {
		if a.PID != b.PID {
			return int(a.PID) - int(b.PID)
		}
		switch {
		case a.Addr < b.Addr:
			return -1
		case a.Addr > b.Addr:
			return 1
		}
		return 0
	})
	go func() {
		err := p.write(refs, read)
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// write lays out refs task by task, then rewrites the pages changed while
// it ran.
func (p *ParentImage) write(refs []PageRef, read func(PageRef, []byte) bool) error {
	page := make([]byte, PageSize)
	for start := 0; start < len(refs); {
		pid := refs[start].PID
		end := start
		for end < len(refs) && refs[end].PID == pid {
			end++
		}
		if err := p.writeTask(pid, refs[start:end], read, page); err != nil {
			return err
		}
		start = end
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for r := range p.pending {
		if read(r, page) {
			if err := p.pwrite(r, page); err != nil {
				return err
			}
		} else {
			delete(p.at, r)
		}
	}
	p.pending, p.built = nil, true
	return nil
}

func (p *ParentImage) writeTask(pid uint32, refs []PageRef, read func(PageRef, []byte) bool, page []byte) error {
	f, err := os.OpenFile(filepath.Join(p.dir, fmt.Sprintf("pages-%d.img", pid)), os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.files[pid] = f
	p.mu.Unlock()
	w := bufio.NewWriterSize(f, 1<<20)
	pm := Pagemap{PID: pid, PagesID: pid}
	var off int64
	for _, r := range refs {
		if !read(r, page) {
			continue // gone since the list was made
		}
		if n := len(pm.Entries); n > 0 && pm.Entries[n-1].Vaddr+uint64(pm.Entries[n-1].NrPages)*PageSize == r.Addr {
			pm.Entries[n-1].NrPages++
		} else {
			pm.Entries = append(pm.Entries, PagemapEntry{Vaddr: r.Addr, NrPages: 1, Flags: PagePresent})
		}
		if _, err := w.Write(page); err != nil {
			return err
		}
		p.mu.Lock()
		p.at[r] = off
		p.mu.Unlock()
		off += PageSize
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return writePagemap(p.dir, pm)
}

// pwrite puts a page at its place; p.mu is held.
func (p *ParentImage) pwrite(r PageRef, data []byte) error {
	off, ok := p.at[r]
	if !ok {
		return nil
	}
	_, err := p.files[r.PID].WriteAt(data, off)
	return err
}

// Update records a page's new contents.
func (p *ParentImage) Update(r PageRef, data []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.built {
		p.pending[r] = struct{}{}
		return nil
	}
	return p.pwrite(r, data)
}

// Forget drops a page: its copy here is no longer current.
func (p *ParentImage) Forget(r PageRef) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.at, r)
	if !p.built {
		p.pending[r] = struct{}{} // re-read: absent from the store, it is dropped
	}
}

// Has reports whether the image holds the page's current contents.
func (p *ParentImage) Has(pid uint32, addr uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.at[PageRef{pid, addr}]
	return ok
}

// Wait returns once the image is written, with the error that stopped it.
func (p *ParentImage) Wait() error {
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Dir is the image's directory, for a dump's parent link.
func (p *ParentImage) Dir() string { return p.dir }

// Close closes the image's files (after Wait).
func (p *ParentImage) Close() error {
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	var err error
	for _, f := range p.files {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	return err
}
