package criu

import (
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/testroot"

	"github.com/checkpoint-restore/go-criu/v7/stats"
	"golang.org/x/sys/unix"
)

func TestParseVersion(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Version
	}{
		{"Version: 4.2.1\n", Version{4, 2, 1}},
		{"Version: 3.17.1\nGitID: v3.17.1\n", Version{3, 17, 1}},
		{"Version: 4.2\n", Version{4, 2, 0}},
		{"4.1.1", Version{4, 1, 1}},
		{"Version: 4.3.0-rc1\n", Version{4, 3, 0}},
	} {
		got, err := ParseVersion(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseVersion(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "Version: four", "Version: 4", "criu: command not found", "1.2.3.4"} {
		if v, err := ParseVersion(bad); err == nil {
			t.Errorf("ParseVersion(%q) = %v, want error", bad, v)
		}
	}
}

func TestVersionAtLeast(t *testing.T) {
	v := Version{4, 2, 1}
	for _, tc := range []struct {
		maj, min, sub int
		want          bool
	}{
		{4, 2, 1, true}, {4, 2, 0, true}, {4, 1, 9, true}, {3, 99, 99, true},
		{4, 2, 2, false}, {4, 3, 0, false}, {5, 0, 0, false},
	} {
		if got := v.AtLeast(tc.maj, tc.min, tc.sub); got != tc.want {
			t.Errorf("%v.AtLeast(%d,%d,%d) = %v", v, tc.maj, tc.min, tc.sub, got)
		}
	}
	if s := v.String(); s != "4.2.1" {
		t.Errorf("String() = %q", s)
	}
}

func TestFindOption(t *testing.T) {
	cfg := "# CONFIG_MEM_SOFT_DIRTY is not set\nCONFIG_HAVE_ARCH_SOFT_DIRTY=y\nCONFIG_USERFAULTFD=y\nCONFIG_LOCALVERSION=\"-x\"\n"
	for name, want := range map[string]string{
		"CONFIG_MEM_SOFT_DIRTY": "",
		"CONFIG_USERFAULTFD":    "y",
		"CONFIG_LOCALVERSION":   "-x",
		"CONFIG_SOFT_DIRTY":     "", // must not match CONFIG_HAVE_ARCH_SOFT_DIRTY
	} {
		if got, err := findOption(strings.NewReader(cfg), name); err != nil || got != want {
			t.Errorf("findOption(%s) = %q, %v; want %q", name, got, err, want)
		}
	}
}

// varint appends a protobuf varint field (wire type 0).
func varint(b []byte, field int, v uint64) []byte {
	b = binary.AppendUvarint(b, uint64(field<<3))
	return binary.AppendUvarint(b, v)
}

// writeStats writes a stats image the way CRIU does: two magics, the payload
// size, then a StatsEntry whose field `field` holds the encoded entry.
func writeStats(t *testing.T, dir, name string, field int, entry []byte) {
	t.Helper()
	payload := binary.AppendUvarint(nil, uint64(field<<3|2))
	payload = binary.AppendUvarint(payload, uint64(len(entry)))
	payload = append(payload, entry...)
	b := binary.LittleEndian.AppendUint32(nil, stats.ImgServiceMagic)
	b = binary.LittleEndian.AppendUint32(b, stats.StatsMagic)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(payload)))
	b = append(b, payload...)
	if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestReadDumpStatsSynthetic(t *testing.T) {
	dir := t.TempDir()
	var e []byte
	e = varint(e, 1, 1500)  // freezing_time, µs
	e = varint(e, 2, 20000) // frozen_time
	e = varint(e, 3, 300)
	e = varint(e, 4, 400)
	e = varint(e, 5, 1000) // pages_scanned
	e = varint(e, 6, 7)
	e = varint(e, 7, 993)
	e = varint(e, 9, 5)
	writeStats(t, dir, stats.StatsDump, 1, e)
	got, err := ReadDumpStats(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := DumpStats{
		FreezingTime: 1500 * time.Microsecond, FrozenTime: 20 * time.Millisecond,
		MemdumpTime: 300 * time.Microsecond, MemwriteTime: 400 * time.Microsecond,
		PagesScanned: 1000, PagesSkippedParent: 7, PagesWritten: 993, PagesLazy: 5,
	}
	if got != want {
		t.Errorf("ReadDumpStats = %+v\nwant %+v", got, want)
	}
}

func TestReadRestoreStatsSynthetic(t *testing.T) {
	dir := t.TempDir()
	var e []byte
	e = varint(e, 1, 10)
	e = varint(e, 2, 2)
	e = varint(e, 3, 900)
	e = varint(e, 4, 50000)
	e = varint(e, 5, 4096)
	writeStats(t, dir, stats.StatsRestore, 2, e)
	got, err := ReadRestoreStats(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := RestoreStats{ForkingTime: 900 * time.Microsecond, RestoreTime: 50 * time.Millisecond,
		PagesCompared: 10, PagesSkippedCow: 2, PagesRestored: 4096}
	if got != want {
		t.Errorf("ReadRestoreStats = %+v\nwant %+v", got, want)
	}
}

func TestReadDumpStatsBadFiles(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadDumpStats(dir); err == nil {
		t.Error("missing stats-dump: want error")
	}
	// Declares a 100-byte payload but holds none: must fail, not panic.
	b := binary.LittleEndian.AppendUint32(nil, stats.ImgServiceMagic)
	b = binary.LittleEndian.AppendUint32(b, stats.StatsMagic)
	b = binary.LittleEndian.AppendUint32(b, 100)
	os.WriteFile(filepath.Join(dir, stats.StatsDump), b, 0o644)
	if _, err := ReadDumpStats(dir); err == nil {
		t.Error("truncated stats-dump: want error")
	}
	os.WriteFile(filepath.Join(dir, stats.StatsDump), []byte("short"), 0o644)
	if _, err := ReadDumpStats(dir); err == nil {
		t.Error("short stats-dump: want error")
	}
	b = binary.LittleEndian.AppendUint32(nil, 0xdeadbeef)
	b = binary.LittleEndian.AppendUint32(b, stats.StatsMagic)
	b = binary.LittleEndian.AppendUint32(b, 0)
	os.WriteFile(filepath.Join(dir, stats.StatsDump), b, 0o644)
	if _, err := ReadDumpStats(dir); err == nil {
		t.Error("bad magic: want error")
	}
}

// needCRIU skips unless the test runs as root with criu in PATH.
func needCRIU(t *testing.T) {
	t.Helper()
	testroot.Require(t, "skipping: needs root for CRIU")
	if _, err := Binary(); err != nil {
		t.Skip("skipping: criu not in PATH")
	}
}

func TestInstalledVersionAndCheck(t *testing.T) {
	needCRIU(t)
	ctx := context.Background()
	v, err := InstalledVersion(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("criu %v", v)
	if v.Major < 3 {
		t.Errorf("implausible version %v", v)
	}
	if err := Check(ctx); err != nil {
		t.Errorf("Check: %v", err)
	}
	if HasFeature(ctx, "no-such-feature") {
		t.Error("HasFeature(no-such-feature) = true")
	}
}

func TestProbeFeatures(t *testing.T) {
	needCRIU(t)
	f := ProbeFeatures(context.Background())
	t.Logf("%+v", f)
	soft, err := KernelOption("CONFIG_MEM_SOFT_DIRTY")
	if err != nil {
		t.Skipf("skipping: %v", err)
	}
	if want := soft == "y"; f.DirtyTracking != want {
		t.Errorf("DirtyTracking = %v, kernel CONFIG_MEM_SOFT_DIRTY=%q", f.DirtyTracking, soft)
	}
	if !f.TCPRepair {
		t.Error("TCPRepair = false as root")
	}
	if want := f.UffdNoncoop && f.PipeMaxSize >= MinLazyPipeSize; f.LazyPages != want {
		t.Errorf("LazyPages = %v, want %v", f.LazyPages, want)
	}
	if f.PipeMaxSize <= 0 {
		t.Errorf("PipeMaxSize = %d", f.PipeMaxSize)
	}
}

// startSleep starts `sleep 60` in its own session and kills it (by PID) when
// the test ends.
func startSleep(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd
}

func TestDumpRestoreStats(t *testing.T) {
	needCRIU(t)
	cmd := startSleep(t)
	dir := t.TempDir()
	out, err := exec.Command("criu", "dump", "-t", strconv.Itoa(cmd.Process.Pid), "-D", dir,
		"--shell-job", "-o", "dump.log").CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "dump.log"))
		t.Fatalf("criu dump: %v: %s\n%s", err, out, log)
	}
	// The dump killed the process; reap it so its PID is free for restore.
	cmd.Wait()

	st, err := ReadDumpStats(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("dump stats: %+v", st)
	if st.PagesScanned == 0 || st.FrozenTime == 0 {
		t.Errorf("dump stats look empty: %+v", st)
	}
	if st.PagesWritten == 0 || st.PagesWritten > st.PagesScanned {
		t.Errorf("PagesWritten = %d of %d scanned", st.PagesWritten, st.PagesScanned)
	}

	// criu restore -d leaves the restored task to whoever reaps orphans;
	// become that reaper so the task can be waited for after the kill.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) })
	pidfile := filepath.Join(dir, "restored.pid")
	out, err = exec.Command("criu", "restore", "-D", dir, "--shell-job", "-d",
		"--pidfile", pidfile, "-o", "restore.log").CombinedOutput()
	if b, rerr := os.ReadFile(pidfile); rerr == nil {
		if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil && pid > 0 {
			t.Cleanup(func() {
				unix.Kill(pid, unix.SIGKILL)
				unix.Wait4(pid, nil, 0, nil)
			})
		}
	}
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "restore.log"))
		t.Fatalf("criu restore: %v: %s\n%s", err, out, log)
	}
	rs, err := ReadRestoreStats(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restore stats: %+v", rs)
	if rs.PagesRestored == 0 {
		t.Errorf("restore stats look empty: %+v", rs)
	}
}

func TestLazyCounts(t *testing.T) {
	log := filepath.Join(t.TempDir(), "lazy-pages.log")
	if err := os.WriteFile(log, []byte(`(00.1) uffd: 7-5: #PF at 0x7f0000001000
(00.2) uffd: 7-5: #PF at 0x7f0000002000
(00.9) uffd: 7-5: UFFD transferred pages: (100/100)
`), 0o600); err != nil {
		t.Fatal(err)
	}
	if f, p := LazyCounts(log); f != 2 || p != 98 {
		t.Errorf("faulted %d pushed %d, want 2 and 98", f, p)
	}
	if f, p := LazyCounts(filepath.Join(t.TempDir(), "none")); f != 0 || p != 0 {
		t.Errorf("a missing log counted %d/%d", f, p)
	}
}

// LogErrors quotes the lines that say why CRIU failed: its errors, the
// lines before "FAILED", what it "Can't" do, never the RLIMIT noise.
func TestLogErrors(t *testing.T) {
	log := filepath.Join(t.TempDir(), "restore.log")
	if err := os.WriteFile(log, []byte(`(00.002369) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted
(00.062028)      1:  `+"`"+`- type 1 ID 0x11
(00.062402)      1: No pagemap-1.img image
(00.063465) mnt: Switching to new ns to clean ghosts
(00.064382) Error (criu/cr-restore.c:2331): Restoring FAILED.
`), 0o600); err != nil {
		t.Fatal(err)
	}
	got := LogErrors(log)
	if !strings.Contains(got, "No pagemap-1.img image") || !strings.Contains(got, "Restoring FAILED") || strings.Contains(got, "RLIMIT") || !strings.HasPrefix(got, "\nCRIU restore.log: ") {
		t.Fatalf("LogErrors: %q", got)
	}
	dump := filepath.Join(t.TempDir(), "dump.log")
	if err := os.WriteFile(dump, []byte("(00.1) page-xfer: Can't connect to server: Connection refused\n(00.2) Dumping finished successfully\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := LogErrors(dump); !strings.Contains(got, "Can't connect to server") {
		t.Errorf("a page server out of reach is not quoted: %q", got)
	}
	if LogErrors(filepath.Join(t.TempDir(), "none")) != "" {
		t.Fatal("a missing log quoted")
	}
}

// A process is found by a file it holds open below a directory, and only
// then (the name check is left out: any process qualifies for usesDir).
func TestUsesDir(t *testing.T) {
	dir := t.TempDir()
	_, err := os.Create(filepath.Join(dir, "sub", "x.log"))
	if err == nil {
		t.Fatal("created a file in a missing directory")
	}
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "sub", "x.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !usesDir(os.Getpid(), dir) || !usesDir(os.Getpid(), filepath.Join(dir, "sub")) {
		t.Error("this process holds a file below the directory")
	}
	f.Close()
	if usesDir(os.Getpid(), dir) {
		t.Error("a closed file still counts")
	}
	if usesDir(os.Getpid(), dir+"x") {
		t.Error("a sibling with a common prefix counts")
	}
}
