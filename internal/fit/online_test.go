package fit

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/internal/model"
	"github.com/ferry-migrate/ferry/internal/runresult"
)

// recordedReports reads the bench runs in testdata/recorded (Podman's and
// LXC's memhog at 256 MiB, 1000 pages/s, each mode three times, measured
// in the lab on 2026-11-28) as an agent's reports: each run's report with
// the inputs its point planned with and its checks by the defaults.
func recordedReports(t *testing.T) []api.Report {
	t.Helper()
	var out []api.Report
	for _, res := range recordedResults(t) {
		for _, r := range res.Runs {
			out = append(out, reportOfRun(res, r))
		}
	}
	return out
}

// recordedResults reads the bench results in testdata/recorded.
func recordedResults(t *testing.T) []runresult.MigrateResult {
	t.Helper()
	files, err := filepath.Glob("testdata/recorded/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no recorded runs: %v", err)
	}
	var out []runresult.MigrateResult
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var res runresult.MigrateResult
		if err := json.Unmarshal(b, &res); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out = append(out, res)
	}
	return out
}

// reportOfRun is the report an agent would have kept of a bench run.
func reportOfRun(res runresult.MigrateResult, r runresult.Run) api.Report {
	rep := api.Report{OK: r.OK, Mode: res.Mode, Runtime: res.Runtime, DowntimeMs: r.DowntimeMs, TotalMs: r.TotalMs,
		FrozenMs: r.FrozenMs, BytesSent: r.BytesSent, MemoryBytes: r.MemoryBytes, RestoreMs: r.RestoreMs,
		PagesFaulted: r.PagesFaulted, PagesPushed: r.PagesPushed, PushMs: r.PushMs, PagesReferenced: r.PagesReferenced,
		FillMs: r.FillMs, RestoreFromOwnImages: r.RestoreFromOwnImages, Rounds: r.Rounds, Phases: r.Phases,
		RootfsBytes: r.RootfsBytes}
	pi := api.PlanInputs{MemoryBytes: float64(res.MemoryBytes), DirtyRate: float64(res.DirtyRate), BandwidthBps: float64(res.BandwidthBps) / 8}
	for _, rd := range r.Rounds {
		if !rd.Final {
			pi.Rounds++
		}
		pi.Tracked = pi.Tracked || rd.UnchangedPages > 0 // the kernel said which pages were not written
	}
	p := model.DefaultProfile()
	rep.Model = &api.ModelCheck{Inputs: pi, Profile: p.Source, Prediction: model.PredictReport(p, pi, res.Mode)}
	rep.Model.Terms = model.CheckTerms(p, pi, rep)
	return rep
}

// termError is the root mean square error (ms), and the mean signed
// error, of term name's predictions by p on reps: what the fitters
// minimise is squared error, not relative.
func termError(p model.Profile, reps []api.Report, name string) (rmse, bias float64, n int) {
	for _, r := range reps {
		for _, c := range model.CheckTerms(p, r.Model.Inputs, r) {
			if c.Name == name {
				e := c.PredictedMs - c.MeasuredMs
				rmse, bias, n = rmse+e*e, bias+e, n+1
			}
		}
	}
	if n > 0 {
		rmse, bias = math.Sqrt(rmse/float64(n)), bias/float64(n)
	}
	return rmse, bias, n
}

// Each term the recorded reports feed often enough is refitted, and the
// refit predicts them at least as well as the defaults (by squared error,
// which the fits minimise); the others keep theirs.
func TestOnlineRefitOnRecordedReports(t *testing.T) {
	reps := recordedReports(t)
	base := model.DefaultProfile()
	p, terms := FitOnline(reps, base, MinOnlineSamples, nil)
	want := map[string]bool{ // fed ≥ 5 times by these runs
		"freeze": true, "frozen-read": true, "dump-fixed": true, "lazy-setup": true,
		"local-fill": true, "image-fill": true, "redirty": true, "setup": true,
		// One memory size: restore's fixed part alone (restore_bps kept).
		"restore": true,
		// No pre-copy with a full dump: dump has nothing. read_hash_bps
		// comes from pre-copy's rounds alone, and only Podman's 3 hashed
		// all memory (LXC's were write-tracked).
		"dump": false, "read-hash": false,
	}
	checked := map[string]bool{"redirty": true} // a ratio of bytes, not a time: no check
	for _, tm := range terms {
		t.Logf("%-12s migrations %2d refitted %-5v %v %s", tm.Name, tm.Migrations, tm.Refitted, tm.Sets, tm.Note)
		w, ok := want[tm.Name]
		if !ok {
			t.Errorf("unexpected term %q", tm.Name)
			continue
		}
		if tm.Refitted != w {
			t.Errorf("%s refitted %v, want %v (%d migrations)", tm.Name, tm.Refitted, w, tm.Migrations)
		}
		if !tm.Refitted || checked[tm.Name] {
			continue
		}
		before, _, n := termError(base, reps, tm.Name)
		after, bias, _ := termError(p, reps, tm.Name)
		t.Logf("%-12s %d checks: RMSE %.1f ms with the defaults, %.1f ms refitted (bias %+.1f ms)", tm.Name, n, before, after, bias)
		if n < MinOnlineSamples {
			t.Errorf("%s: %d checks of a term refitted from %d migrations", tm.Name, n, tm.Migrations)
		}
		if after > before*1.001 {
			t.Errorf("%s: refitted RMSE %.1f ms is worse than the defaults' %.1f ms", tm.Name, after, before)
		}
	}
	// Kept terms keep the base profile's values.
	if p.RestoreBps != base.RestoreBps || p.DumpBps != base.DumpBps || p.ReadHashBps != base.ReadHashBps {
		t.Errorf("values not refitted changed: restore_bps %v, dump_bps %v, read_hash_bps %v", p.RestoreBps, p.DumpBps, p.ReadHashBps)
	}
	// The freeze is a mean: the recorded runs' own.
	var sum float64
	var n int
	for _, r := range reps {
		sum += model.PhasesS(r.Phases, "freeze")
		n++
	}
	if d := math.Abs(p.FreezeS - sum/float64(n)); d > 1e-9 {
		t.Errorf("freeze_s %v, the runs' mean %v", p.FreezeS, sum/float64(n))
	}
	if p.Validate() != nil {
		t.Errorf("refitted profile invalid: %v", p.Validate())
	}
}

// A term needs MinOnlineSamples migrations: with fewer the base stands.
func TestOnlineRefitNeedsEnoughMigrations(t *testing.T) {
	reps := recordedReports(t)
	var post []api.Report
	for _, r := range reps {
		if r.Mode == model.ModePostcopy {
			post = append(post, r)
		}
	}
	base := model.DefaultProfile()
	p, terms := FitOnline(post[:MinOnlineSamples-1], base, MinOnlineSamples, nil)
	if p.DumpFixedS != base.DumpFixedS || p.FreezeS != base.FreezeS {
		t.Errorf("%d migrations refitted: dump_fixed_s %v, freeze_s %v", MinOnlineSamples-1, p.DumpFixedS, p.FreezeS)
	}
	for _, tm := range terms {
		if tm.Refitted {
			t.Errorf("%s refitted from %d migrations", tm.Name, tm.Migrations)
		}
	}
	if p, _ = FitOnline(post[:MinOnlineSamples], base, MinOnlineSamples, nil); p.DumpFixedS == base.DumpFixedS {
		t.Errorf("%d migrations did not refit dump_fixed_s", MinOnlineSamples)
	}
}

// Reports whose rounds read only written pages (write tracking) say
// nothing of read_hash_bps.
func TestOnlineRefitSkipsTrackedRoundsForReadHash(t *testing.T) {
	var tracked []api.Report
	for _, r := range recordedReports(t) {
		if r.Model.Inputs.Tracked {
			tracked = append(tracked, r)
		}
	}
	if len(tracked) < MinOnlineSamples {
		t.Fatalf("only %d tracked runs recorded", len(tracked))
	}
	base := model.DefaultProfile()
	p, _ := FitOnline(tracked, base, MinOnlineSamples, nil)
	if p.ReadHashBps != base.ReadHashBps || p.FrozenReadBps != base.FrozenReadBps {
		t.Errorf("tracked rounds refitted read_hash_bps %v / frozen_read_bps %v", p.ReadHashBps, p.FrozenReadBps)
	}
}

// A calibration's own runs give each mode's interval once there are
// enough of them: the recorded runs, three a mode, are too few.
func TestCalibrationIntervals(t *testing.T) {
	var ms []Measured
	for _, res := range recordedResults(t) {
		ms = append(ms, Measured{Point: Point{Mode: res.Mode, MemoryBytes: res.MemoryBytes, DirtyRate: res.DirtyRate, BandwidthBps: res.BandwidthBps}, Result: &res})
	}
	p := model.DefaultProfile()
	ivs := CalibrationIntervals(ms, p)
	if len(ivs) != len(model.EngineModes) {
		t.Fatalf("%d intervals", len(ivs))
	}
	for _, iv := range ivs {
		if iv.Samples != 6 || iv.DowntimeHigh != model.DefaultDowntimeHigh {
			t.Errorf("%s: %+v, want the default width from 6 runs", iv.Mode, iv)
		}
	}
	// Twice as many: enough (the ratios are the defaults' on these hosts).
	ivs = CalibrationIntervals(append(ms, ms...), p)
	for _, iv := range ivs {
		if iv.Samples != 12 || iv.DowntimeLow > iv.DowntimeHigh || iv.DowntimeHigh == model.DefaultDowntimeHigh {
			t.Errorf("%s: %+v, want an interval from 12 runs", iv.Mode, iv)
		}
		t.Logf("%-9s downtime x%.2f-%.2f, total x%.2f-%.2f (the defaults on Podman and LXC)", iv.Mode, iv.DowntimeLow, iv.DowntimeHigh, iv.TotalLow, iv.TotalHigh)
	}
}
