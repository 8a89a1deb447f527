//go:build linux && amd64

package criu

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/testroot"

	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/internal/procs"
)

// rescueCRIUEnv names a CRIU built with ferry's patches up to 0015
// (records for Rescue), for the tests that kill it.
const rescueCRIUEnv = "FERRY_RESCUE_CRIU"

func TestParseRescueRecord(t *testing.T) {
	var regs unix.PtraceRegs
	regs.Rip, regs.Rax, regs.Orig_rax, regs.Rsp = 0x401000, 0xfffffffffffffe00, 45, 0x7ffc0000
	var rb bytes.Buffer
	if err := binary.Write(&rb, binary.LittleEndian, &regs); err != nil {
		t.Fatal(err)
	}
	rb.Write(make([]byte, 8)) // user_regs_struct_t's is_native and padding
	rec := "pid 1f4\ncode_addr 401000\ncode 31ed4989d15e4889e24883e4f0505449\n" +
		"map_addr 7f0000000000\nmap_len 5c6000\nnative 1\nsigmask 0000010000000000\n" +
		"regs " + hex.EncodeToString(rb.Bytes()) + "\nlater_key x\n"
	r, err := parseRescueRecord([]byte(rec))
	if err != nil {
		t.Fatal(err)
	}
	if r.pid != 500 || r.codeAddr != 0x401000 || len(r.code) != 16 || r.code[0] != 0x31 ||
		r.mapAddr != 0x7f0000000000 || r.mapLen != 0x5c6000 || r.sigmask != 1<<16 || r.regs != regs {
		t.Fatalf("parsed %+v", r)
	}
	for _, bad := range []string{
		strings.Replace(rec, "native 1", "native 0", 1),                            // a 32-bit process
		strings.Replace(rec, "sigmask 0000010000000000\n", "", 1),                  // a line missing
		strings.Replace(rec, "regs "+hex.EncodeToString(rb.Bytes()), "regs 00", 1), // short
		strings.Replace(rec, "code 31ed", "code 3", 1),                             // not hex
		rec[:len(rec)/2], // cut
	} {
		if _, err := parseRescueRecord([]byte(bad)); err == nil {
			t.Errorf("no error for %q", bad)
		}
	}
}

// needRescueCRIU is the CRIU rescueCRIUEnv names, or else the one in
// PATH, and skips without root, a CRIU built with patch 0015 (it reads
// RescueDirEnv) or a C compiler (for the probe).
func needRescueCRIU(t *testing.T) string {
	t.Helper()
	testroot.Require(t, "skipping: needs root for CRIU")
	bin := os.Getenv(rescueCRIUEnv)
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("criu"); err != nil {
			t.Skip("skipping: no criu (make setup builds ferry's)")
		}
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Skipf("skipping: %v", err)
	}
	if !bytes.Contains(b, []byte(RescueDirEnv)) {
		t.Skipf("skipping: %s is not built with scripts/criu-patches/0015 (make setup builds ferry's; or name one in %s)", bin, rescueCRIUEnv)
	}
	if _, err := exec.LookPath("cc"); err != nil {
		t.Skip("skipping: no C compiler for the probe")
	}
	return bin
}

// probeSource answers each UDP datagram on 127.0.0.1:PORT with its bytes:
// one thread, most of its time in recvfrom (a system call to restart).
const probeSource = `#include <arpa/inet.h>
#include <stdlib.h>
#include <sys/socket.h>
int main(int argc, char **argv)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[1])) }, from;
	socklen_t fl;
	char buf[64];
	int n, s = socket(AF_INET, SOCK_DGRAM, 0);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (s < 0 || bind(s, (void *)&a, sizeof(a)))
		return 1;
	for (;;) {
		fl = sizeof(from);
		n = recvfrom(s, buf, sizeof(buf), 0, (void *)&from, &fl);
		if (n > 0)
			sendto(s, buf, n, 0, (void *)&from, fl);
	}
}
`

func buildProbe(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	src, bin := filepath.Join(dir, "probe.c"), filepath.Join(dir, "probe")
	if err := os.WriteFile(src, []byte(probeSource), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cc", "-O2", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	return bin
}

// probe is a running probe process, in a session of its own. It is not
// the test's child: a parent that also traces it (Rescue) would take the
// ptrace stops its wait for the exit sees.
type probe struct {
	pid  int
	port int
}

func startProbe(t *testing.T, bin string) *probe {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0") // a free port
	if err != nil {
		t.Fatal(err)
	}
	p := &probe{port: c.LocalAddr().(*net.UDPAddr).Port}
	c.Close()
	out, err := exec.Command("sh", "-c", `setsid "$0" "$1" </dev/null >/dev/null 2>&1 & echo $!`, bin, strconv.Itoa(p.port)).Output()
	if err != nil {
		t.Fatal(err)
	}
	if p.pid, err = strconv.Atoi(strings.TrimSpace(string(out))); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(p.pid, syscall.SIGKILL) })
	for i := 0; !p.answers(100 * time.Millisecond); i++ {
		if i == 100 {
			t.Fatal("the probe never answered")
		}
		time.Sleep(10 * time.Millisecond) // not bound yet: refused at once
	}
	return p
}

// answers says whether the probe echoes a datagram within wait.
func (p *probe) answers(wait time.Duration) bool {
	c, err := net.Dial("udp", "127.0.0.1:"+strconv.Itoa(p.port))
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(wait))
	if _, err := c.Write([]byte("ping")); err != nil {
		return false
	}
	b := make([]byte, 8)
	n, err := c.Read(b)
	return err == nil && string(b[:n]) == "ping"
}

// aim is a moment to kill a dump's CRIU: delay after the first log line
// holding line.
type aim struct {
	line  string
	delay time.Duration
}

// Where CRIU's code goes into the probe (compel's injected system calls
// follow) and where the cure begins.
const (
	lineInjection = "Parasite syscall_ip at"
	lineCure      = "exited trapping"
)

// killAt has CRIU bin dump (--leave-running) a fresh probe, kills it
// (SIGKILL) at a, runs Rescue on rescueDir ("": no records kept) until
// no record is left, and says whether the probe lives and answers then.
// hit is false when CRIU ended before a; put is whether Rescue put the
// probe back.
func killAt(t *testing.T, bin, probeBin, rescueDir string, a aim) (alive, hit, put bool, why string) {
	t.Helper()
	p := startProbe(t, probeBin)
	dir := t.TempDir()
	logPath := filepath.Join(dir, "dump.log")
	dump := exec.Command(bin, "dump", "-t", strconv.Itoa(p.pid), "-D", dir, "-o", "dump.log", "-v4",
		"--shell-job", "--leave-running")
	dump.Dir = dir
	if rescueDir != "" {
		dump.Env = append(os.Environ(), RescueDirEnv+"="+rescueDir)
	}
	if err := dump.Start(); err != nil {
		t.Fatal(err)
	}
	dumpEnd := make(chan error, 1)
	go func() { dumpEnd <- dump.Wait() }()
	defer func() { _ = dump.Process.Kill(); <-dumpEnd }()

	// Read the log as CRIU writes it, then wait out the delay busy (a
	// sleep would overshoot by tens of microseconds).
	var log []byte
	buf := make([]byte, 64<<10)
	for f := (*os.File)(nil); ; {
		if f == nil {
			f, _ = os.Open(logPath)
		}
		if f != nil {
			n, _ := f.Read(buf)
			log = append(log, buf[:n]...)
			if bytes.Contains(log, []byte(a.line)) {
				f.Close()
				break
			}
		}
		select {
		case err := <-dumpEnd:
			dumpEnd <- err
			return false, false, false, fmt.Sprintf("CRIU ended (%v) before %q", err, a.line)
		default:
		}
	}
	for at := time.Now(); time.Since(at) < a.delay; {
	}
	_ = dump.Process.Signal(syscall.SIGKILL)
	err := <-dumpEnd
	dumpEnd <- err
	if err == nil {
		return false, false, false, "CRIU ended before the kill"
	}

	if rescueDir != "" {
		for i := 0; ; i++ {
			rescued, err := Rescue(rescueDir)
			if err != nil {
				return false, true, put, fmt.Sprintf("Rescue: %v", err)
			}
			put = put || len(rescued) > 0
			left, _ := os.ReadDir(rescueDir)
			if len(left) == 0 {
				break
			}
			if i == 50 {
				return false, true, put, fmt.Sprintf("records left: %v", left)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	time.Sleep(300 * time.Millisecond)
	if !procs.Alive(p.pid) {
		return false, true, put, "died"
	}
	if !p.answers(time.Second) {
		return false, true, put, "alive, no answer"
	}
	return true, true, put, ""
}

// A CRIU that keeps records does its dump as before and leaves none.
func TestRescueRecordsGoAfterADump(t *testing.T) {
	bin := needRescueCRIU(t)
	p := startProbe(t, buildProbe(t))
	dir, records := t.TempDir(), t.TempDir()
	dump := exec.Command(bin, "dump", "-t", strconv.Itoa(p.pid), "-D", dir, "-o", "dump.log", "-v4",
		"--shell-job", "--leave-running")
	dump.Dir = dir
	dump.Env = append(os.Environ(), RescueDirEnv+"="+records)
	if out, err := dump.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "dump.log"))
		t.Fatalf("dump: %v %s\n%s", err, out, LogErrors(filepath.Join(dir, "dump.log"))+string(log[max(0, len(log)-2000):]))
	}
	if left, _ := os.ReadDir(records); len(left) != 0 {
		t.Fatalf("records left after the dump: %v", left)
	}
	if !p.answers(time.Second) {
		t.Fatal("the probe does not answer after its dump")
	}
}

// A rescue directory CRIU cannot write to (removed by someone) turns the
// records off: the dump goes on as without them, and says so in its log.
func TestRescueDirGoneDumpsAsBefore(t *testing.T) {
	bin := needRescueCRIU(t)
	p := startProbe(t, buildProbe(t))
	dir := t.TempDir()
	dump := exec.Command(bin, "dump", "-t", strconv.Itoa(p.pid), "-D", dir, "-o", "dump.log", "-v4",
		"--shell-job", "--leave-running")
	dump.Dir = dir
	dump.Env = append(os.Environ(), RescueDirEnv+"="+filepath.Join(dir, "gone"))
	if out, err := dump.CombinedOutput(); err != nil {
		t.Fatalf("dump with its rescue directory gone: %v %s\n%s", err, out, LogErrors(filepath.Join(dir, "dump.log")))
	}
	log, _ := os.ReadFile(filepath.Join(dir, "dump.log"))
	if !strings.Contains(string(log), "no rescue records") {
		t.Error("the dump's log does not say it kept no rescue records")
	}
	if !p.answers(time.Second) {
		t.Fatal("the probe does not answer after its dump")
	}
}

// A CRIU killed while its code is inside the probe (as compel's system
// calls go in, and as the cure begins) leaves it for Rescue, which puts
// it back: the probe lives and answers.
func TestRescueAfterCRIUKilledInside(t *testing.T) {
	bin := needRescueCRIU(t)
	probeBin := buildProbe(t)
	puts := 0
	for _, a := range []aim{
		{lineInjection, 0}, {lineInjection, 100 * time.Microsecond}, {lineInjection, 300 * time.Microsecond},
		{lineCure, 0}, {lineCure, 200 * time.Microsecond}, {lineCure, time.Millisecond},
	} {
		alive, hit, put, why := killAt(t, bin, probeBin, t.TempDir(), a)
		if !hit {
			t.Logf("%q +%v: %s", a.line, a.delay, why)
			continue
		}
		if !alive {
			t.Errorf("%q +%v: %s", a.line, a.delay, why)
		}
		puts += map[bool]int{true: 1}[put]
	}
	if puts == 0 {
		t.Error("no kill left the probe for Rescue to put back: the kills missed CRIU's time inside")
	}
}

// measureEnv runs TestRescueMeasure: that many kills per delay, with the
// CRIU rescueCRIUEnv names; with FERRY_RESCUE_MEASURE_OFF=1, no records
// (CRIU_RESCUE_DIR unset) and no Rescue, as with an unpatched CRIU.
const measureEnv = "FERRY_RESCUE_MEASURE"

// TestRescueMeasure is the measurement, not run by default: aimed kills
// over delays 0-5 ms after each line, counting probes alive and answering.
func TestRescueMeasure(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv(measureEnv))
	if n <= 0 {
		t.Skipf("skipping: set %s to the kills per delay", measureEnv)
	}
	bin := needRescueCRIU(t)
	probeBin := buildProbe(t)
	off := os.Getenv(measureEnv+"_OFF") == "1"
	delays := []time.Duration{0, 100 * time.Microsecond, 200 * time.Microsecond, 300 * time.Microsecond,
		500 * time.Microsecond, 750 * time.Microsecond, time.Millisecond, 2 * time.Millisecond,
		3 * time.Millisecond, 5 * time.Millisecond}
	for _, line := range []string{lineInjection, lineCure} {
		var cells []string
		alive, total, puts := 0, 0, 0
		for _, d := range delays {
			ok, hits, put := 0, 0, 0
			for range n {
				rescueDir := ""
				if !off {
					rescueDir = t.TempDir()
				}
				a, hit, p, why := killAt(t, bin, probeBin, rescueDir, aim{line, d})
				if !hit {
					t.Logf("%q +%v: %s", line, d, why)
					continue
				}
				hits++
				if p {
					put++
				}
				if a {
					ok++
				} else {
					t.Logf("%q +%v: %s", line, d, why)
				}
			}
			alive, total, puts = alive+ok, total+hits, puts+put
			cells = append(cells, fmt.Sprintf("%v: %d/%d (%d put back)", d, ok, hits, put))
		}
		t.Logf("after %q: %d/%d alive and answering, %d put back by Rescue; %s", line, alive, total, puts, strings.Join(cells, "; "))
	}
}
