package hostload

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/procfs"
)

// fixture is a /proc of stat and meminfo texts, whose stat can change.
type fixture struct {
	t   *testing.T
	dir string
}

func newFixture(t *testing.T, stat, meminfo string) *fixture {
	f := &fixture{t: t, dir: t.TempDir()}
	f.stat(stat)
	if err := os.WriteFile(filepath.Join(f.dir, "meminfo"), []byte(meminfo), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) stat(text string) {
	if err := os.WriteFile(filepath.Join(f.dir, "stat"), []byte(text), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) meter() *Meter {
	fs, err := procfs.NewFS(f.dir)
	if err != nil {
		f.t.Fatal(err)
	}
	m, err := newMeter(fs, f.dir)
	if err != nil {
		f.t.Fatal(err)
	}
	return m
}

// Four CPUs, in USER_HZ ticks: user nice system idle iowait irq softirq
// steal guest guest_nice.
const stat0 = `cpu  1000 100 500 8000 200 10 40 50 300 0
cpu0 250 25 125 2000 50 3 10 12 75 0
cpu1 250 25 125 2000 50 3 10 13 75 0
cpu2 250 25 125 2000 50 2 10 12 75 0
cpu3 250 25 125 2000 50 2 10 13 75 0
intr 123456 1 2 3
ctxt 987654
btime 1764300000
processes 4242
procs_running 3
procs_blocked 0
softirq 1000 1 2 3 4 5 6 7 8 9 10
`

// 400 ticks later (100 per CPU): 100 user (200 of it a guest's, already
// in user), 20 system, 10 steal, 230 idle, 40 iowait.
const stat1 = `cpu  1100 100 520 8230 240 10 40 60 500 0
cpu0 275 25 130 2058 60 3 10 14 125 0
cpu1 275 25 130 2057 60 3 10 16 125 0
cpu2 275 25 130 2058 60 2 10 14 125 0
cpu3 275 25 130 2057 60 2 10 16 125 0
intr 123999 1 2 3
ctxt 999999
btime 1764300000
processes 4300
procs_running 5
procs_blocked 1
softirq 1100 1 2 3 4 5 6 7 8 9 110
`

const meminfo = `MemTotal:       16326428 kB
MemFree:         1234567 kB
MemAvailable:   11223344 kB
Buffers:          234567 kB
Cached:          8765432 kB
SwapTotal:             0 kB
`

func TestMeterFixture(t *testing.T) {
	f := newFixture(t, stat0, meminfo)
	m := f.meter()
	// Nothing moved yet: no CPU figure to give.
	if _, err := m.Read(); !errors.Is(err, errTooSoon) {
		t.Fatalf("a reading with no time passed: %v", err)
	}
	f.stat(stat1)
	l, err := m.Read()
	if err != nil {
		t.Fatal(err)
	}
	// (230 idle + 40 iowait) of 400 ticks, of 4 CPUs.
	if want := 4 * 270.0 / 400; l.CPUs != 4 || math.Abs(l.CPUFree-want) > 1e-9 {
		t.Errorf("CPUs %d, free %v; want 4, %v", l.CPUs, l.CPUFree, want)
	}
	if l.CPUWindow <= 0 {
		t.Errorf("window %v", l.CPUWindow)
	}
	if l.MemTotal != 16326428*1024 || l.MemAvailable != 11223344*1024 {
		t.Errorf("memory %d available of %d", l.MemAvailable, l.MemTotal)
	}
	if l.Dir != f.dir || l.DiskTotal == 0 || l.DiskFree > l.DiskTotal {
		t.Errorf("storage of %s: %d free of %d", l.Dir, l.DiskFree, l.DiskTotal)
	}

	// Read again at once: the kernel's times have not moved, so the last
	// figures stand.
	again, err := m.Read()
	if err != nil || again.CPUFree != l.CPUFree || again.CPUWindow != l.CPUWindow {
		t.Errorf("a reading too soon: %+v, %v; want the last CPU figures %v over %v", again, err, l.CPUFree, l.CPUWindow)
	}
}

func TestCPUFree(t *testing.T) {
	c := func(user, system, idle, iowait, steal float64) procfs.CPUStat {
		return procfs.CPUStat{User: user, System: system, Idle: idle, Iowait: iowait, Steal: steal}
	}
	for _, tc := range []struct {
		name      string
		prev, cur procfs.CPUStat
		cpus      int
		want      float64
	}{
		{"all idle", c(0, 0, 0, 0, 0), c(0, 0, 8, 0, 0), 8, 8},
		{"all busy", c(0, 0, 0, 0, 0), c(6, 2, 0, 0, 0), 8, 0},
		{"iowait is free", c(0, 0, 0, 0, 0), c(2, 0, 1, 1, 0), 4, 2},
		{"steal is busy", c(0, 0, 0, 0, 0), c(0, 0, 2, 0, 2), 4, 2},
		{"idle and iowait stepping back", c(0, 0, 0, 5, 0), c(1, 0, 0, 4, 0), 2, 0},
	} {
		got, err := cpuFree(tc.prev, tc.cur, tc.cpus)
		if err != nil || math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
	if _, err := cpuFree(c(1, 1, 1, 1, 1), c(1, 1, 1, 1, 1), 4); !errors.Is(err, errTooSoon) {
		t.Errorf("no time passed: %v", err)
	}
}

func TestMissingMemAvailable(t *testing.T) {
	f := newFixture(t, stat0, "MemTotal: 1000 kB\nMemFree: 500 kB\n")
	m := f.meter()
	f.stat(stat1)
	if _, err := m.Read(); err == nil {
		t.Error("no error without MemAvailable")
	}
}

// This host, for real.
func TestMeasure(t *testing.T) {
	dir := t.TempDir()
	l, err := Measure(context.Background(), dir, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", l)
	if l.CPUs <= 0 || l.CPUFree < 0 || l.CPUFree > float64(l.CPUs) || l.CPUWindow < 200*time.Millisecond {
		t.Errorf("CPU: %v free of %d over %v", l.CPUFree, l.CPUs, l.CPUWindow)
	}
	if l.MemTotal == 0 || l.MemAvailable == 0 || l.MemAvailable > l.MemTotal {
		t.Errorf("memory: %d available of %d", l.MemAvailable, l.MemTotal)
	}
	if l.Dir != dir || l.DiskTotal == 0 || l.DiskFree > l.DiskTotal {
		t.Errorf("storage of %s: %d free of %d", l.Dir, l.DiskFree, l.DiskTotal)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Measure(ctx, dir, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	if _, err := Measure(context.Background(), filepath.Join(dir, "absent"), 20*time.Millisecond); err == nil {
		t.Error("no error for a directory that does not exist")
	}
}
