package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/ferry-migrate/ferry/internal/calibrate"
	"github.com/ferry-migrate/ferry/internal/cli"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/model"
)

func newCalibrateCmd() *cobra.Command {
	var (
		out, reportPath string
		refit           string
		quick, asJSON   bool
		tcpClient       bool
		repeat          int
	)
	cmd := &cobra.Command{
		Use:   "calibrate",
		Short: "Measure this host's migration costs and write a model profile",
		Long: `calibrate runs migrations in the emulated lab and fits the host profile the
prediction models use (ferry plan --profile, ferry agent --profile,
ferry-lab bench validate-model --profile; docs/MODEL.md).

It migrates memhog with cold, pre-copy, post-copy and hybrid over unshaped links, at
each memory size and dirty rate of the grid, so that the host's own costs
show, then pre-copy and post-copy over a 300 Mbit/s link to measure how
much of a link ferry's stream gets and how post-copy's requests share it.
Each profile parameter is fitted by least squares to the phase the model
says it governs:

  freeze_s                       the freeze phase (mean)
  read_hash_bps                  pre-copy rounds after the first vs memory
  frozen_read_bps                the frozen last round (hybrid, pre-copy) vs memory
  dump_fixed_s                   post-copy's dump: a memory-less CRIU dump
  dump_bps                       a full dump (pre-copy's deduplicating one, or
                                 cold's), less dump_fixed_s, vs memory
  restore_fixed_s, restore_bps   the restore phase vs memory
  lazy_setup_s                   post-copy's downtime beyond those fixed costs
  lazy_request_s, lazy_bps,      post-copy's lazy-pages phase vs memory, dirty rate and
  fault_s, lazy_serial_share     link, request by request as CRIU's lazy-pages daemon pulls
  fault_wait_s                   the faults post-copy counted while writing fast
  local_fill_bps                 hybrid's lazy-pages phase (served locally) vs memory
  image_fill_bps                 pre-copy's rebuild switchover completing the images
  redirty_ratio                  bytes per re-dirtied page in later rounds / page size
  link_efficiency                pre-copy's first round on the shaped link

Terms without a fixed part in the model are fitted through the origin, and
a line whose intercept would be negative is too. Where the data bend (two
lines with a knee fit much better) or a cost falls outside the models
(connecting, the root filesystem sync), the notes under the table say so.

The rest (page size, dedup reference size, the PAM constants other than
β, ψ and ω) keep their defaults; soft_dirty says whether this kernel tracks
dirty pages.

Grid: 64M, 128M, 256M and 512M at 0 and 2000 pages/s, post-copy at 3000
pages/s too, then the shaped points (128M: pre-copy at 0 pages/s,
post-copy at 0, 1000 and 3000), two runs each (about 6 minutes here);
--quick: 64M and 256M at 100 pages/s (about a minute). Every point brings
up a lab of its own, so it needs root, the binaries from 'make build'
(memhog next to ferry) and no lab already up.

It prints each term's fit quality (R², RMSE) and writes the profile as
JSON to --out; --json prints the whole report (every run, every residual)
instead of the table. --report keeps that report in a file, and --refit
fits a profile from such a file again without touching the lab.

What an agent learned from its own migrations since is 'ferry calibrate
--status' (the production binary).`,
		Example: `  ferry-lab calibrate --quick
  ferry-lab calibrate --out /etc/ferry/profile.json --report calibration.json
  ferry-lab calibrate --refit calibration.json --out profile.json
  ferry plan --profile ferry-profile.json --memory 1G --dirty-rate 2000 --bandwidth 1gbit`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o := calibrate.Options{Quick: quick, Repeat: repeat, TCPClient: tcpClient, Progress: progressReporter(os.Stderr, asJSON)}
			var (
				prof model.Profile
				rep  calibrate.Report
				err  error
			)
			if refit != "" { // measures nothing: no ferry binary needed
				b, rerr := os.ReadFile(refit)
				if rerr != nil {
					return rerr
				}
				if rerr := json.Unmarshal(b, &rep); rerr != nil {
					return fmt.Errorf("--refit %s: %w", refit, rerr)
				}
				prof, rep, err = calibrate.Refit(cmd.Context(), rep, o)
			} else {
				if o.FerryBin, err = lab.FerryBin(); err != nil {
					return err
				}
				prof, rep, err = calibrate.Run(cmd.Context(), o)
				finishProgress(os.Stderr)
			}
			if reportPath != "" {
				if werr := cli.WriteJSON(reportPath, rep); werr != nil && err == nil {
					err = werr
				}
			}
			if err != nil {
				return fmt.Errorf("calibrate: %w", err)
			}
			if err := cli.WriteJSON(out, prof); err != nil {
				return err
			}
			if asJSON {
				return cli.PrintJSON(rep)
			}
			printCalibration(os.Stdout, rep)
			fmt.Printf("\nprofile written to %s (%d points in %.0f s)\n", out, len(rep.Points), rep.WallS)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&out, "out", "ferry-profile.json", "where to write the profile")
	f.BoolVar(&quick, "quick", false, "a smaller grid: 64M and 256M at 100 pages/s")
	f.BoolVar(&asJSON, "json", false, "print the full report as JSON instead of the fit table")
	f.IntVar(&repeat, "repeat", 2, "migrations per grid point")
	f.BoolVar(&tcpClient, "tcp-client", false, "run memhog as services run: an address of its own and a client on one TCP connection, so the fixed costs of its network and connections are in the profile (runc)")
	f.StringVar(&reportPath, "report", "", "also write the full report (runs, fits, residuals) as JSON here")
	f.StringVar(&refit, "refit", "", "fit again from a report written by --report, measuring nothing")
	return cmd
}

// printCalibration prints one line per term and what the fits say.
func printCalibration(w io.Writer, r calibrate.Report) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TERM\tVALUES\tFIT\tR²\tRMSE\tN")
	for _, t := range r.Terms {
		var vals []string
		for _, k := range slices.Sorted(maps.Keys(t.Sets)) {
			vals = append(vals, k+"="+profileValue(k, t.Sets[k]))
		}
		if len(vals) == 0 {
			vals = []string{"-"}
		}
		r2 := fmt.Sprintf("%.3f", t.Fit.R2)
		rmse := fmt.Sprintf("%.1f ms", t.Fit.RMSE*1000)
		switch t.Kind {
		case "constant":
			r2 = "-"
		case "ratio":
			r2, rmse = "-", fmt.Sprintf("%.3f", t.Fit.RMSE)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", t.Name, strings.Join(vals, " "), t.Kind, r2, rmse, t.Fit.N)
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, t := range r.Terms {
		fmt.Fprintf(w, "%s: %s\n", t.Name, t.From)
		if t.Free != nil && t.Kind != "line" {
			fmt.Fprintf(w, "  free line: %.1f ms + %.3g ms/MiB (R² %.3f)\n", t.Free.A*1000, t.Free.B*(1<<20)*1000, t.Free.R2)
		}
		if t.Note != "" {
			fmt.Fprintf(w, "  %s\n", t.Note)
		}
	}
	for _, wn := range r.Warnings {
		fmt.Fprintf(w, "warning: %s\n", wn)
	}
}

// profileValue formats a profile field by its unit suffix.
func profileValue(name string, v float64) string {
	switch {
	case strings.HasSuffix(name, "_s"):
		return fmt.Sprintf("%.1fms", v*1000)
	case strings.HasSuffix(name, "_bps"):
		return fmt.Sprintf("%.0fMB/s", v/1e6)
	}
	return fmt.Sprintf("%.3f", v)
}

// progressReporter draws a one-line progress bar on a terminal; elsewhere
// it prints a line per grid point, unless quiet.
func progressReporter(f *os.File, quiet bool) func(calibrate.Progress) {
	if !term.IsTerminal(int(f.Fd())) {
		if quiet {
			return nil
		}
		last := ""
		return func(p calibrate.Progress) {
			if p.Point != "" && p.Point != last {
				last = p.Point
				fmt.Fprintf(f, "[%d/%d] %s (%s)\n", p.Done+1, p.Total, p.Point, p.Elapsed.Round(time.Second))
			}
		}
	}
	return func(p calibrate.Progress) {
		const barW = 20
		filled := barW * p.Done / max(p.Total, 1)
		line := fmt.Sprintf("[%s%s] %d/%d %s  %s  %s", strings.Repeat("#", filled), strings.Repeat(".", barW-filled),
			p.Done, p.Total, p.Elapsed.Round(time.Second), p.Point, p.Step)
		width := 80
		if c, _, err := term.GetSize(int(f.Fd())); err == nil && c > 20 {
			width = c
		}
		for utf8.RuneCountInString(line) > width-1 {
			_, n := utf8.DecodeLastRuneInString(line)
			line = line[:len(line)-n]
		}
		fmt.Fprintf(f, "\r\033[K%s", line)
	}
}

// finishProgress clears the bar's line.
func finishProgress(f *os.File) {
	if term.IsTerminal(int(f.Fd())) {
		fmt.Fprint(f, "\r\033[K")
	}
}

// describeProfile is a one-line summary for headers.
func describeProfile(p model.Profile) string {
	return fmt.Sprintf("freeze %.1f ms, dump %.0f ms + %.0f MB/s, read+hash %.0f MB/s, restore %.0f ms + %.0f MB/s, lazy %.0f ms + %.0f MB/s, link ×%.2f",
		p.FreezeS*1000, p.DumpFixedS*1000, p.DumpBps/1e6, p.ReadHashBps/1e6, p.RestoreFixedS*1000, p.RestoreBps/1e6,
		p.LazySetupS*1000, p.LazyBps/1e6, p.LinkEfficiency)
}
