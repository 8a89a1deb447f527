package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/internal/calibrate"
	"github.com/ferry-migrate/ferry/internal/cli"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/model"
	"github.com/ferry-migrate/ferry/internal/units"
)

func newValidateModelCmd() *cobra.Command {
	var (
		o                         calibrate.ValidateOptions
		profilePath, out, rescore string
		memories, bandwidths      []string
		quiet                     bool
	)
	cmd := &cobra.Command{
		Use:   "validate-model",
		Short: "Compare the models' predictions with migrations measured in the lab",
		Long: `validate-model migrates memhog in the lab at points the calibration never
measures and compares the medians of --repeat runs (total_ms, downtime_ms,
client_downtime_ms, bytes sent) with what the models predict for the same
memory, dirty rate and link, given the profile (--profile, from 'ferry
calibrate'; built-in defaults without it). Pre-copy and hybrid are predicted
with the number of rounds the runs actually did.

For every mode it reports the mean absolute percentage error (MAPE) of the
models and of the ideal, processing-free baseline (pre-copy volumes
shrinking by R·σ/L, transfers at the nominal link rate), and a split of the
time by model term (rounds, freeze, dump, restore, lazy pages, and what the
models leave out) so that a bad prediction points at the term that is off.

Default design, per mode (cold, precopy, postcopy, hybrid): 96M and 384M at
500 pages/s over 1 Gbit/s and 4000 pages/s over 500 Mbit/s, 192M at the two
other pairings; 3 runs each (about 20 minutes). --quick: 96M at 500 pages/s,
1 Gbit/s and 192M at 4000 pages/s, 500 Mbit/s (about 5 minutes). Giving
--memory, --dirty-rate or --bandwidth measures their full cross product
instead. Every point brings up a lab of its own: root, the binaries from
'make build', and no lab already up.

Writes DIR/validation.json (every run), DIR/validation.md (the tables, also
printed) and DIR/predicted-vs-measured.svg (log-log scatter, one colour per
mode, the y = x line). --rescore compares the runs kept in an earlier
validation.json with another profile without touching the lab.`,
		Example: `  ferry-lab calibrate --quick --out ferry-profile.json
  ferry-lab bench validate-model --profile ferry-profile.json --quick --out validation
  ferry-lab bench validate-model --profile ferry-profile.json --modes precopy --memory 1G --dirty-rate 100,8000 --bandwidth 1gbit`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			var src string
			o.Profile, src, err = cli.LoadProfile(profilePath)
			if err != nil {
				return err
			}
			for _, m := range memories {
				b, err := units.ParseBytes(m)
				if err != nil || b <= 0 {
					return fmt.Errorf("--memory %q: give a size such as 96M (%v)", m, err)
				}
				o.Memories = append(o.Memories, b)
			}
			for _, s := range bandwidths {
				b, err := units.ParseRate(s)
				if err != nil || b <= 0 {
					return fmt.Errorf("--bandwidth %q: give a rate such as 500mbit (%v)", s, err)
				}
				o.Bandwidths = append(o.Bandwidths, b)
			}
			for _, m := range o.Modes {
				if !slices.Contains(model.EngineModes, m) {
					return fmt.Errorf("--modes: unknown mode %q (%s)", m, strings.Join(model.EngineModes, ", "))
				}
			}
			for _, r := range o.DirtyRates {
				if r < 0 {
					return errors.New("--dirty-rate must not be negative")
				}
			}
			fmt.Fprintf(os.Stderr, "profile %s: %s\n", src, describeProfile(o.Profile))
			var v calibrate.Validation
			if rescore != "" {
				b, rerr := os.ReadFile(rescore)
				if rerr != nil {
					return rerr
				}
				if rerr := json.Unmarshal(b, &v); rerr != nil {
					return fmt.Errorf("--rescore %s: %w", rescore, rerr)
				}
				v = calibrate.Rescore(o.Profile, v)
			} else {
				if o.FerryBin, err = lab.FerryBin(); err != nil {
					return err
				}
				o.Progress = progressReporter(os.Stderr, quiet)
				v, err = calibrate.Validate(cmd.Context(), o)
				finishProgress(os.Stderr)
			}
			if len(v.Points) > 0 {
				if werr := v.WriteFiles(out); werr != nil {
					return errors.Join(err, werr)
				}
				fmt.Print(v.Markdown())
				fmt.Printf("\nwrote %s, %s and %s\n", filepath.Join(out, "validation.json"),
					filepath.Join(out, "validation.md"), filepath.Join(out, "predicted-vs-measured.svg"))
			}
			if err != nil {
				return fmt.Errorf("validate-model: %w", err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&profilePath, "profile", "", "host profile from 'ferry-lab calibrate' (default: built-in defaults)")
	f.StringVar(&out, "out", "validation", "directory for validation.json, validation.md and the SVG")
	f.BoolVar(&o.Quick, "quick", false, "two points per mode instead of six")
	f.BoolVar(&o.TCPClient, "tcp-client", false, "run memhog with an address of its own and a client on one TCP connection, as services run (runc)")
	f.IntVar(&o.Repeat, "repeat", 3, "migrations per point (medians are compared)")
	f.StringSliceVar(&o.Modes, "modes", nil, "modes to validate (default cold,precopy,postcopy,hybrid)")
	f.StringSliceVar(&memories, "memory", nil, "memory sizes, replacing the design (e.g. 96M,1G)")
	f.IntSliceVar(&o.DirtyRates, "dirty-rate", nil, "dirty rates in pages/s, replacing the design")
	f.StringSliceVar(&bandwidths, "bandwidth", nil, "link rates, replacing the design (e.g. 500mbit,1gbit)")
	f.BoolVar(&quiet, "quiet", false, "no progress output when stderr is not a terminal")
	f.StringVar(&rescore, "rescore", "", "compare the runs of an earlier validation.json with --profile, measuring nothing")
	return cmd
}
