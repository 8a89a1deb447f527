package experiment

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
)

// Median is the middle of xs (the mean of the two middle values for an
// even count); 0 for none.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

// WriteJSON writes the results, indented.
func (res Results) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}

// ReadResults reads results WriteJSON wrote.
func ReadResults(r io.Reader) (Results, error) {
	var res Results
	err := json.NewDecoder(r).Decode(&res)
	return res, err
}

// csvHeader names WriteCSV's columns.
var csvHeader = []string{"workload", "runtime", "mode", "state_bytes", "dirty_rate", "load", "bandwidth_bps", "repeat",
	"ok", "state_ok", "downtime_ms", "client_downtime_ms", "total_ms", "frozen_ms", "bytes_sent", "memory_bytes", "rootfs_bytes", "rootfs_entries", "frozen_rootfs_bytes", "working_set_bytes", "shared_bytes", "rounds",
	"dirty_rate_measured", "client_ops", "client_errors", "client_reconnects",
	"p99_before_ms", "p99_during_ms", "p99_after_ms", "ops_per_s_before", "ops_per_s_during", "ops_per_s_after",
	"predicted_total_ms", "predicted_downtime_ms", "error"}

// WriteCSV writes one row per run. The client's latency and throughput
// are split at the migration's start and end: before, during, after.
func (res Results) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(csvHeader); err != nil {
		return err
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	for _, r := range res.Runs {
		row := []string{r.Workload, r.Runtime, r.Mode, fmt.Sprint(r.StateBytes), fmt.Sprint(r.DirtyRate), fmt.Sprint(r.Load),
			fmt.Sprint(r.BandwidthBps), fmt.Sprint(r.Repeat), fmt.Sprint(r.OK), fmt.Sprint(r.StateOK),
			f(r.DowntimeMs), f(r.ClientDowntimeMs), f(r.TotalMs), f(r.FrozenMs), fmt.Sprint(r.BytesSent), fmt.Sprint(r.MemoryBytes),
			fmt.Sprint(r.RootfsBytes), fmt.Sprint(r.RootfsEntries), fmt.Sprint(r.FrozenRootfsBytes), fmt.Sprint(r.WorkingSetBytes), fmt.Sprint(r.SharedBytes),
			fmt.Sprint(len(r.Rounds)), f(r.DirtyRateMeasured)}
		var ops, errs, reconnects string
		var w [3]Window
		if c := r.Client; c != nil {
			ops, errs, reconnects = fmt.Sprint(c.Ops), fmt.Sprint(c.Errors), fmt.Sprint(c.Reconnects)
			w = r.Windows()
		}
		row = append(row, ops, errs, reconnects, f(w[0].P99Ms), f(w[1].P99Ms), f(w[2].P99Ms),
			f(w[0].OpsPerSec), f(w[1].OpsPerSec), f(w[2].OpsPerSec))
		var pt, pd string
		if p := r.Predicted; p != nil {
			pt, pd = f(p.TotalMs), f(p.DowntimeMs)
		}
		row = append(row, pt, pd, r.Error)
		if err := cw.Write(row); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// Window is a client's view of a stretch of its timeline.
type Window struct {
	OpsPerSec float64 `json:"ops_per_s"`
	// P99Ms is the largest of the stretch's bucket 99th percentiles (a
	// bound: buckets' percentiles do not merge exactly).
	P99Ms float64 `json:"p99_ms"`
}

// Windows splits the client's timeline into before, during and after the
// migration (by bucket start).
func (r Run) Windows() [3]Window {
	var out [3]Window
	c := r.Client
	if c == nil || c.BucketMs <= 0 {
		return out
	}
	start := float64(r.StartUnixMs - c.StartUnixMs)
	end := start + r.TotalMs
	var ops [3]int
	var span [3]float64
	for _, b := range c.Timeline {
		i := 1
		switch {
		case b.TMs+c.BucketMs <= start:
			i = 0
		case b.TMs >= end:
			i = 2
		}
		ops[i] += b.Ops
		span[i] += c.BucketMs
		out[i].P99Ms = max(out[i].P99Ms, b.P99Ms)
	}
	for i := range out {
		if span[i] > 0 {
			out[i].OpsPerSec = float64(ops[i]) / (span[i] / 1000)
		}
	}
	return out
}
