package calibrate

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/lab"
)

// Runner measures one grid point; bench.Migrate in real use, a fake in
// tests.
type Runner func(context.Context, bench.MigrateOptions) (bench.MigrateResult, error)

// Point is one cell of a measurement grid.
type Point struct {
	Mode         string `json:"mode"`
	MemoryBytes  int64  `json:"memory_bytes"`
	DirtyRate    int    `json:"dirty_rate"`    // pages per second
	BandwidthBps int64  `json:"bandwidth_bps"` // bits per second; 0 = unshaped
	// Baselines asked of the bench at this point ("link").
	Baselines []string `json:"baselines,omitempty"`
}

func (p Point) String() string {
	bw := "unshaped"
	if p.BandwidthBps > 0 {
		bw = lab.FormatRate(p.BandwidthBps)
	}
	return fmt.Sprintf("%s %dM %dp/s %s", p.Mode, p.MemoryBytes>>20, p.DirtyRate, bw)
}

// Measured is a grid point with what the bench reported.
type Measured struct {
	Point
	Result *bench.MigrateResult `json:"result,omitempty"`
	Error  string               `json:"error,omitempty"`
	WallS  float64              `json:"wall_s"`
}

// Progress tells a watcher where a grid run is.
type Progress struct {
	Done, Total int
	Point       string // the point being measured ("" once done)
	Step        string // the bench's latest step
	Elapsed     time.Duration
}

// sweep measures each point in turn with one bench run (a lab of its own:
// bench brings one up per call, and only one lab can exist at a time).
// A bench error (no lab, a cancelled context) stops the sweep; failed
// migrations are recorded and the sweep goes on.
func sweep(ctx context.Context, points []Point, repeat int, ferryBin string, run Runner,
	progress func(Progress), log io.Writer) ([]Measured, error) {
	if run == nil {
		run = bench.Migrate
	}
	start := time.Now()
	var out []Measured
	for i, pt := range points {
		var mu sync.Mutex
		cur := Progress{Done: i, Total: len(points), Point: pt.String()}
		emit := func(step string) {
			if progress == nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if step != "" {
				cur.Step = step
			}
			cur.Elapsed = time.Since(start)
			progress(cur)
		}
		emit("")
		w := &lineWriter{fn: func(line string) {
			emit(strings.TrimPrefix(line, "bench: "))
			if log != nil {
				fmt.Fprintln(log, line)
			}
		}}
		t0 := time.Now()
		res, err := run(ctx, bench.MigrateOptions{Mode: pt.Mode, MemoryBytes: pt.MemoryBytes, DirtyRate: pt.DirtyRate,
			BandwidthBps: pt.BandwidthBps, Repeat: repeat, Baselines: pt.Baselines, FerryBin: ferryBin, Log: w})
		m := Measured{Point: pt, WallS: time.Since(t0).Seconds()}
		if err != nil {
			m.Error = err.Error()
			out = append(out, m)
			return out, fmt.Errorf("%s: %w", pt, err)
		}
		m.Result = &res
		if len(okRuns(res)) == 0 {
			m.Error = "no run succeeded"
			for _, r := range res.Runs {
				if r.Error != "" {
					m.Error += ": " + r.Error
					break
				}
			}
		}
		out = append(out, m)
	}
	if progress != nil {
		progress(Progress{Done: len(points), Total: len(points), Elapsed: time.Since(start)})
	}
	return out, nil
}

// lineWriter calls fn with each complete line written to it.
type lineWriter struct {
	mu  sync.Mutex
	buf []byte
	fn  func(string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		line := string(w.buf[:i])
		w.buf = w.buf[i+1:]
		w.fn(line)
	}
}
