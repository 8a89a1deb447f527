package fit

import (
	"fmt"
	"math"

	"github.com/ferry-migrate/ferry/internal/model"
)

// kneeNote says, with four memory sizes or more, whether two lines with a
// knee fit much better than the model's one (time growing faster or
// slower than linearly, which the model cannot express).
func kneeNote(x, y []float64, rmse float64) string {
	pw, err := model.FitPiecewiseAuto(x, y)
	if err != nil || !(pw.RMSE < 0.7*rmse) {
		return ""
	}
	return fmt.Sprintf("a knee at %.0f MiB fits better (R² %.3f): below, %.0f ms + M at %.0f MB/s; above, %.0f ms + M at %.0f MB/s",
		pw.Knee/(1<<20), pw.R2, pw.Below.A*1000, rateMBs(pw.Below.B), pw.Above.A*1000, rateMBs(pw.Above.B))
}

func rateMBs(slope float64) float64 {
	if slope <= 0 {
		return math.Inf(1)
	}
	return 1 / slope / 1e6
}

func joinNotes(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}

// subFits describes separate line fits (intercept in ms, rate in MB/s,
// R²), for a note.
func subFits(sets map[string][2][]float64) string {
	var out string
	for _, name := range sortedKeys(sets) {
		xy := sets[name]
		f := freeLine(xy[0], xy[1])
		if f == nil {
			continue
		}
		if out != "" {
			out += "; "
		}
		rate := rateMBs(f.B)
		if name != "" {
			out += name + ": "
		}
		out += fmt.Sprintf("%.0f ms + M at %.0f MB/s (R² %.3f, n %d)", f.A*1000, rate, f.R2, f.N)
	}
	return out
}
