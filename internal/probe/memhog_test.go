package probe

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/testroot"

	"github.com/ferry-migrate/ferry/internal/procs"
)

// buildMemhog compiles the workload the way the lab does.
func buildMemhog(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
		if _, err := os.Stat(goBin); err != nil {
			t.Skip("no go toolchain to build memhog with")
		}
	}
	out := filepath.Join(t.TempDir(), "memhog")
	cmd := exec.Command(goBin, "build", "-o", out, "github.com/ferry-migrate/ferry/workloads/memhog")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building memhog: %v\n%s", err, b)
	}
	return out
}

// freeUDPPort returns a loopback UDP port nobody was using a moment ago.
func freeUDPPort(t *testing.T) int {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

var readyAddr = regexp.MustCompile(`memhog ready: .* at (0x[0-9a-f]+)`)

// startMemhog runs memhog as a plain process and returns its PID, UDP address
// and the buffer address from its ready line.
func startMemhog(t *testing.T, bin string, args ...string) (pid int, addr string, buf uint64) {
	t.Helper()
	port := freeUDPPort(t)
	cmd := exec.Command(bin, append(args, "--port", strconv.Itoa(port))...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid = cmd.Process.Pid
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()

	addr = fmt.Sprintf("127.0.0.1:%d", port)
	ctx := context.Background()
	if _, err := WaitReady(ctx, []string{addr}, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-lines:
		t.Log(l)
		m := readyAddr.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("ready line %q has no buffer address", l)
		}
		buf, _ = strconv.ParseUint(m[1], 0, 64)
	case <-time.After(5 * time.Second):
		t.Fatal("memhog answered ready but printed no ready line")
	}
	return pid, addr, buf
}

// findMapping returns the start of the rw-p anonymous mapping of exactly size
// bytes in pid's address space, the one at want if several match.
func findMapping(t *testing.T, pid int, size, want uint64) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	var found []uint64
	for _, m := range procs.ParseMaps(b) {
		if m.Perms == "rw-p" && m.Path == "" && m.End-m.Start == size { // anonymous
			found = append(found, m.Start)
		}
	}
	for _, s := range found {
		if s == want {
			return s
		}
	}
	t.Fatalf("no rw-p mapping of %d bytes at %#x in pid %d (found %#x)", size, want, pid, found)
	return 0
}

func TestMemhogIntegration(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs memhog")
	}
	bin := buildMemhog(t)
	const size = 40<<20 + 4096 // an odd size, unlike any Go heap mapping
	pid, addr, buf := startMemhog(t, bin, "--memory", strconv.Itoa(size), "--dirty-rate", "1000", "--seed", "12345")

	// A dead address first: the prober must find the live one.
	dead := fmt.Sprintf("127.0.0.1:%d", freeUDPPort(t))
	p := Start([]string{dead, addr}, 5*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := p.Stop(ctx)
	t.Logf("result: %+v", r)
	if !r.StateOK || r.Answers < 10 || r.LastCounter <= r.FirstCounter {
		t.Fatalf("result = %+v", r)
	}
	s, err := Query(ctx, addr, ReqStat, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if s.Writes == 0 || s.MemoryBytes != size || s.Pages != size/4096 || s.Boot != r.Boot {
		t.Errorf("STAT = %+v", s)
	}

	testroot.Require(t, "corrupting another process's memory through /proc/PID/mem needs root")
	start := findMapping(t, pid, size, buf)
	mem, err := os.OpenFile(fmt.Sprintf("/proc/%d/mem", pid), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	off := int64(start) + 17*4096 + 1234
	b := make([]byte, 1)
	if _, err := mem.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x40
	if _, err := mem.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
	v, err := Verify(ctx, []string{addr})
	if err != nil {
		t.Fatal(err)
	}
	if v.VerifyOK || v.BadPages != 1 {
		t.Errorf("VERIFY after corrupting one byte = %+v, want verify_ok false and 1 bad page", v)
	}

	// A probe run over the corrupted workload reports it.
	p = Start([]string{addr}, 0)
	time.Sleep(50 * time.Millisecond)
	if r := p.Stop(ctx); r.StateOK || !strings.Contains(r.Reason, "1 of") {
		t.Errorf("result over corrupted memory = %+v", r)
	}
}
