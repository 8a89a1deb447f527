// Package cgroups is what ferry does with a container's cgroups itself:
// reads and sets its CPU bandwidth limit, on cgroup v1 (cpu.cfs_quota_us,
// cpu.cfs_period_us) and v2 (cpu.max), which auto-converge throttles
// while pre-copy rounds fail to converge; continues the processes of a
// container restored stopped (Continue); destroys a cgroup a failed
// restore left (Destroy); lists the mounted hierarchies (Hierarchies) and
// makes CRIU a yard of them (Yard). Finding a cgroup (mountinfo, cgroup
// namespaces, hybrid hierarchies) and opening its files safely is runc's
// cgroups library; this package only speaks the file formats.
package cgroups

import (
	"fmt"
	"strconv"
	"strings"

	occgroups "github.com/opencontainers/cgroups"
)

// unifiedMountpoint is where cgroup v2 is mounted in unified mode.
const unifiedMountpoint = "/sys/fs/cgroup"

// Bandwidth is a CFS bandwidth limit: the cgroup may run QuotaUs
// microseconds of CPU time per PeriodUs. QuotaUs < 0 means no limit.
// A PeriodUs of 0 in Set keeps the cgroup's period.
type Bandwidth struct {
	QuotaUs  int64
	PeriodUs uint64
}

// Unlimited is no CPU limit.
var Unlimited = Bandwidth{QuotaUs: -1}

// Limited lets the cgroup use share (0 < share ≤ 1) of one CPU per period.
func Limited(share float64, periodUs uint64) Bandwidth {
	return Bandwidth{QuotaUs: max(int64(share*float64(periodUs)), 1000), PeriodUs: periodUs}
}

// CPU is one cgroup's CPU controller.
type CPU struct {
	dir string
	v2  bool
}

// CPUOf finds the CPU controller of pid's cgroup.
func CPUOf(pid int) (*CPU, error) {
	dir, err := dirOf(pid, "cpu")
	if err != nil {
		return nil, err
	}
	return &CPU{dir: dir, v2: occgroups.IsCgroup2UnifiedMode()}, nil
}

// Dir is the cgroup's directory.
func (c *CPU) Dir() string { return c.dir }

// Get reads the cgroup's bandwidth limit.
func (c *CPU) Get() (Bandwidth, error) {
	if c.v2 {
		s, err := occgroups.ReadFile(c.dir, "cpu.max")
		if err != nil {
			return Bandwidth{}, err
		}
		return parseMax(s)
	}
	q, err := c.readInt("cpu.cfs_quota_us")
	if err != nil {
		return Bandwidth{}, err
	}
	p, err := c.readInt("cpu.cfs_period_us")
	if err != nil {
		return Bandwidth{}, err
	}
	return Bandwidth{QuotaUs: q, PeriodUs: uint64(p)}, nil
}

// Set writes the cgroup's bandwidth limit.
func (c *CPU) Set(b Bandwidth) error {
	if c.v2 {
		return occgroups.WriteFile(c.dir, "cpu.max", formatMax(b))
	}
	// The kernel checks quota against the period at each write, so a
	// shorter period goes in after the quota that fits it, a longer one
	// before.
	writeQuota := func() error {
		return occgroups.WriteFile(c.dir, "cpu.cfs_quota_us", strconv.FormatInt(max(b.QuotaUs, -1), 10))
	}
	if b.PeriodUs == 0 {
		return writeQuota()
	}
	if err := occgroups.WriteFile(c.dir, "cpu.cfs_period_us", strconv.FormatUint(b.PeriodUs, 10)); err != nil {
		if err2 := writeQuota(); err2 != nil {
			return err
		}
		return occgroups.WriteFile(c.dir, "cpu.cfs_period_us", strconv.FormatUint(b.PeriodUs, 10))
	}
	return writeQuota()
}

func (c *CPU) readInt(file string) (int64, error) {
	s, err := occgroups.ReadFile(c.dir, file)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(s), 10, 64)
}

// parseMax reads cgroup v2's cpu.max: "QUOTA PERIOD" or "max PERIOD".
func parseMax(s string) (Bandwidth, error) {
	f := strings.Fields(s)
	if len(f) != 2 {
		return Bandwidth{}, fmt.Errorf("cpu.max: %q is not \"QUOTA PERIOD\"", strings.TrimSpace(s))
	}
	period, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return Bandwidth{}, fmt.Errorf("cpu.max period: %w", err)
	}
	if f[0] == "max" {
		return Bandwidth{QuotaUs: -1, PeriodUs: period}, nil
	}
	quota, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return Bandwidth{}, fmt.Errorf("cpu.max quota: %w", err)
	}
	return Bandwidth{QuotaUs: quota, PeriodUs: period}, nil
}

// formatMax writes cgroup v2's cpu.max; without a period, the kernel keeps
// the one it has.
func formatMax(b Bandwidth) string {
	q := "max"
	if b.QuotaUs >= 0 {
		q = strconv.FormatInt(b.QuotaUs, 10)
	}
	if b.PeriodUs == 0 {
		return q
	}
	return q + " " + strconv.FormatUint(b.PeriodUs, 10)
}
