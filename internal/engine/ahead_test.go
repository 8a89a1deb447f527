package engine

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/internal/pages"
)

// The test binary doubles as a process whose mappings the tests change:
// with aheadHolderEnv set it maps aheadHolderSizes (each a mapping of its
// own, fenced by inaccessible pages), writes its first pages, prints
// where, and on "write M I" rewrites page I of mapping M, on "unmap M"
// unmaps mapping M, answering "done".
const aheadHolderEnv = "FERRY_ENGINE_AHEAD_HOLDER"

// Three small mappings, and one larger than any sent ahead, 4 pages of
// it written.
var aheadHolderSizes = []int{4 * pageSize, 4 * pageSize, 4 * pageSize, maxAheadMapping + 4*pageSize}

const aheadHolderWritten = 4 // pages written in each mapping

func runAheadHolder() int {
	var maps [][]byte
	gen := byte(1)
	fill := func(p []byte) {
		for i := range p {
			p[i] = gen ^ byte(i*7) ^ byte(i>>8)
		}
		gen++
	}
	for _, size := range aheadHolderSizes {
		b, err := unix.Mmap(-1, 0, size+2*pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err == nil {
			err = errors.Join(unix.Mprotect(b[:pageSize], unix.PROT_NONE), unix.Mprotect(b[pageSize+size:], unix.PROT_NONE))
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "holder:", err)
			return 2
		}
		m := b[pageSize : pageSize+size]
		for i := 0; i < aheadHolderWritten; i++ {
			fill(m[i*pageSize : (i+1)*pageSize])
		}
		maps = append(maps, m)
	}
	var addrs []string
	for _, m := range maps {
		addrs = append(addrs, fmt.Sprint(uintptr(unsafe.Pointer(&m[0]))))
	}
	fmt.Println("ready", strings.Join(addrs, " "))
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		var m, i int
		switch line := sc.Text(); {
		case strings.HasPrefix(line, "write"):
			if _, err := fmt.Sscanf(line, "write %d %d", &m, &i); err == nil {
				fill(maps[m][i*pageSize : (i+1)*pageSize])
			}
		case strings.HasPrefix(line, "unmap"):
			if _, err := fmt.Sscanf(line, "unmap %d", &m); err == nil {
				// Not unix.Munmap: it knows only the slices Mmap gave.
				_ = unix.MunmapPtr(unsafe.Pointer(&maps[m][0]), uintptr(len(maps[m])))
			}
		}
		fmt.Println("done")
	}
	return 0
}

type aheadHolder struct {
	pid   int
	addrs []uint64
	in    io.Writer
	out   *bufio.Reader
	t     *testing.T
}

// startAheadHolder starts a holder; cleanup kills it by PID.
func startAheadHolder(t *testing.T) *aheadHolder {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("reading another process's memory needs root")
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), aheadHolderEnv+"=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	h := &aheadHolder{pid: cmd.Process.Pid, in: in, out: bufio.NewReader(out), t: t}
	line, err := h.out.ReadString('\n')
	f := strings.Fields(line)
	if err != nil || len(f) != 1+len(aheadHolderSizes) || f[0] != "ready" {
		t.Fatalf("holder said %q: %v", line, err)
	}
	for _, s := range f[1:] {
		var a uint64
		fmt.Sscan(s, &a)
		h.addrs = append(h.addrs, a)
	}
	return h
}

func (h *aheadHolder) do(cmd string) {
	h.t.Helper()
	if _, err := fmt.Fprintln(h.in, cmd); err != nil {
		h.t.Fatal(err)
	}
	if line, err := h.out.ReadString('\n'); err != nil || line != "done\n" {
		h.t.Fatalf("%s: holder said %q: %v", cmd, line, err)
	}
}

// keys are the written pages of mapping m.
func (h *aheadHolder) keys(ns uint32, m int) []pages.Key {
	var out []pages.Key
	for i := range aheadHolderWritten {
		out = append(out, pages.Key{PID: ns, Addr: h.addrs[m] + uint64(i)*pageSize})
	}
	return out
}

// Post-copy's pages ahead: the small data mappings go, the large one
// does not; read again once the process stops, only the page written
// since goes, and the unmapped mapping's pages are no longer seen; the
// destination's copy of every page sent ahead and still there is then
// the stopped process's page, byte for byte.
func TestPagesAheadReadAgain(t *testing.T) {
	h := startAheadHolder(t)
	var stream bytes.Buffer
	enc, err := pages.NewEncoder(&stream, false)
	if err != nil {
		t.Fatal(err)
	}
	l := &lastWritesSource{ps: &precopySource{held: map[pages.Key]xxh3.Uint128{}, enc: enc}, ahead: newPageSet()}
	ctx := context.Background()
	if err := l.readAhead(ctx, h.pid); err != nil {
		t.Fatal(err)
	}
	if err := enc.EndRound(0); err != nil {
		t.Fatal(err)
	}
	rd, err := pages.NewReader([]int{h.pid})
	if err != nil {
		t.Fatal(err)
	}
	ns := uint32(h.pid) // the test runs in the host's pid namespace
	for m := range 3 {
		for _, k := range h.keys(ns, m) {
			if _, ok := l.ps.held[k]; !ok {
				t.Errorf("page %#x of small mapping %d was not sent ahead", k.Addr, m)
			}
		}
	}
	for _, k := range h.keys(ns, 3) {
		if _, ok := l.ps.held[k]; ok {
			t.Errorf("page %#x of the mapping larger than %d MiB was sent ahead", k.Addr, maxAheadMapping>>20)
		}
	}

	h.do("write 0 1")
	h.do("unmap 2")
	if err := syscall.Kill(h.pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := l.sendAheadAgain(ctx, h.pid); err != nil {
		t.Fatal(err)
	}
	if err := enc.EndRound(1); err != nil {
		t.Fatal(err)
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}

	// The destination's side: both rounds into a store, round 1's keys
	// noted, the pages no longer seen dropped (finish's stale list).
	store := pages.NewStore()
	defer store.Release()
	var again []pages.Key
	store.Observe(func(k pages.Key, _ []byte) { again = append(again, k) }, nil)
	dec, err := pages.NewDecoder(&stream)
	if err != nil {
		t.Fatal(err)
	}
	for {
		round, end, err := dec.Next(store)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if end && round == 0 {
			again = again[:0]
		}
	}
	changed := h.keys(ns, 0)[1]
	if !slices.Contains(again, changed) {
		t.Errorf("the page written after it went ahead (%#x) was not sent again", changed.Addr)
	}
	for m := range 2 {
		for _, k := range h.keys(ns, m) {
			if k != changed && slices.Contains(again, k) {
				t.Errorf("unchanged page %#x of mapping %d was sent again", k.Addr, m)
			}
		}
	}
	for _, k := range h.keys(ns, 2) {
		if l.ps.seen.has(k) {
			t.Errorf("page %#x of the unmapped mapping is still seen", k.Addr)
		}
	}
	checked := 0
	for k := range l.ps.held {
		if !l.ps.seen.has(k) {
			store.Delete(k)
			continue
		}
		want, wh, ok := store.Get(k)
		if !ok {
			t.Fatalf("page %#x held but not stored", k.Addr)
		}
		want = bytes.Clone(want)
		if err := rd.ReadRange(pages.Range{PID: k.PID, Start: k.Addr, End: k.Addr + pageSize}, func(p pages.Page) error {
			checked++
			if !bytes.Equal(p.Data, want) || p.Hash != wh {
				return fmt.Errorf("page %#x: the destination's copy differs from the stopped process's", k.Addr)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
	}
	if checked < 2*aheadHolderWritten {
		t.Errorf("compared %d pages with the process, want at least %d", checked, 2*aheadHolderWritten)
	}
}
