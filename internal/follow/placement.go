package follow

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/internal/model"
)

// Service is what placement knows of the service that may move.
type Service struct {
	Container string `json:"container"`
	// Host is where it runs now, and Latency its clients' latency there.
	Host    string        `json:"host"`
	Latency time.Duration `json:"latency_ns"`
	// Workload is the model's view of it, measured at its host (memory,
	// dirty rate, shared memory, what its runtime can do); the link is
	// each candidate's.
	Workload model.Inputs `json:"workload"`
	// Cores is the CPU it keeps busy (Load_c), and StateBytes what moves
	// besides memory (S_nms: its root filesystem's own layer, volumes).
	Cores      float64 `json:"cores"`
	StateBytes float64 `json:"state_bytes"`
	// MaxDowntime is the budget a move must fit (0: none).
	MaxDowntime time.Duration `json:"max_downtime_ns"`
	// Compression is R_c, what the stream's bytes shrink to (0: 1, as
	// ferry sends memory uncompressed today).
	Compression float64 `json:"compression,omitempty"`
}

// Candidate is one host the service could move to, as its agent and the
// link to it were found.
type Candidate struct {
	Host string `json:"host"`
	// Err says why the host could not be asked (nothing else is then
	// known).
	Err string `json:"error,omitempty"`
	// Latency is its round-trip time to the service's clients.
	Latency time.Duration `json:"latency_ns"`
	// Cores and BusyCores are its CPUs and those in use; FreeMemory and
	// FreeStorage what it can give (after what it has reserved).
	Cores       float64   `json:"cores"`
	BusyCores   float64   `json:"busy_cores"`
	FreeMemory  float64   `json:"free_memory_bytes"`
	FreeStorage float64   `json:"free_storage_bytes"`
	Costs       api.Costs `json:"costs"`
	// SpeedBps is checkpoint data one of its free cores processes a
	// second (s_pe); 0: the profile's dump rate.
	SpeedBps float64 `json:"speed_bps,omitempty"`
	// ThroughputBps is what the link from the service's host carried, in
	// bits per second, and RTT that link's round trip.
	ThroughputBps float64       `json:"throughput_bps"`
	RTT           time.Duration `json:"rtt_ns"`
}

// Evaluation is one candidate weighed.
type Evaluation struct {
	Candidate
	// Mode is the technique the planner picked for this host's link and
	// the budget, with its prediction.
	Mode       string            `json:"mode,omitempty"`
	Prediction *model.Prediction `json:"prediction,omitempty"`
	// Cost is the thesis' model for this host, its downtime term
	// (DowntimeS, Eq 7.12) kept for comparison: the budget is held to
	// ferry's own prediction.
	Cost *model.CostEstimate `json:"cost,omitempty"`
	// Refused lists why the host cannot take the service (empty: it is
	// feasible).
	Refused []string `json:"refused,omitempty"`
}

// Feasible says the candidate can take the service.
func (e Evaluation) Feasible() bool { return len(e.Refused) == 0 }

// Placement is one decision of where to go.
type Placement struct {
	// Chosen is the host to move to ("": stay).
	Chosen string `json:"chosen,omitempty"`
	// Candidates in order of preference: feasible ones cheapest first,
	// then the refused ones.
	Candidates []Evaluation `json:"candidates"`
	Reason     string       `json:"reason"`
}

// Pick returns the chosen candidate's evaluation.
func (p Placement) Pick() (Evaluation, bool) {
	for _, e := range p.Candidates {
		if e.Host == p.Chosen && p.Chosen != "" {
			return e, true
		}
	}
	return Evaluation{}, false
}

// Placer weighs candidates: the trigger's band says what counts as a
// better latency, the profile predicts each move.
type Placer struct {
	Trigger TriggerConfig
	// Profile is the source host's model profile (the side that does
	// most of the work and whose calibration holds the link terms).
	Profile model.Profile
	// SourceLoad is the share of the source's CPUs in use (Load_s), and
	// SourceSpeedBps its s_ps (0: the profile's dump rate).
	SourceLoad     float64
	SourceSpeedBps float64
	// AnyLatency weighs candidates whatever their latency to the clients
	// (a move made for another reason: draining a node); latency then
	// only breaks ties.
	AnyLatency bool
}

// ProbeSamples is how many probes a candidate's latency is the median
// of: with ±20 % noise on each, fewer let a host at the same distance
// look clearly nearer now and then, and the service flap.
const ProbeSamples = 9

// costTie is how close two costs must be to count as equal (a
// thousandth of a cent).
const costTie = 1e-5

// Place weighs every candidate and picks the cheapest feasible one: it
// must bring the clients clearly nearer (below the trigger's near band, or
// by the hysteresis share), have the memory, CPU and storage, and have a
// technique the planner predicts within the downtime budget on its link.
// Ties in cost go to the nearer host, then to the shorter predicted
// downtime, then by name, so a decision is reproducible.
func (pl Placer) Place(svc Service, cands []Candidate) Placement {
	evals := make([]Evaluation, 0, len(cands))
	for _, c := range cands {
		evals = append(evals, pl.evaluate(svc, c))
	}
	slices.SortStableFunc(evals, func(a, b Evaluation) int {
		if a.Feasible() != b.Feasible() {
			if a.Feasible() {
				return -1
			}
			return 1
		}
		if !a.Feasible() {
			return cmp.Compare(a.Host, b.Host)
		}
		if d := a.Cost.Euro - b.Cost.Euro; math.Abs(d) > costTie {
			return cmp.Compare(a.Cost.Euro, b.Cost.Euro)
		}
		if a.Latency != b.Latency {
			return cmp.Compare(a.Latency, b.Latency)
		}
		if a.Prediction.DowntimeMs != b.Prediction.DowntimeMs {
			return cmp.Compare(a.Prediction.DowntimeMs, b.Prediction.DowntimeMs)
		}
		return cmp.Compare(a.Host, b.Host)
	})
	p := Placement{Candidates: evals}
	if len(evals) == 0 {
		p.Reason = "no candidate hosts"
		return p
	}
	best := evals[0]
	if !best.Feasible() {
		var why []string
		for _, e := range evals {
			why = append(why, e.Host+": "+strings.Join(e.Refused, "; "))
		}
		p.Reason = "stay: no candidate can take it (" + strings.Join(why, " | ") + ")"
		return p
	}
	p.Chosen = best.Host
	if pl.AnyLatency {
		p.Reason = fmt.Sprintf("%s: the cheapest feasible host (%.4g €), %s predicted %.0f ms down",
			best.Host, best.Cost.Euro, best.Mode, best.Prediction.DowntimeMs)
	} else {
		p.Reason = fmt.Sprintf("%s: the cheapest feasible host (%.4g €), latency %v instead of %v, %s predicted %.0f ms down",
			best.Host, best.Cost.Euro, round(best.Latency), round(svc.Latency), best.Mode, best.Prediction.DowntimeMs)
	}
	if len(evals) > 1 && evals[1].Feasible() {
		next := evals[1]
		if math.Abs(next.Cost.Euro-best.Cost.Euro) <= costTie {
			p.Reason += fmt.Sprintf("; as cheap as %s, chosen for ", next.Host)
			switch {
			case best.Latency != next.Latency:
				p.Reason += fmt.Sprintf("its lower latency (%v against %v)", round(best.Latency), round(next.Latency))
			case best.Prediction.DowntimeMs != next.Prediction.DowntimeMs:
				p.Reason += fmt.Sprintf("its shorter predicted downtime (%.0f against %.0f ms)", best.Prediction.DowntimeMs, next.Prediction.DowntimeMs)
			default:
				p.Reason += "its name (equal in every respect)"
			}
		} else {
			p.Reason += fmt.Sprintf("; next %s at %.4g €", next.Host, next.Cost.Euro)
		}
	}
	return p
}

// evaluate weighs one candidate.
func (pl Placer) evaluate(svc Service, c Candidate) Evaluation {
	e := Evaluation{Candidate: c}
	if c.Err != "" {
		e.Refused = []string{"not reachable: " + c.Err}
		return e
	}
	refuse := func(format string, args ...any) { e.Refused = append(e.Refused, fmt.Sprintf(format, args...)) }
	near := pl.Trigger.Near()
	better := time.Duration(float64(svc.Latency) * (1 - pl.Trigger.Hysteresis))
	if !pl.AnyLatency && c.Latency >= near && c.Latency >= better {
		refuse("latency %v is not clearly better than %v (below %v, or below %v)", round(c.Latency), round(svc.Latency), round(near), round(better))
	}
	if !(c.ThroughputBps > 0) {
		refuse("no throughput measured to it")
		return e
	}

	in := svc.Workload
	in.BandwidthBps = c.ThroughputBps / 8
	in.RTTSeconds = c.RTT.Seconds()
	// The throughput was measured, not a capacity: the profile's link
	// efficiency must not be applied to it twice.
	p := pl.Profile
	p.LinkEfficiency = 1
	budgetMs := float64(svc.MaxDowntime) / float64(time.Millisecond)
	preds, _, rec, why := model.Best(p, in, budgetMs)
	if rec == "" {
		refuse("no technique fits: %s", why)
	} else {
		for i := range preds {
			if preds[i].Mode == rec {
				pr := preds[i]
				e.Mode, e.Prediction = rec, &pr
			}
		}
	}

	speed := func(s float64) float64 {
		if s > 0 {
			return s
		}
		return p.DumpBps
	}
	load := 0.0
	if c.Cores > 0 {
		load = math.Min(1, c.BusyCores/c.Cores)
	}
	rc := svc.Compression
	if !(rc > 0 && rc <= 1) {
		rc = 1
	}
	est := model.MigrationCost(
		model.CostService{DirtyRate: in.DirtyRatePagesPerSec, Memory: in.MemoryBytes, Cores: svc.Cores, StateBytes: svc.StateBytes, Compression: rc},
		model.CostSource{PageSize: p.PageSize, Load: math.Min(pl.SourceLoad, 0.99), Speed: speed(pl.SourceSpeedBps)},
		model.CostEdge{Name: c.Host, Load: load, Cores: c.Cores, FreeMemory: c.FreeMemory, Bandwidth: in.BandwidthBps,
			Speed: speed(c.SpeedBps), CPUCost: c.Costs.CPUEurPerCore, CPUOffset: c.Costs.CPUOffset,
			MemCost: c.Costs.MemEurPerByte, StorageCost: c.Costs.StorageEurPerByte, NetCost: c.Costs.NetEurPerByte})
	e.Cost = &est
	for _, v := range est.Violations {
		// 7.6 (pre-copy outruns dirtying) is the thesis' one-round
		// pre-copy's; the planner already judged the technique it picked.
		if !strings.HasPrefix(v, "7.6:") {
			refuse("%s", v)
		}
	}
	if need := in.MemoryBytes + svc.StateBytes; c.FreeStorage < need {
		refuse("needs %s of storage for the images and state, %s free", bytesOf(need), bytesOf(c.FreeStorage))
	}
	return e
}

func bytesOf(b float64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1f GiB", b/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.0f MiB", b/(1<<20))
	}
	return fmt.Sprintf("%.0f KiB", b/(1<<10))
}
