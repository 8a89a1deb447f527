package model

import (
	"fmt"
	"math"
	"slices"

	"github.com/ferry-migrate/ferry/api"
)

// Interval is one mode's prediction interval, as ratios of measured to
// predicted (10th and 90th percentiles).
type Interval = api.ModeInterval

// The default interval, for a mode with fewer than MinIntervalSamples
// migrations behind it: wide enough for the errors docs/MODEL.md records
// between calibrations (downtime off by up to half or more, total by a
// fifth), so that a budget judged by the upper bound is not broken by a
// profile that has not seen the mode yet.
const (
	DefaultDowntimeLow  = 0.6
	DefaultDowntimeHigh = 1.6
	DefaultTotalLow     = 0.85
	DefaultTotalHigh    = 1.25
)

// MinIntervalSamples is how many migrations of a mode an interval from
// residuals needs; with fewer, the default applies.
const MinIntervalSamples = 10

// DefaultInterval is the interval of a mode with too few migrations.
func DefaultInterval(mode string) Interval {
	return Interval{Mode: mode, DowntimeLow: DefaultDowntimeLow, DowntimeHigh: DefaultDowntimeHigh,
		TotalLow: DefaultTotalLow, TotalHigh: DefaultTotalHigh}
}

// IntervalFor is the profile's interval for mode, or the default.
func (p Profile) IntervalFor(mode string) Interval {
	for _, iv := range p.Intervals {
		if iv.Mode == mode && iv.Samples >= MinIntervalSamples {
			return iv
		}
	}
	return DefaultInterval(mode)
}

// FitInterval makes mode's interval from measured/predicted ratios of
// downtime and total (one pair per migration): their 10th and 90th
// percentiles, never narrower than the prediction itself (low ≤ 1 ≤
// high would hide a bias, so it is not forced). With fewer than
// MinIntervalSamples pairs it is the default, Samples saying how many
// there were.
func FitInterval(mode string, down, total []float64) Interval {
	n := min(len(down), len(total))
	if n < MinIntervalSamples {
		iv := DefaultInterval(mode)
		iv.Samples = n
		return iv
	}
	return Interval{Mode: mode, Samples: n,
		DowntimeLow: Quantile(down, 0.1), DowntimeHigh: Quantile(down, 0.9),
		TotalLow: Quantile(total, 0.1), TotalHigh: Quantile(total, 0.9)}
}

// Quantile is the q-quantile of xs, interpolated between order
// statistics (NaN for none).
func Quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	pos := q * float64(len(s)-1)
	i := int(math.Floor(pos))
	if i >= len(s)-1 {
		return s[len(s)-1]
	}
	f := pos - float64(i)
	return s[i]*(1-f) + s[i+1]*f
}

// withInterval sets q's bounds from the profile's interval for its mode.
func (p Profile) withInterval(q Prediction) Prediction {
	iv := p.IntervalFor(q.Mode)
	q.DowntimeLowMs, q.DowntimeHighMs = q.DowntimeMs*iv.DowntimeLow, q.DowntimeMs*iv.DowntimeHigh
	q.TotalLowMs, q.TotalHighMs = q.TotalMs*iv.TotalLow, q.TotalMs*iv.TotalHigh
	return q
}

func validateInterval(iv Interval) error {
	for _, v := range []float64{iv.DowntimeLow, iv.DowntimeHigh, iv.TotalLow, iv.TotalHigh} {
		if !(v > 0) || math.IsInf(v, 0) {
			return fmt.Errorf("profile: interval of %s: ratios must be positive numbers", iv.Mode)
		}
	}
	if iv.DowntimeLow > iv.DowntimeHigh || iv.TotalLow > iv.TotalHigh {
		return fmt.Errorf("profile: interval of %s: low above high", iv.Mode)
	}
	return nil
}

// Outside names which of downtime and total (ms) fall outside q's
// interval.
func Outside(q Prediction, downtimeMs, totalMs float64) []string {
	var out []string
	if downtimeMs < q.DowntimeLowMs || downtimeMs > q.DowntimeHighMs {
		out = append(out, "downtime")
	}
	if totalMs < q.TotalLowMs || totalMs > q.TotalHighMs {
		out = append(out, "total")
	}
	return out
}
