package followlab

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/follow"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/units"
)

// ServiceIP is the service's address on the lab's segment: it keeps it
// wherever it moves, so the client's connection follows it.
const ServiceIP = "10.79.0.20"

const redisServer = "/usr/bin/redis-server"

// Options say how to run a scenario.
type Options struct {
	Spec Spec
	// FerryBin is the ferry binary (the lab's agents, follow); lab-tool is
	// the ferry-lab beside it (lab.ToolBin).
	FerryBin string
	// Out is where follow's state and log go.
	Out string
	// Log hears progress lines (nil: none).
	Log func(string)
}

// Run brings up the lab, runs the scenario and takes the lab down.
func Run(ctx context.Context, o Options) (res Results, err error) {
	s := o.Spec
	res.Spec = s
	logf := func(format string, args ...any) {
		if o.Log != nil {
			o.Log(fmt.Sprintf(format, args...))
		}
	}
	if _, err := os.Stat(redisServer); err != nil {
		return res, fmt.Errorf("%s is not installed (make setup installs it)", redisServer)
	}
	var bps int64
	if s.Bandwidth != "" {
		bps, _ = units.ParseRate(s.Bandwidth)
	}
	client := fmt.Sprintf("h%d", s.Hosts+1)
	if err := lab.Down(ctx); err != nil {
		return res, fmt.Errorf("clearing an old lab: %w", err)
	}
	rtts := s.RTTAt(0)
	logf("lab up: %d edge hosts and the client %s, delay lines %v", s.Hosts, client, rtts)
	l, err := lab.Up(ctx, lab.Options{Hosts: s.Hosts + 1, FerryBin: o.FerryBin, BandwidthBps: bps, DelayLines: true, RTT: rtts})
	if err != nil {
		return res, err
	}
	defer func() {
		if derr := lab.Down(context.Background()); derr != nil && err == nil {
			err = derr
		}
	}()
	if err := l.RunOnSegment(ctx, s.Start, "redis", ServiceIP, []string{redisServer}, []string{redisServer, "--port", "6379",
		"--protected-mode", "no", "--save", "", "--appendonly", "no", "--daemonize", "no"}); err != nil {
		return res, err
	}
	ch, err := l.Host(client)
	if err != nil {
		return res, err
	}
	if err := ch.WaitListening(ctx, o.FerryBin, ServiceIP+":6379", 15*time.Second); err != nil {
		return res, err
	}
	load, err := bench.StartLoad(ctx, ch, o.FerryBin, "--service", "redis", "--addr", ServiceIP+":6379",
		"--rate", strconv.FormatFloat(s.Rate, 'f', -1, 64), "--bucket", "250ms")
	if err != nil {
		return res, err
	}
	loadStopped := false
	defer func() {
		if !loadStopped {
			_, _ = load.Stop()
		}
	}()

	start := time.Now()
	res.StartUnixMs = start.UnixMilli()
	var mu sync.Mutex
	setRTTs := func(t time.Duration, rtt map[string]time.Duration) error {
		p := RTTPoint{TMs: float64(t) / float64(time.Millisecond), RTT: map[string]float64{}}
		for h, d := range rtt {
			if err := l.SetRTT(h, d); err != nil {
				return err
			}
			p.RTT[h] = float64(d) / float64(time.Millisecond)
		}
		mu.Lock()
		res.RTTs = append(res.RTTs, p)
		mu.Unlock()
		return nil
	}
	if err := setRTTs(0, withNoise(rtts, s.Noise, nil)); err != nil {
		return res, err
	}

	follower, events, err := startFollow(ctx, o, s, start)
	if err != nil {
		return res, err
	}
	runCtx, cancel := context.WithTimeout(ctx, s.Duration)
	defer cancel()
	schedErr := make(chan error, 1)
	go func() { schedErr <- runSchedule(runCtx, s, start, setRTTs) }()
	<-runCtx.Done()
	serr := <-schedErr
	res.DurationMs = float64(time.Since(start)) / float64(time.Millisecond)
	evs, ferr := follower.stop()
	res.Events = append(events.take(), evs...)
	cr, lerr := load.Stop()
	loadStopped = true
	res.Client = cr
	res.Analyze()
	logf("%d moves, mean latency %.1f ms (oracle %.1f, static %.1f)", res.Scores.Moves, res.Scores.MeanLatencyMs, res.Scores.OracleMeanLatencyMs, res.Scores.StaticMeanLatencyMs)
	if serr != nil && !errors.Is(serr, context.DeadlineExceeded) && !errors.Is(serr, context.Canceled) {
		return res, serr
	}
	return res, errors.Join(ferr, lerr)
}

// runSchedule sets each step's round trips at its time, jittered anew
// every NoiseEvery when the spec has noise.
func runSchedule(ctx context.Context, s Spec, start time.Time, set func(time.Duration, map[string]time.Duration) error) error {
	rng := rand.New(rand.NewPCG(uint64(start.UnixNano()), 7))
	tick := s.NoiseEvery
	if s.Noise == 0 {
		tick = time.Hour
	}
	next := 1
	for {
		wait := tick
		if next < len(s.Schedule) {
			wait = min(wait, time.Until(start.Add(s.Schedule[next].At)))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(max(wait, 0)):
		}
		t := time.Since(start)
		for next < len(s.Schedule) && s.Schedule[next].At <= t {
			next++
		}
		if err := set(t, withNoise(s.RTTAt(t), s.Noise, rng)); err != nil {
			return err
		}
	}
}

// withNoise jitters every round trip by up to ±share (rng nil: the first
// values, jittered with a fixed seed).
func withNoise(rtt map[string]time.Duration, share float64, rng *rand.Rand) map[string]time.Duration {
	if rng == nil {
		rng = rand.New(rand.NewPCG(1, 7))
	}
	out := map[string]time.Duration{}
	for h, d := range rtt {
		if share > 0 {
			d = time.Duration(float64(d) * (1 + share*(2*rng.Float64()-1)))
		}
		out[h] = d.Round(100 * time.Microsecond)
	}
	return out
}

// follower is ferry follow running as its own process.
type follower struct {
	cmd  *exec.Cmd
	done chan struct{}
	evs  *eventLog
}

type eventLog struct {
	mu  sync.Mutex
	evs []follow.Event
}

func (e *eventLog) add(ev follow.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.evs = append(e.evs, ev)
}

func (e *eventLog) take() []follow.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := e.evs
	e.evs = nil
	return out
}

// startFollow starts `ferry follow --json` on the scenario's hosts.
func startFollow(ctx context.Context, o Options, s Spec, start time.Time) (*follower, *eventLog, error) {
	f := s.Follow
	trig := f.Trigger()
	args := []string{"follow", "redis", "--hosts", strings.Join(s.HostNames(), ","), "--at", s.Start, "--ports", "6379", "--json",
		"--threshold", trig.Threshold.String(), "--dwell", trig.Dwell.String(), "--hysteresis", strconv.FormatFloat(trig.Hysteresis, 'f', -1, 64),
		"--min-interval", trig.MinInterval.String(), "--interval", f.Interval.String(), "--max-downtime", f.MaxDowntime.String(),
		"--state", filepath.Join(o.Out, "follow-state.json")}
	if s.Profile != "" {
		args = append(args, "--profile", s.Profile)
	}
	_ = os.Remove(filepath.Join(o.Out, "follow-state.json"))
	cmd := exec.CommandContext(ctx, o.FerryBin, args...)
	// ferry takes the lab's host names from its state file only when told.
	cmd.Env = append(os.Environ(), "FERRY_HOSTS="+lab.StateFile)
	logFile, err := os.Create(filepath.Join(o.Out, "follow.log"))
	if err != nil {
		return nil, nil, err
	}
	cmd.Stderr = logFile
	out, err := cmd.StdoutPipe()
	if err != nil {
		logFile.Close()
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, nil, err
	}
	evs := &eventLog{}
	fl := &follower{cmd: cmd, done: make(chan struct{}), evs: evs}
	go func() {
		defer close(fl.done)
		defer logFile.Close()
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
		for sc.Scan() {
			_, _ = logFile.Write(append(sc.Bytes(), '\n'))
			var e follow.Event
			if err := json.Unmarshal(sc.Bytes(), &e); err == nil {
				evs.add(e)
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	return fl, evs, nil
}

// stop ends follow (SIGTERM: it finishes a move under way first) and
// returns the events not taken yet.
func (f *follower) stop() ([]follow.Event, error) {
	_ = f.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-f.done:
	case <-time.After(2 * time.Minute):
		_ = f.cmd.Process.Kill()
		<-f.done
	}
	err := f.cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.Exited() && ee.ExitCode() == 0 {
		err = nil
	}
	if err != nil {
		err = fmt.Errorf("ferry follow: %w (see follow.log)", err)
	}
	return f.evs.take(), err
}
