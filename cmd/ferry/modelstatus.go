package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/ferry-migrate/ferry/api"
	"github.com/ferry-migrate/ferry/api/client"
	"github.com/ferry-migrate/ferry/internal/agent"
	"github.com/ferry-migrate/ferry/internal/cli"
	"github.com/ferry-migrate/ferry/internal/learn"
	"github.com/ferry-migrate/ferry/internal/model"
)

// What the CLI shows of an agent's learned model: ferry calibrate
// --status, ferry plan --learned, ferry check's drift lines, and the
// model's line in a migration's report.

// agentModel asks the agent at src what it learned.
func agentModel(ctx context.Context, src agentFlags) (*api.ModelStatus, error) {
	from, _, err := src.endpoints("")
	if err != nil {
		return nil, err
	}
	st, err := client.Status(ctx, from)
	if err != nil {
		return nil, err
	}
	if st.Model == nil {
		return nil, fmt.Errorf("the agent at %s keeps no model history (an older ferry, or its history could not be read: see its log)", src.from)
	}
	return st.Model, nil
}

// showModelStatus is ferry calibrate --status.
func showModelStatus(ctx context.Context, src agentFlags, asJSON bool) error {
	st, err := agentModel(ctx, src)
	if err != nil {
		return err
	}
	if asJSON {
		return cli.PrintJSON(st)
	}
	printModelStatus(os.Stdout, *st)
	return nil
}

func printModelStatus(w io.Writer, st api.ModelStatus) {
	fmt.Fprintf(w, "%d migrations kept; base profile: %s\n", st.Migrations, st.Base)
	var p model.Profile
	if json.Unmarshal(st.Profile, &p) == nil && p.Source != "" {
		fmt.Fprintf(w, "in use: %s\n", p.Source)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TERM\tMIGRATIONS\tREFITTED\tRECENT ERROR\tVALUES")
	for _, t := range st.Terms {
		e := "-"
		if t.RecentCount > 0 {
			e = fmt.Sprintf("%.1f %% of %d", t.RecentError*100, t.RecentCount)
			if t.Drift {
				e += "  DRIFT"
			}
		}
		refit := "no"
		if t.Refitted {
			refit = "yes"
		}
		var sets []string
		for _, k := range slices.Sorted(maps.Keys(t.Sets)) {
			sets = append(sets, fmt.Sprintf("%s=%.4g", k, t.Sets[k]))
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", t.Name, t.Migrations, refit, e, strings.Join(sets, " "))
	}
	tw.Flush()
	if len(st.Intervals) > 0 {
		fmt.Fprintln(w, "\nintervals (measured / predicted, 10th-90th percentile):")
		for _, iv := range st.Intervals {
			from := fmt.Sprintf("%d migrations", iv.Samples)
			if iv.Samples < model.MinIntervalSamples {
				from = fmt.Sprintf("default width, %d of %d migrations needed", iv.Samples, model.MinIntervalSamples)
			}
			fmt.Fprintf(w, "  %-9s downtime x%.2f-%.2f, total x%.2f-%.2f (%s)\n", iv.Mode, iv.DowntimeLow, iv.DowntimeHigh, iv.TotalLow, iv.TotalHigh, from)
		}
	}
	if st.Drift {
		fmt.Fprintf(w, "\nDRIFT: a term's recent error is beyond %.0f %%: the profile no longer describes this host; the terms refit as migrations feed them, or run ferry-lab calibrate\n", st.DriftBound*100)
	}
}

// learnedProfile is ferry plan --learned: the profile the agent plans with.
func learnedProfile(ctx context.Context, src agentFlags) (model.Profile, string, error) {
	st, err := agentModel(ctx, src)
	if err != nil {
		return model.Profile{}, "", err
	}
	p, err := model.ParseProfile(st.Profile)
	if err != nil {
		return model.Profile{}, "", fmt.Errorf("the agent's profile: %w", err)
	}
	return p, "learned by the agent at " + src.from + ": " + p.Source, nil
}

// modelCheck is ferry check's word on the model: the drifting terms of the
// agent's history under stateDir (none kept: nothing to say).
type modelCheck struct {
	Migrations int              `json:"migrations"`
	Drifting   []api.TermStatus `json:"drifting,omitempty"`
	Error      string           `json:"error,omitempty"`
}

func checkModel(stateDir string) *modelCheck {
	d, n, err := learn.Drifting(agent.ModelDir(stateDir))
	if err != nil {
		return &modelCheck{Error: err.Error()}
	}
	if n == 0 {
		return nil
	}
	return &modelCheck{Migrations: n, Drifting: d}
}

func (c *modelCheck) text() string {
	var b strings.Builder
	b.WriteString("\nmodel (the agent's migrations):\n")
	switch {
	case c.Error != "":
		fmt.Fprintf(&b, "  ! history         %s\n", c.Error)
	case len(c.Drifting) == 0:
		fmt.Fprintf(&b, "  ✓ profile         within %.0f %% on its last migrations (%d kept)\n", learn.DriftBound*100, c.Migrations)
	default:
		for _, t := range c.Drifting {
			fmt.Fprintf(&b, "  ! drift           %s: %.0f %% off on its last %d migrations (bound %.0f %%)\n", t.Name, t.RecentError*100, t.RecentCount, learn.DriftBound*100)
		}
		b.WriteString("                    the profile no longer describes this host: its terms refit as migrations feed them (ferry calibrate --status), or run ferry-lab calibrate\n")
	}
	return b.String()
}

// printModelLine adds a report's prediction and whether it held.
func printModelLine(w io.Writer, r api.Report) {
	c := r.Model
	if c == nil {
		return
	}
	q := c.Prediction
	fmt.Fprintf(w, "  predicted     downtime %.0f ms (%.0f-%.0f), total %.0f ms (%.0f-%.0f)\n",
		q.DowntimeMs, q.DowntimeLowMs, q.DowntimeHighMs, q.TotalMs, q.TotalLowMs, q.TotalHighMs)
	if len(c.Outside) > 0 {
		fmt.Fprintf(w, "  outside       the measured %s fell outside the predicted interval\n", strings.Join(c.Outside, " and "))
	}
	if c.Inputs.BandwidthBps == 0 {
		// Cold and post-copy without a cap measure no link before the
		// freeze: say so where the prediction is read.
		fmt.Fprintf(w, "                (the link was not measured: predicted as one that does not limit; --mode auto or --max-bandwidth measures or sets it)\n")
	}
}
