package followlab

import (
	"math"
	"slices"
	"time"

	"github.com/ferry-migrate/ferry/internal/follow"
	"github.com/ferry-migrate/ferry/internal/labtool"
)

// Results are one scenario's run: what was set, what ferry follow did,
// what the client felt, and the scores.
type Results struct {
	Spec Spec `json:"spec"`
	// StartUnixMs is the scenario's zero; every *Ms time is from it.
	StartUnixMs int64   `json:"start_unix_ms"`
	DurationMs  float64 `json:"duration_ms"`
	// RTTs are the round trips the delay lines were set to, each from
	// its time on (noise included).
	RTTs []RTTPoint `json:"rtts"`
	// Events are ferry follow's, as it printed them.
	Events []follow.Event `json:"events"`
	// Served says which host served the client when.
	Served []Serving `json:"served"`
	Moves  []Move    `json:"moves"`
	// Client is the load client's result: its timeline, its longest
	// stall, and whether every acknowledged write was there at the end.
	Client labtool.LoadResult `json:"client"`

	Scores Scores `json:"scores"`
	Error  string `json:"error,omitempty"`
}

// RTTPoint is every host's round trip to the client from TMs on.
type RTTPoint struct {
	TMs float64            `json:"t_ms"`
	RTT map[string]float64 `json:"rtt_ms"`
}

// Serving is a stretch of time one host served the client.
type Serving struct {
	Host   string  `json:"host"`
	FromMs float64 `json:"from_ms"`
	ToMs   float64 `json:"to_ms"`
}

// Move is one migration ferry follow made (or tried).
type Move struct {
	ID   string `json:"id"`
	From string `json:"from"`
	To   string `json:"to"`
	OK   bool   `json:"ok"`
	// TriggerMs is when the latency first went too far for the dwell that
	// fired; DecidedMs the decision; MovedMs when follow heard the end.
	TriggerMs float64 `json:"trigger_ms"`
	DecidedMs float64 `json:"decided_ms"`
	MovedMs   float64 `json:"moved_ms"`
	// RunningMs is when it ran at its new host: the migration's commit.
	RunningMs float64 `json:"running_ms"`
	Mode      string  `json:"mode"`
	// Predicted and measured downtime and total (the engine's).
	PredictedDowntimeMs float64 `json:"predicted_downtime_ms"`
	DowntimeMs          float64 `json:"downtime_ms"`
	PredictedTotalMs    float64 `json:"predicted_total_ms"`
	TotalMs             float64 `json:"total_ms"`
	// DowntimeError is |predicted − measured| / measured.
	DowntimeError float64 `json:"downtime_error"`
	// TriggerToRunningMs: from the trigger to the service running on
	// the new host; BoundMs the target: the dwell plus 1.2 times the
	// predicted total.
	TriggerToRunningMs float64 `json:"trigger_to_running_ms"`
	BoundMs            float64 `json:"bound_ms"`
}

// Scores are the scenario's numbers (issue 49's targets).
type Scores struct {
	// The client's time-weighted mean round trip: with ferry following,
	// with an oracle always on the nearest host at no cost, and with the
	// service never moving.
	MeanLatencyMs       float64 `json:"mean_latency_ms"`
	OracleMeanLatencyMs float64 `json:"oracle_mean_latency_ms"`
	StaticMeanLatencyMs float64 `json:"static_mean_latency_ms"`
	// VsOracle and StaticOver are the ratios the targets name (at most
	// 1.25, at least 2).
	VsOracle   float64 `json:"mean_vs_oracle"`
	StaticOver float64 `json:"static_over_mean"`
	// ClientP50Ms is the load client's own time-weighted median request
	// time (the round trip plus the service's work), for comparison.
	ClientP50Ms float64 `json:"client_p50_ms"`
	Moves       int     `json:"moves"`
	FailedMoves int     `json:"failed_moves"`
	Decisions   int     `json:"decisions"`
	// MaxDowntimeError is the largest DowntimeError of the moves.
	MaxDowntimeError float64 `json:"max_downtime_error"`
	// MovesOverBound counts moves slower from trigger to running than
	// their bound.
	MovesOverBound int `json:"moves_over_bound"`
}

// rel is an event's time from the scenario's zero, in ms.
func (r *Results) rel(t time.Time) float64 { return float64(t.UnixMilli() - r.StartUnixMs) }

// Analyze derives Served, Moves and Scores from the events, the RTTs
// set and the client's result.
func (r *Results) Analyze() {
	r.Served, r.Moves = nil, nil
	at, from := r.Spec.Start, 0.0
	var decided, trigger, migrated float64
	var pred *follow.PredictedRun
	r.Scores = Scores{}
	for _, e := range r.Events {
		t := r.rel(e.Time)
		switch e.Kind {
		case "decision":
			r.Scores.Decisions++
			decided = t
			trigger = t
			switch {
			case !e.FarSince.IsZero():
				trigger = r.rel(e.FarSince)
			case e.Verdict != nil:
				trigger = t - float64(e.Verdict.FarFor)/float64(time.Millisecond)
			}
		case "migrate":
			pred, migrated = e.Predicted, t
		case "moved", "failed":
			m := Move{ID: e.ID, From: at, To: e.To, OK: e.Kind == "moved", TriggerMs: trigger, DecidedMs: decided, MovedMs: t}
			if e.Predicted != nil {
				pred = e.Predicted
			}
			if pred != nil {
				m.Mode, m.PredictedDowntimeMs, m.PredictedTotalMs = pred.Mode, pred.DowntimeMs, pred.TotalMs
			}
			if e.Report != nil {
				m.DowntimeMs, m.TotalMs = e.Report.DowntimeMs, e.Report.TotalMs
				if m.Mode == "" {
					m.Mode = e.Report.Mode
				}
			}
			if m.DowntimeMs > 0 && pred != nil {
				m.DowntimeError = math.Abs(m.PredictedDowntimeMs-m.DowntimeMs) / m.DowntimeMs
			}
			// Running from the commit on (the report's end comes after
			// its cleanup).
			running := t
			if e.Report != nil && migrated > 0 {
				for _, ph := range e.Report.Phases {
					if ph.Name == "commit" {
						running = migrated + ph.EndMs
					}
				}
			}
			m.RunningMs = running
			m.TriggerToRunningMs = running - trigger
			m.BoundMs = float64(r.Spec.Follow.Dwell)/float64(time.Millisecond) + 1.2*m.PredictedTotalMs
			r.Moves = append(r.Moves, m)
			if m.OK {
				r.Scores.Moves++
				r.Served = append(r.Served, Serving{Host: at, FromMs: from, ToMs: m.RunningMs})
				at, from = e.To, m.RunningMs
				r.Scores.MaxDowntimeError = math.Max(r.Scores.MaxDowntimeError, m.DowntimeError)
				if m.TriggerToRunningMs > m.BoundMs {
					r.Scores.MovesOverBound++
				}
			} else {
				r.Scores.FailedMoves++
			}
			pred, migrated = nil, 0
		}
	}
	r.Served = append(r.Served, Serving{Host: at, FromMs: from, ToMs: r.DurationMs})
	r.score()
}

// score integrates the round trips over the scenario in 10 ms steps.
func (r *Results) score() {
	const step = 10.0
	var sum, oracle, static, n float64
	for t := 0.0; t < r.DurationMs; t += step {
		rtt := r.RTTAt(t)
		if rtt == nil {
			continue
		}
		sum += rtt[r.ServingAt(t)]
		best := math.Inf(1)
		for _, v := range rtt {
			best = math.Min(best, v)
		}
		oracle += best
		static += rtt[r.Spec.Start]
		n++
	}
	if n == 0 {
		return
	}
	s := &r.Scores
	s.MeanLatencyMs, s.OracleMeanLatencyMs, s.StaticMeanLatencyMs = sum/n, oracle/n, static/n
	if s.OracleMeanLatencyMs > 0 {
		s.VsOracle = s.MeanLatencyMs / s.OracleMeanLatencyMs
	}
	if s.MeanLatencyMs > 0 {
		s.StaticOver = s.StaticMeanLatencyMs / s.MeanLatencyMs
	}
	var w, p50 float64
	for _, b := range r.Client.Timeline {
		if b.Ops > 0 {
			p50 += b.P50Ms
			w++
		}
	}
	if w > 0 {
		s.ClientP50Ms = p50 / w
	}
}

// RTTAt is the round trips set at t, in ms from the scenario's zero (nil
// before the first).
func (r *Results) RTTAt(t float64) map[string]float64 {
	i, found := slices.BinarySearchFunc(r.RTTs, t, func(p RTTPoint, t float64) int {
		switch {
		case p.TMs < t:
			return -1
		case p.TMs > t:
			return 1
		}
		return 0
	})
	if !found {
		i--
	}
	if i < 0 {
		return nil
	}
	return r.RTTs[i].RTT
}

// ServingAt is the host serving at t: the one a move left it on, from the
// move's end (while a move runs, its source still serves).
func (r *Results) ServingAt(t float64) string {
	for _, s := range r.Served {
		if t >= s.FromMs && t < s.ToMs {
			return s.Host
		}
	}
	if len(r.Served) > 0 {
		return r.Served[len(r.Served)-1].Host
	}
	return r.Spec.Start
}
