package labtool

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"
)

// LoadOptions say which service a load client drives, and how hard.
type LoadOptions struct {
	// Service is redis, memcached, mqtt (or mosquitto) or postgres (or
	// postgresql).
	Service string
	// Addr is host:port; for postgres also a connection string (see
	// postgresConfig).
	Addr string
	// Rate is requests per second in total over Conns connections
	// (default 100).
	Rate float64
	// Conns is how many connections the client keeps (default 1).
	Conns int
	// Bucket is the timeline's resolution (default 100 ms).
	Bucket time.Duration
	// Tool also runs the service's own benchmark tool beside the client
	// (redis-benchmark, pgbench, mosquitto_pub; memcached has none).
	Tool bool
	// Run names this run's keys, rows and topics (default: random).
	Run string
}

// workload is one service's client once its connections are up.
type workload interface {
	// run sends requests at rate until stop closes and returns once every
	// request sent has been settled (answered, failed or given up).
	run(ctx context.Context, rate float64, stop <-chan struct{})
	// check says whether the service holds what its answers promised
	// (and the Fill state), on connections of its own.
	check(ctx context.Context) (ok bool, state string, err error)
	close()
}

// loadService is what Load, Fill and CheckFill know of one service.
type loadService struct {
	connect   func(ctx context.Context, o LoadOptions, rec *recorder) (workload, error)
	fill      func(ctx context.Context, addr string, bytes int64) error
	checkFill func(ctx context.Context, addr string) (fillReport, error)
	// tool starts the service's benchmark tool, if it has one.
	tool func(ctx context.Context, o LoadOptions) (*benchTool, error)
}

var loadServices = map[string]loadService{
	"redis":     {connect: connectRedis, fill: fillRedis, checkFill: checkFillRedis, tool: startRedisBenchmark},
	"memcached": {connect: connectMemcached, fill: fillMemcached, checkFill: checkFillMemcached},
	"mqtt":      {connect: connectMQTT, fill: fillMQTT, checkFill: checkFillMQTT, tool: startMosquittoPub},
	"postgres":  {connect: connectPostgres, fill: fillPostgres, checkFill: checkFillPostgres, tool: startPgbench},
}

// serviceAliases are the names the lab's workloads go by.
var serviceAliases = map[string]string{"mosquitto": "mqtt", "postgresql": "postgres"}

// LoadServices are the services Load, Fill and CheckFill drive.
func LoadServices() []string {
	var out []string
	for s := range loadServices {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

func lookupService(name string) (string, loadService, error) {
	name = strings.ToLower(name)
	if a, ok := serviceAliases[name]; ok {
		name = a
	}
	s, ok := loadServices[name]
	if !ok {
		return "", s, fmt.Errorf("unknown service %q (one of %s)", name, strings.Join(LoadServices(), ", "))
	}
	return name, s, nil
}

// Load drives the service at o.Addr at o.Rate requests per second over
// o.Conns kept connections. It prints "connected" once they are up, sends
// until stdin closes, checks the service's state, then prints the
// LoadResult as one JSON line. A connection lost on the way counts an
// error, is dialed again (a reconnect) and the load goes on.
func Load(ctx context.Context, o LoadOptions, stdin io.Reader, stdout io.Writer) error {
	name, svc, err := lookupService(o.Service)
	if err != nil {
		return err
	}
	o.Service = name
	if o.Rate <= 0 {
		o.Rate = 100
	}
	o.Conns = max(o.Conns, 1)
	if o.Bucket <= 0 {
		o.Bucket = 100 * time.Millisecond
	}
	if o.Run == "" {
		o.Run = newRunName()
	}
	rec := newRecorder(o.Conns)
	w, err := svc.connect(ctx, o, rec)
	if err != nil {
		return fmt.Errorf("%s at %s: %w", name, o.Addr, err)
	}
	defer w.close()
	var tool *benchTool
	if o.Tool {
		if svc.tool == nil {
			return fmt.Errorf("%s has no benchmark tool to run beside the client", name)
		}
		if tool, err = svc.tool(ctx, o); err != nil {
			return fmt.Errorf("%s's benchmark tool: %w", name, err)
		}
	}

	fmt.Fprintln(stdout, "connected")
	stop := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, stdin); close(stop) }()
	var stopped time.Time
	runStop := make(chan struct{})
	go func() {
		select {
		case <-stop:
		case <-ctx.Done():
		}
		stopped = time.Now()
		close(runStop)
	}()
	rec.restart()
	w.run(ctx, o.Rate, runStop)
	<-runStop

	res := LoadResult{Service: name, Run: o.Run, Rate: o.Rate, Conns: o.Conns}
	rec.fill(&res, stopped, o.Bucket)
	if tool != nil {
		res.Tool = tool.stop()
	}
	if ctx.Err() != nil {
		res.Error = ctx.Err().Error()
	}
	checkCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
	defer cancel()
	res.StateOK, res.State, err = w.check(checkCtx)
	if err != nil {
		res.StateOK = false
		res.Error = strings.TrimPrefix(res.Error+"; ", "; ") + "state check: " + err.Error()
	}
	return json.NewEncoder(stdout).Encode(res)
}

// tick calls send(lane, i) for the i-th request due on each of lanes,
// rate per second in total, lanes staggered, until stop closes. A lane's
// send may wait for its answer: requests that fall due meanwhile are
// skipped, as a client waiting on its connection would.
func tick(ctx context.Context, lanes int, rate float64, stop <-chan struct{}, send func(lane, i int)) {
	interval := time.Duration(float64(time.Second) * float64(lanes) / rate)
	interval = max(interval, time.Microsecond)
	var wg sync.WaitGroup
	for lane := range lanes {
		wg.Go(func() {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-time.After(interval * time.Duration(lane) / time.Duration(lanes)):
			}
			t := time.NewTicker(interval)
			defer t.Stop()
			for i := 0; ; i++ {
				send(lane, i)
				select {
				case <-stop:
					return
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		})
	}
	wg.Wait()
}

// tickRequests runs request-response lanes: request sends lane's i-th
// request and waits for its answer (at most answerWait, so that a frozen
// server shows as a stall, not an error).
func tickRequests(ctx context.Context, rec *recorder, lanes int, rate float64, stop <-chan struct{}, request func(ctx context.Context, lane, i int) error) {
	tick(ctx, lanes, rate, stop, func(lane, i int) {
		rctx, cancel := context.WithTimeout(ctx, answerWait)
		defer cancel()
		sent := rec.send(lane)
		err := request(rctx, lane, i)
		rec.answer(lane, sent, err)
	})
}

func newRunName() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Fill preloads the service at addr with about bytes of state derived
// from the keys alone, so that a migration moves real state and CheckFill
// (and Load's check) can tell it is intact: redis and memcached keys
// fill:<n> of 4 KiB, postgres rows of about 1 KiB in ferry_fill, MQTT
// retained messages of 4 KiB on fill/<n>. Each also records how much it
// wrote (redis and memcached key fill:count, postgres table
// ferry_fill_meta, MQTT retained topic fill/count).
func Fill(ctx context.Context, service, addr string, bytes int64) error {
	name, svc, err := lookupService(service)
	if err != nil {
		return err
	}
	if err := svc.fill(ctx, addr, bytes); err != nil {
		return fmt.Errorf("filling %s at %s: %w", name, addr, err)
	}
	return nil
}

// CheckFill reads back everything Fill wrote (all of it, not a sample)
// and says whether it is intact, and what it found.
func CheckFill(ctx context.Context, service, addr string) (ok bool, summary string, err error) {
	name, svc, err := lookupService(service)
	if err != nil {
		return false, "", err
	}
	r, err := svc.checkFill(ctx, addr)
	if err != nil {
		return false, "", fmt.Errorf("checking %s at %s: %w", name, addr, err)
	}
	return r.ok(), r.String(), nil
}

// fillReport is what a check of Fill's state found.
type fillReport struct {
	// Items is how many Fill's marker says it wrote (0: no fill found).
	Items, Size int
	// Missing and Wrong count items absent or holding another value.
	Missing, Wrong int
}

func (f fillReport) ok() bool { return f.Missing == 0 && f.Wrong == 0 }

func (f fillReport) String() string {
	if f.Items == 0 {
		return "fill: none"
	}
	if f.ok() {
		return fmt.Sprintf("fill: %d items of %d bytes intact", f.Items, f.Size)
	}
	return fmt.Sprintf("fill: %d of %d items missing, %d wrong", f.Missing, f.Items, f.Wrong)
}

// fillCount is how many items of size make about bytes (at least one
// when bytes > 0).
func fillCount(bytes int64, size int) int {
	if bytes <= 0 {
		return 0
	}
	return int(max((bytes+int64(size)-1)/int64(size), 1))
}

// parseFillMarker reads "<items> <size>".
func parseFillMarker(s string) (items, size int, err error) {
	if _, err := fmt.Sscanf(s, "%d %d", &items, &size); err != nil || items < 0 || size <= 0 {
		return 0, 0, fmt.Errorf("fill marker %q is not \"<items> <size>\"", s)
	}
	return items, size, nil
}
