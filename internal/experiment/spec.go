// Package experiment runs a grid of migrations in the lab (workload x
// runtime x mode x state size x dirty rate or load x bandwidth x
// repeats) and keeps what each measured: the spec file, the grid, the
// runner, and the results as JSON and CSV. internal/report draws them.
package experiment

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ferry-migrate/ferry/internal/model"
	"github.com/ferry-migrate/ferry/internal/units"
)

// Spec is an experiment file (YAML). Every list is one axis of the grid.
type Spec struct {
	Name string `yaml:"name"`
	// Workloads: memhog, or a real service (Services).
	Workloads []string `yaml:"workloads"`
	// Runtimes: runc (the services run under runc; memhog also under
	// podman and lxc).
	Runtimes []string `yaml:"runtimes"`
	// Modes: cold, precopy, postcopy, hybrid; a live mode may carry a
	// bound on its live rounds, precopy/1 (pre-copy with one round before
	// the switchover, the seeds' plain pre-copy) against precopy (up to
	// the engine's 8).
	Modes []string `yaml:"modes"`
	// StateSizes: memhog's memory, a service's preloaded data ("64M").
	StateSizes []string `yaml:"state_sizes"`
	// DirtyRates: memhog's pages written per second.
	DirtyRates []int `yaml:"dirty_rates"`
	// Loads: a service client's requests per second.
	Loads []int `yaml:"loads"`
	// Bandwidths: the lab's link rate ("1gbit"); one lab per bandwidth.
	Bandwidths []string `yaml:"bandwidths"`
	Repeats    int      `yaml:"repeats"`
	// Before and After: how long the clients run before the migration
	// starts and after it ends (the latency figures' "before" and
	// "after").
	Before time.Duration `yaml:"before"`
	After  time.Duration `yaml:"after"`
	// Connections a service's client keeps (default 1; with more, the
	// first writes and the others read, or publish for MQTT).
	Connections int `yaml:"connections"`
	// Tools also runs each service's own benchmark beside its client
	// (redis-benchmark, pgbench, mosquitto_pub; Memcached has none).
	Tools bool `yaml:"tools"`
	// Budget is the client stall --mode auto is held to (with a profile:
	// at each point where every mode was measured, the model's pick
	// against the mode that measured best within it; 0: no budget).
	Budget time.Duration `yaml:"budget"`
	// Profile, when set, is a calibrated profile (ferry-lab calibrate): each
	// run gets the model's prediction beside its measurement.
	Profile string `yaml:"profile"`
}

// Defaults of a spec's empty fields.
const (
	DefaultRepeats   = 3
	DefaultDirtyRate = 100
	DefaultLoad      = 200
	DefaultBandwidth = "1gbit"
	DefaultBefore    = 2 * time.Second
	DefaultAfter     = 2 * time.Second
)

// ParseSpec reads an experiment file, fills the defaults and checks every
// value, so that a bad one fails before any lab comes up.
func ParseSpec(data []byte) (Spec, error) {
	var s Spec
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&s); err != nil {
		return s, fmt.Errorf("experiment file: %w", err)
	}
	s.fill()
	return s, s.check()
}

func (s *Spec) fill() {
	if s.Name == "" {
		s.Name = "experiment"
	}
	if len(s.Runtimes) == 0 {
		s.Runtimes = []string{"runc"}
	}
	if len(s.Modes) == 0 {
		s.Modes = slices.Clone(model.EngineModes)
	}
	if len(s.DirtyRates) == 0 {
		s.DirtyRates = []int{DefaultDirtyRate}
	}
	if len(s.Loads) == 0 {
		s.Loads = []int{DefaultLoad}
	}
	if len(s.Bandwidths) == 0 {
		s.Bandwidths = []string{DefaultBandwidth}
	}
	if s.Connections == 0 {
		s.Connections = 1
	}
	if s.Repeats == 0 {
		s.Repeats = DefaultRepeats
	}
	if s.Before == 0 {
		s.Before = DefaultBefore
	}
	if s.After == 0 {
		s.After = DefaultAfter
	}
}

func (s Spec) check() error {
	var errs []error
	if len(s.Workloads) == 0 {
		errs = append(errs, fmt.Errorf("workloads: name at least one of %s", WorkloadNames()))
	}
	for _, w := range s.Workloads {
		if _, ok := workloads[w]; !ok {
			errs = append(errs, fmt.Errorf("workloads: unknown %q (one of %s)", w, WorkloadNames()))
		}
	}
	for _, r := range s.Runtimes {
		if !slices.Contains([]string{"runc", "podman", "lxc"}, r) {
			errs = append(errs, fmt.Errorf("runtimes: unknown %q (runc, podman, lxc)", r))
			continue
		}
		for _, w := range s.Workloads {
			if wl, ok := workloads[w]; ok && wl.service != nil && r != "runc" {
				errs = append(errs, fmt.Errorf("runtimes: %s runs under runc only (it needs an address of its own, which the lab gives runc containers)", w))
			}
		}
	}
	for _, m := range s.Modes {
		if _, _, err := SplitMode(m); err != nil {
			errs = append(errs, fmt.Errorf("modes: %w", err))
		}
		if m != ModeNormal {
			continue
		}
		for _, w := range s.Workloads {
			if workloads[w].service != nil {
				errs = append(errs, fmt.Errorf("modes: %s moves memhog only (through Podman's checkpoint --export), not %s", ModeNormal, w))
			}
		}
	}
	if len(s.StateSizes) == 0 {
		errs = append(errs, errors.New("state_sizes: give at least one (e.g. 64M)"))
	}
	for _, v := range s.StateSizes {
		if n, err := units.ParseBytes(v); err != nil || n <= 0 {
			errs = append(errs, fmt.Errorf("state_sizes: %q is not a size (64M, 1G)", v))
		}
	}
	for _, v := range s.Bandwidths {
		if _, err := units.ParseRate(v); err != nil {
			errs = append(errs, fmt.Errorf("bandwidths: %w", err))
		}
	}
	for _, v := range s.DirtyRates {
		if v < 0 {
			errs = append(errs, fmt.Errorf("dirty_rates: %d is negative", v))
		}
	}
	for _, v := range s.Loads {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("loads: %d must be at least 1 request per second", v))
		}
	}
	if s.Connections < 1 {
		errs = append(errs, fmt.Errorf("connections: %d must be at least 1", s.Connections))
	}
	if s.Repeats < 1 {
		errs = append(errs, fmt.Errorf("repeats: %d must be at least 1", s.Repeats))
	}
	if s.Budget < 0 {
		errs = append(errs, errors.New("budget must not be negative"))
	}
	if s.Before < 0 || s.After < 0 {
		errs = append(errs, errors.New("before and after must not be negative"))
	}
	return errors.Join(errs...)
}

// Grid lists the spec's points: every combination of its axes, memhog
// with each dirty rate and a service with each load. Points of one
// bandwidth come together (the lab comes up once per bandwidth).
func (s Spec) Grid() []Point {
	var pts []Point
	for _, bw := range s.Bandwidths {
		bps, _ := units.ParseRate(bw)
		for _, w := range s.Workloads {
			rates, loads := s.DirtyRates, []int{0}
			if workloads[w].service != nil {
				rates, loads = []int{0}, s.Loads
			}
			for _, rt := range s.Runtimes {
				for _, size := range s.StateSizes {
					n, _ := units.ParseBytes(size)
					for _, rate := range rates {
						for _, load := range loads {
							for _, m := range s.Modes {
								pts = append(pts, Point{Workload: w, Runtime: rt, Mode: m, StateBytes: n,
									DirtyRate: rate, Load: load, BandwidthBps: bps})
							}
						}
					}
				}
			}
		}
	}
	return pts
}

// MaxModeRounds bounds a mode's round count (precopy/N).
const MaxModeRounds = 32

// ModeNormal is not ferry's: the container checkpointed to disk, the
// archive copied, then restored (Podman's checkpoint --export and restore
// --import; paper 003's "Normal"). memhog only, under Podman.
const ModeNormal = "normal"

// SplitMode reads a spec's mode: the engine's mode, and the bound on its
// live rounds (0: the engine's default).
func SplitMode(m string) (mode string, rounds int, err error) {
	mode, n, bounded := strings.Cut(m, "/")
	if m == ModeNormal {
		return m, 0, nil
	}
	if !slices.Contains(model.EngineModes, mode) {
		return mode, 0, fmt.Errorf("unknown %q (one of %v, or %s; precopy/N or hybrid/N bound the live rounds)", m, model.EngineModes, ModeNormal)
	}
	if !bounded {
		return mode, 0, nil
	}
	if mode != model.ModePrecopy && mode != model.ModeHybrid {
		return mode, 0, fmt.Errorf("%q: only precopy and hybrid have live rounds to bound", m)
	}
	rounds, err = strconv.Atoi(n)
	if err != nil || rounds < 1 || rounds > MaxModeRounds {
		return mode, 0, fmt.Errorf("%q: the round bound must be 1 to %d", m, MaxModeRounds)
	}
	return mode, rounds, nil
}
