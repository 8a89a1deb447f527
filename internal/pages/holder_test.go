package pages

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/ferry-migrate/ferry/internal/testroot"

	"golang.org/x/sys/unix"
)

// The test binary doubles as a memory holder: with holderEnv set to a size
// in MiB it maps and fills that much memory, reports where, and changes pages
// on command, so tests scan a real process they control.
const holderEnv = "FERRY_PAGES_HOLDER_MIB"

func TestMain(m *testing.M) {
	if v := os.Getenv(holderEnv); v != "" {
		os.Exit(runHolder(v))
	}
	os.Exit(m.Run())
}

// zeroRegion is the size of the holder's mapping that is only ever read, so
// that it maps the zero page everywhere (smaller than a huge page on purpose).
const zeroRegion = 1 << 20

// codePages is the size of the holder's executable mapping of its own
// anonymous pages.
const codePages = 2

// fillPage writes the content of page i of generation gen into p.
func fillPage(p []byte, i int, gen uint64) {
	for j := 0; j < PageSize; j += 8 {
		v := (uint64(i)<<32 | uint64(j) | gen<<62) * 0x9e3779b97f4a7c15
		binary.LittleEndian.PutUint64(p[j:], v^v>>29)
	}
}

func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

func runHolder(mib string) int {
	n, err := strconv.Atoi(mib)
	if err != nil {
		fmt.Fprintln(os.Stderr, "holder:", err)
		return 2
	}
	size := n << 20
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		fmt.Fprintln(os.Stderr, "holder:", err)
		return 2
	}
	for i := 0; i < size/PageSize; i++ {
		fillPage(mem[i*PageSize:(i+1)*PageSize], i, 0)
	}
	zero, err := unix.Mmap(-1, 0, zeroRegion, unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		fmt.Fprintln(os.Stderr, "holder:", err)
		return 2
	}
	var sum byte
	for i := 0; i < zeroRegion; i += PageSize {
		sum += zero[i]
	}
	// Code written by the process itself, as a JIT's: two pages.
	code, err := unix.Mmap(-1, 0, codePages*PageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err == nil {
		for i := range codePages {
			fillPage(code[i*PageSize:(i+1)*PageSize], i, 1)
		}
		err = unix.Mprotect(code, unix.PROT_READ|unix.PROT_EXEC)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "holder:", err)
		return 2
	}
	fmt.Printf("ready %d %d %d %d %d\n", addrOf(mem), size, addrOf(zero), sum, addrOf(code))
	// Commands: "touch GEN I J ..." rewrites pages I, J... with generation
	// GEN; every command is answered with "done". EOF ends the holder.
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "touch" {
			gen, _ := strconv.ParseUint(f[1], 10, 2)
			for _, s := range f[2:] {
				if i, err := strconv.Atoi(s); err == nil && i >= 0 && i < size/PageSize {
					fillPage(mem[i*PageSize:(i+1)*PageSize], i, gen)
				}
			}
		}
		fmt.Println("done")
	}
	return 0
}

// holder is a running memory holder.
type holder struct {
	pid        int
	addr, size uint64
	zero       uint64
	code       uint64
	cmd        *exec.Cmd
	in         io.WriteCloser
	out        *bufio.Reader
}

func needRoot(t testing.TB) {
	t.Helper()
	testroot.Require(t, "reading another process's memory and page frames needs root")
}

// startHolder starts a holder of mib MiB; cleanup kills it by PID.
func startHolder(t testing.TB, mib int) *holder {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", holderEnv, mib))
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
	h := &holder{pid: cmd.Process.Pid, cmd: cmd, in: in, out: bufio.NewReader(out)}
	t.Cleanup(h.kill)
	line, err := h.out.ReadString('\n')
	if err != nil {
		t.Fatalf("holder did not start: %v", err)
	}
	var sum int
	if _, err := fmt.Sscanf(line, "ready %d %d %d %d %d", &h.addr, &h.size, &h.zero, &sum, &h.code); err != nil {
		t.Fatalf("holder said %q: %v", line, err)
	}
	return h
}

func (h *holder) kill() {
	if h.cmd.ProcessState != nil {
		return
	}
	h.cmd.Process.Kill()
	h.cmd.Wait()
}

// touch makes the holder rewrite the given pages with generation gen.
func (h *holder) touch(t testing.TB, gen int, pages ...int) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "touch %d", gen)
	for _, p := range pages {
		fmt.Fprintf(&b, " %d", p)
	}
	b.WriteByte('\n')
	if _, err := io.WriteString(h.in, b.String()); err != nil {
		t.Fatal(err)
	}
	if line, err := h.out.ReadString('\n'); err != nil || line != "done\n" {
		t.Fatalf("holder answered %q, %v", line, err)
	}
}
