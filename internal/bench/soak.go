package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/ferry-migrate/ferry/api/client"

	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/procs"
)

// SoakOptions describe one `ferry-lab bench soak`.
type SoakOptions struct {
	Migrations  int
	Modes       []string // cycled through; default cold, precopy, postcopy, hybrid
	MemoryBytes int64
	DirtyRate   int
	FerryBin    string
	Log         io.Writer
}

// SoakMigration is one leg of the soak.
type SoakMigration struct {
	From       string  `json:"from"`
	To         string  `json:"to"`
	Mode       string  `json:"mode"`
	OK         bool    `json:"ok"`
	DowntimeMs float64 `json:"downtime_ms"`
	Error      string  `json:"error,omitempty"`
}

// AgentUsage is an agent's resident memory and open files at one moment.
type AgentUsage struct {
	RSSBytes int64 `json:"rss_bytes"`
	OpenFDs  int   `json:"open_fds"`
}

// SoakResult is what the soak found.
type SoakResult struct {
	Migrations []SoakMigration `json:"migrations"`
	Failed     int             `json:"failed"`
	// StateOK: the workload's client saw its state intact throughout.
	StateOK          bool    `json:"state_ok"`
	ClientDowntimeMs float64 `json:"client_downtime_ms"` // the longest
	// Agents' usage after the first tenth of the migrations (warm) and at
	// the end, by host.
	Warm map[string]AgentUsage `json:"warm"`
	End  map[string]AgentUsage `json:"end"`
	// Leaks: what the lab holds at the end (container removed) that it
	// did not hold before the workload started.
	Leaks []string `json:"leaks"`
	// Growth names the agents whose memory or open files grew past the
	// allowance (see grew).
	Growth []string `json:"growth"`
}

// Soak moves one live workload between h1 and h2 Migrations times in
// mixed modes, with a client probing it from h3, and checks afterwards
// that every migration worked, the state held, and nothing grows or leaks.
func Soak(ctx context.Context, o SoakOptions) (res SoakResult, err error) {
	if o.Migrations < 1 {
		return res, errors.New("--migrations must be at least 1")
	}
	if len(o.Modes) == 0 {
		o.Modes = []string{engine.ModeCold, engine.ModePrecopy, engine.ModePostcopy, engine.ModeHybrid}
	}
	if o.MemoryBytes == 0 {
		o.MemoryBytes = 64 << 20
	}
	if o.DirtyRate == 0 {
		o.DirtyRate = 200
	}
	l, down, err := upLab(ctx, lab.Options{Hosts: 3, FerryBin: o.FerryBin})
	if err != nil {
		return res, err
	}
	defer down(&err)
	hosts := []*lab.Host{&l.Hosts[0], &l.Hosts[1]}
	before := snapshot(l)
	const name = "soak"
	args := []string{"/bin/memhog", "--memory", strconv.FormatInt(o.MemoryBytes, 10), "--dirty-rate", strconv.Itoa(o.DirtyRate), "--port", strconv.Itoa(workloadPort)}
	if err := l.Run(ctx, hosts[0].Name, name, args); err != nil {
		return res, err
	}
	removed := false
	remove := func() {
		if !removed {
			for _, h := range hosts {
				_ = l.RemoveFrom(context.WithoutCancel(ctx), "runc", h.Name, name)
			}
			removed = true
		}
	}
	defer remove()
	mo := MigrateOptions{MemoryBytes: o.MemoryBytes}
	p, _, err := StartProbe(ctx, &l.Hosts[2], o.FerryBin, workloadAddrs(1, hosts...), mo.readyTimeout())
	if err != nil {
		return res, err
	}
	res.Migrations = []SoakMigration{}
	warmAt := max(o.Migrations/10, 1)
	for i := 0; i < o.Migrations; i++ {
		from, to := hosts[i%2], hosts[(i+1)%2]
		mode := o.Modes[i%len(o.Modes)]
		rep, merr := client.Migrate(ctx, client.Socket(from.ControlSock), engine.Request{Container: name, To: to.AgentAddr, Mode: mode}, nil)
		m := SoakMigration{From: from.Name, To: to.Name, Mode: mode, OK: merr == nil && rep.OK, DowntimeMs: rep.DowntimeMs, Error: rep.Error}
		if merr != nil {
			m.Error = merr.Error()
		}
		res.Migrations = append(res.Migrations, m)
		o.logf("%d/%d: %s %s -> %s ok=%v downtime %.0f ms %s", i+1, o.Migrations, mode, from.Name, to.Name, m.OK, m.DowntimeMs, m.Error)
		if !m.OK {
			res.Failed++
			break // the container is not where the next leg expects it
		}
		if i+1 == warmAt {
			res.Warm = usage(hosts)
		}
		if ctx.Err() != nil {
			break
		}
	}
	res.End = usage(hosts)
	time.Sleep(300 * time.Millisecond)
	pr, perr := p.Stop()
	res.StateOK = perr == nil && pr.StateOK
	res.ClientDowntimeMs = pr.ClientDowntimeMs
	remove()
	res.Leaks = leftSince(l, before)
	if res.Leaks == nil {
		res.Leaks = []string{}
	}
	res.Growth = grew(res.Warm, res.End)
	return res, ctx.Err()
}

// grew names the agents whose resident memory grew by more than 64 MiB or
// half, or whose open files grew by more than 16, from warm to end: an
// agent holds no per-migration state once a migration ended.
func grew(warm, end map[string]AgentUsage) []string {
	out := []string{}
	for h, w := range warm {
		e, ok := end[h]
		if !ok {
			continue
		}
		if d := e.RSSBytes - w.RSSBytes; d > 64<<20 && d > w.RSSBytes/2 {
			out = append(out, fmt.Sprintf("%s: memory %d -> %d MiB", h, w.RSSBytes>>20, e.RSSBytes>>20))
		}
		if e.OpenFDs-w.OpenFDs > 16 {
			out = append(out, fmt.Sprintf("%s: open files %d -> %d", h, w.OpenFDs, e.OpenFDs))
		}
	}
	return out
}

// usage reads the hosts' agents' resident memory and open files.
func usage(hosts []*lab.Host) map[string]AgentUsage {
	out := map[string]AgentUsage{}
	for _, h := range hosts {
		out[h.Name] = AgentUsage{RSSBytes: procs.Resident(h.AgentPID), OpenFDs: len(procs.OpenFiles(h.AgentPID))}
	}
	return out
}

func (o SoakOptions) logf(format string, args ...any) { logTo(o.Log, format, args...) }
