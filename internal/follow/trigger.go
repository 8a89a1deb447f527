package follow

import (
	"fmt"
	"slices"
	"time"
)

// TriggerConfig says when the client's latency calls for a move.
type TriggerConfig struct {
	// Threshold is L_thr: latency above it is too far.
	Threshold time.Duration
	// Dwell is how long the latency must stay too far before a move: a
	// client passing through a bad spot does not move the service.
	Dwell time.Duration
	// Hysteresis is the band below Threshold that a sample must fall
	// into to count as near again, as a share of Threshold (0.2: below
	// 80 %). A noisy latency that dips just under the threshold does not
	// restart the dwell, and a host is only "better" when it is clearly
	// so (Placement uses the same band).
	Hysteresis float64
	// MinInterval is the least time between two moves of the service,
	// whatever the latency does.
	MinInterval time.Duration
}

// DefaultTrigger suits an edge service whose clients move at street
// speed: a few seconds of a bad path are ignored, and a service moves at
// most once a minute.
func DefaultTrigger() TriggerConfig {
	return TriggerConfig{Threshold: 30 * time.Millisecond, Dwell: 10 * time.Second, Hysteresis: 0.2, MinInterval: time.Minute}
}

// Check refuses settings that would fire on every sample or never.
func (c TriggerConfig) Check() error {
	switch {
	case c.Threshold <= 0:
		return fmt.Errorf("threshold %v: it must be above zero (every latency would be too far)", c.Threshold)
	case c.Dwell < 0:
		return fmt.Errorf("dwell %v must not be negative", c.Dwell)
	case c.Hysteresis < 0 || c.Hysteresis >= 1:
		return fmt.Errorf("hysteresis %v must be at least 0 and below 1 (a share of the threshold)", c.Hysteresis)
	case c.MinInterval < 0:
		return fmt.Errorf("minimum interval %v must not be negative", c.MinInterval)
	}
	return nil
}

// Near is the latency below which a sample counts as near again.
func (c TriggerConfig) Near() time.Duration {
	return time.Duration(float64(c.Threshold) * (1 - c.Hysteresis))
}

// Trigger watches one service's client latency. It is not safe for
// concurrent use; the follow loop owns it.
type Trigger struct {
	cfg TriggerConfig
	// farSince is when the latency went above the threshold (zero: it is
	// near, or between the bands without having been far).
	farSince time.Time
	// lastMove is when the service last moved (zero: never).
	lastMove time.Time
	// far holds the samples since farSince, for the median a firing
	// reports: one noisy sample must not decide how far the clients are.
	far []time.Duration
}

// maxFarSamples bounds what a long dwell keeps (the median of the most
// recent ones is as good).
const maxFarSamples = 4096

// NewTrigger starts a trigger; lastMove is when the service last moved
// (zero if never), e.g. from the follow loop's saved state.
func NewTrigger(cfg TriggerConfig, lastMove time.Time) *Trigger {
	return &Trigger{cfg: cfg, lastMove: lastMove}
}

// Verdict is what one latency sample decided.
type Verdict struct {
	Fire bool `json:"fire"`
	// FarFor is how long the latency has been too far (0: it is not),
	// and Latency the median of the samples over that time (the sample
	// itself when it is not far).
	FarFor  time.Duration `json:"far_for_ns"`
	Latency time.Duration `json:"latency_ns"`
	Reason  string        `json:"reason"`
}

// Observe takes one latency sample at now.
func (t *Trigger) Observe(now time.Time, latency time.Duration) Verdict {
	c := t.cfg
	switch {
	case latency > c.Threshold:
		if t.farSince.IsZero() {
			t.farSince = now
		}
	case latency < c.Near():
		t.reset(time.Time{})
		return Verdict{Latency: latency, Reason: fmt.Sprintf("latency %v is below %v", round(latency), round(c.Near()))}
	case t.farSince.IsZero():
		// Inside the band without having been far: nothing starts.
		return Verdict{Latency: latency, Reason: fmt.Sprintf("latency %v is within the threshold %v", round(latency), round(c.Threshold))}
	}
	if len(t.far) == maxFarSamples {
		t.far = append(t.far[:0], t.far[maxFarSamples/2:]...)
	}
	t.far = append(t.far, latency)
	med := Median(t.far)
	far := now.Sub(t.farSince)
	v := Verdict{FarFor: far, Latency: med}
	if far < c.Dwell {
		v.Reason = fmt.Sprintf("latency %v (median) above %v for %v of the %v dwell", round(med), round(c.Threshold), round(far), c.Dwell)
		return v
	}
	if !t.lastMove.IsZero() {
		if since := now.Sub(t.lastMove); since < c.MinInterval {
			v.Reason = fmt.Sprintf("latency %v (median) too far for %v, but the service moved %v ago (minimum interval %v)", round(med), round(far), round(since), c.MinInterval)
			return v
		}
	}
	v.Fire = true
	v.Reason = fmt.Sprintf("latency %v (median) above %v for %v (dwell %v)", round(med), round(c.Threshold), round(far), c.Dwell)
	return v
}

func (t *Trigger) reset(since time.Time) {
	t.farSince = since
	t.far = t.far[:0]
}

// Median is the middle of samples (the mean of the two middle ones for
// an even count); 0 for none.
func Median(samples []time.Duration) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// Moved records a move at now: the interval starts, and the latency must
// be too far for a whole dwell again.
func (t *Trigger) Moved(now time.Time) {
	t.lastMove = now
	t.reset(time.Time{})
}

// Held records a decision not to move (no candidate is better): the
// dwell starts again, so a service with nowhere better to go is
// reconsidered once a dwell later, not on every sample.
func (t *Trigger) Held(now time.Time) { t.reset(now) }

func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(100 * time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(100 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}
