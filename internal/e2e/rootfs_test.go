package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/agent"
	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/units"
)

// TestLargeRootfs moves a container with a real Debian root filesystem
// plus 50,000 more files and a 200 MB file (over 60,000 entries: its
// manifest is several control frames long) there and back, checking
// memhog's state and the big file each time.
func TestLargeRootfs(t *testing.T) {
	requireLab(t)
	if err := lab.DebianMirrorReachable(context.Background(), lab.DebianOptions{}, 5*time.Second); err != nil {
		if _, cerr := os.Stat((lab.DebianOptions{}).Path()); cerr != nil {
			t.Skipf("no cached Debian rootfs and the mirror is unreachable (%v): cannot build a real root filesystem here", err)
		}
	}
	bin := ferryBin(t)
	l := upLab(t, bin)
	ctx := context.Background()
	const name = "bigroot"
	if err := l.RunWith(ctx, "h1", name, lab.RunOptions{Rootfs: lab.RootfsDebian},
		[]string{"/usr/local/bin/memhog", "--memory", "64M", "--dirty-rate", "200", "--port", memhogPort}); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(l.Hosts[0].BundleDir(name), "rootfs")
	data := filepath.Join(root, "data")
	for d := 0; d < 50; d++ {
		dir := filepath.Join(data, fmt.Sprintf("d%02d", d))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for f := 0; f < 1000; f++ {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%04d", f)), []byte(fmt.Sprintf("%d/%d\n", d, f)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	big := make([]byte, 200<<20)
	for i := range big {
		big[i] = byte(i*7 + i>>12)
	}
	if err := os.WriteFile(filepath.Join(data, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	p, st, err := bench.StartProbe(ctx, &l.Hosts[2], bin,
		[]string{l.Hosts[0].Addr + ":" + memhogPort, l.Hosts[1].Addr + ":" + memhogPort}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := units.ParseBytes("64M"); int64(st.MemoryBytes) != want {
		t.Fatalf("memhog holds %d bytes", st.MemoryBytes)
	}
	from, to := &l.Hosts[0], &l.Hosts[1]
	// Cold (a streamed dump) and hybrid (rounds, a lazy dump): every
	// technique's rootfs sync is the same code. Each leg writes 60,000
	// files at the destination, about a minute on this machine's disk, so
	// the other modes are measured by hand (docs/BENCHMARKS.md).
	for _, mode := range []string{engine.ModeCold, engine.ModeHybrid} {
		rep, err := agent.Migrate(ctx, agent.Socket(from.ControlSock), engine.Request{Container: name, To: to.AgentAddr, Mode: mode}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !rep.OK {
			t.Fatalf("%s %s -> %s: %s (at %s)", mode, from.Name, to.Name, rep.Error, rep.FailedAt)
		}
		t.Logf("%s %s -> %s: downtime %.0f ms, total %.0f ms, bytes %d, frozen rootfs scan: %s", mode, from.Name, to.Name, rep.DowntimeMs, rep.TotalMs, rep.BytesSent, rep.FrozenRootfsScan)
		// The frozen pass looked only at what the watch saw change.
		if !strings.HasSuffix(rep.FrozenRootfsScan, " changed paths") {
			t.Errorf("%s: the frozen rootfs sync walked the tree: %q", mode, rep.FrozenRootfsScan)
		}
		got, err := os.ReadFile(filepath.Join(to.BundleDir(name), "rootfs", "data", "big"))
		if err != nil || len(got) != len(big) || string(got[len(got)-4096:]) != string(big[len(big)-4096:]) {
			t.Fatalf("%s: the 200 MB file did not arrive whole (%d bytes, %v)", mode, len(got), err)
		}
		if n := countFiles(t, filepath.Join(to.BundleDir(name), "rootfs")); n < 60000 {
			t.Fatalf("%s: %d entries arrived, want over 60,000", mode, n)
		}
		from, to = to, from
	}
	pr, perr := p.Stop()
	if perr != nil || !pr.StateOK {
		t.Fatalf("workload state: %+v %v", pr, perr)
	}
}

func countFiles(t *testing.T, root string) int {
	t.Helper()
	n := 0
	if err := filepath.WalkDir(root, func(string, os.DirEntry, error) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}
