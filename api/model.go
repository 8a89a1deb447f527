package api

import "encoding/json"

// ModelStatus is what an agent learned from the migrations it ran as
// their source (ferry calibrate --status): each term's refit and error,
// and the profile it plans with.
type ModelStatus struct {
	// Migrations is how many reports the agent keeps (the last ones).
	Migrations int `json:"migrations"`
	// Base names the profile the refit starts from (--profile, or the
	// defaults); Profile is the one in use, refitted from the reports.
	Base    string          `json:"base"`
	Profile json.RawMessage `json:"profile"`
	Terms   []TermStatus    `json:"terms"`
	// Intervals are the modes' prediction intervals, as ratios of
	// measured to predicted.
	Intervals []ModeInterval `json:"intervals,omitempty"`
	// Drift says a term's recent error is beyond DriftBound with enough
	// migrations behind it: the profile no longer describes this host.
	Drift      bool    `json:"drift"`
	DriftBound float64 `json:"drift_bound"` // a fraction (0.25: 25 %)
}

// TermStatus is one term of the model on one host.
type TermStatus struct {
	Name string `json:"name"`
	// Migrations is how many kept reports measured the term.
	Migrations int `json:"migrations"`
	// Refitted: enough migrations fed it, so the profile's value is
	// theirs, not the base profile's.
	Refitted bool `json:"refitted"`
	// RecentError is the mean absolute relative error of the last
	// RecentCount predictions against their measurements (each predicted
	// before its migration ran, by the profile then in use).
	RecentError float64 `json:"recent_error"`
	RecentCount int     `json:"recent_count"`
	// Drift: RecentError is beyond the bound.
	Drift bool `json:"drift,omitempty"`
	// Sets are the profile fields the term gives, with their values in use.
	Sets map[string]float64 `json:"sets,omitempty"`
}

// ModeInterval is one mode's prediction interval: measured over
// predicted at the 10th and 90th percentiles.
type ModeInterval struct {
	Mode         string  `json:"mode"`
	Samples      int     `json:"samples"` // 0: the default width
	DowntimeLow  float64 `json:"downtime_low"`
	DowntimeHigh float64 `json:"downtime_high"`
	TotalLow     float64 `json:"total_low"`
	TotalHigh    float64 `json:"total_high"`
}
