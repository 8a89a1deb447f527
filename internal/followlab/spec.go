// Package followlab runs a mobility scenario in the lab: edge hosts whose
// round trip to a client follows a schedule (a user driving past them), a
// real service with its own load client, and `ferry follow` moving the
// service after the client. It keeps what the client felt, which host
// served it, every decision and every move, and scores them against an
// oracle always on the nearest host and a service that never moves.
package followlab

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ferry-migrate/ferry/internal/delayline"
	"github.com/ferry-migrate/ferry/internal/follow"
	"github.com/ferry-migrate/ferry/internal/units"
)

// Kind is a follow scenario's kind: key in its file.
const Kind = "follow"

// Spec is a follow scenario's file (YAML).
type Spec struct {
	Name string `yaml:"name"`
	Kind string `yaml:"kind"`
	// Hosts is the number of edge hosts (h1..hN); the client is the lab's
	// host after them, with no delay of its own.
	Hosts int `yaml:"hosts"`
	// Service: redis (Debian's redis-server, with lab-tool load's client).
	Service string `yaml:"service"`
	// Rate is the client's requests a second.
	Rate float64 `yaml:"rate"`
	// Start is the host the service starts on.
	Start string `yaml:"start"`
	// Bandwidth is every link's rate ("1gbit"; "" unshaped).
	Bandwidth string `yaml:"bandwidth"`
	// Duration is the scenario's length.
	Duration time.Duration `yaml:"duration"`
	// Schedule gives each host's round trip to the client from a time on
	// (the first step at 0s); Noise jitters every host's round trip by up
	// to this share, anew every NoiseEvery (default 1s).
	Schedule   []Step        `yaml:"schedule"`
	Noise      float64       `yaml:"noise"`
	NoiseEvery time.Duration `yaml:"noise_every"`
	// Follow are ferry follow's settings.
	Follow FollowSettings `yaml:"follow"`
	// Profile is a calibrated profile for the predictions ("": defaults).
	Profile string `yaml:"profile"`
}

// Step is one point of the schedule.
type Step struct {
	At  time.Duration            `yaml:"at"`
	RTT map[string]time.Duration `yaml:"rtt"`
}

// FollowSettings are ferry follow's flags.
type FollowSettings struct {
	Threshold   time.Duration `yaml:"threshold"`
	Dwell       time.Duration `yaml:"dwell"`
	Hysteresis  *float64      `yaml:"hysteresis"`
	MinInterval time.Duration `yaml:"min_interval"`
	Interval    time.Duration `yaml:"interval"`
	MaxDowntime time.Duration `yaml:"max_downtime"`
}

// Trigger is the settings as the follow package takes them.
func (f FollowSettings) Trigger() follow.TriggerConfig {
	t := follow.TriggerConfig{Threshold: f.Threshold, Dwell: f.Dwell, MinInterval: f.MinInterval, Hysteresis: follow.DefaultTrigger().Hysteresis}
	if f.Hysteresis != nil {
		t.Hysteresis = *f.Hysteresis
	}
	return t
}

// IsFollow says whether an experiment file is a follow scenario.
func IsFollow(data []byte) bool {
	var k struct {
		Kind string `yaml:"kind"`
	}
	return yaml.Unmarshal(data, &k) == nil && k.Kind == Kind
}

// ParseSpec reads a scenario, fills its defaults and checks every value
// before any lab comes up.
func ParseSpec(data []byte) (Spec, error) {
	var s Spec
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&s); err != nil {
		return Spec{}, fmt.Errorf("follow scenario: %w", err)
	}
	if s.Kind != Kind {
		return Spec{}, fmt.Errorf("follow scenario: kind %q, want %q", s.Kind, Kind)
	}
	if s.Service == "" {
		s.Service = "redis"
	}
	if s.Rate == 0 {
		s.Rate = 50
	}
	if s.NoiseEvery == 0 {
		s.NoiseEvery = time.Second
	}
	if s.Follow.Interval == 0 {
		s.Follow.Interval = time.Second
	}
	if s.Start == "" {
		s.Start = "h1"
	}
	return s, s.check()
}

func (s Spec) check() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if s.Name == "" {
		bad("name: empty")
	}
	if s.Hosts < 2 || s.Hosts > 8 {
		bad("hosts: %d, want 2 to 8 edge hosts", s.Hosts)
	}
	if s.Service != "redis" {
		bad("service %q: only redis", s.Service)
	}
	if !(s.Rate > 0) || s.Rate > 5000 {
		bad("rate %v: want 1 to 5000 requests a second", s.Rate)
	}
	if s.Bandwidth != "" {
		if _, err := units.ParseRate(s.Bandwidth); err != nil {
			bad("bandwidth: %v", err)
		}
	}
	if s.Duration <= 0 || s.Duration > 2*time.Hour {
		bad("duration %v: want up to 2h", s.Duration)
	}
	if s.Noise < 0 || s.Noise >= 1 {
		bad("noise %v: a share, at least 0 and below 1", s.Noise)
	}
	if len(s.Schedule) == 0 || s.Schedule[0].At != 0 {
		bad("schedule: its first step must be at 0s")
	}
	hosts := s.HostNames()
	if !slices.Contains(hosts, s.Start) {
		bad("start %q: not one of %v", s.Start, hosts)
	}
	for i, st := range s.Schedule {
		if i > 0 && st.At <= s.Schedule[i-1].At {
			bad("schedule step %d at %v: steps must be in time order", i, st.At)
		}
		for _, h := range hosts {
			d, ok := st.RTT[h]
			if i == 0 && !ok {
				bad("schedule step 0: no round trip for %s", h)
			}
			if d < 0 || d*time.Duration(1+s.Noise*2) > delayline.MaxRTT {
				bad("schedule step %d: %s's round trip %v out of range", i, h, d)
			}
		}
		for h := range st.RTT {
			if !slices.Contains(hosts, h) {
				bad("schedule step %d: no host %s", i, h)
			}
		}
	}
	if err := s.Follow.Trigger().Check(); err != nil {
		bad("follow: %v", err)
	}
	if s.Follow.Interval <= 0 {
		bad("follow.interval must be above zero")
	}
	return errors.Join(errs...)
}

// HostNames are the edge hosts.
func (s Spec) HostNames() []string {
	var hs []string
	for i := 1; i <= s.Hosts; i++ {
		hs = append(hs, fmt.Sprintf("h%d", i))
	}
	return hs
}

// RTTAt is the schedule's round trip of every host at t (without noise):
// each host keeps the last value a step gave it.
func (s Spec) RTTAt(t time.Duration) map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, st := range s.Schedule {
		if st.At > t {
			break
		}
		for h, d := range st.RTT {
			out[h] = d
		}
	}
	return out
}
