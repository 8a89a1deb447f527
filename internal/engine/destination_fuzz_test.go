package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/ferry-migrate/ferry/internal/admission"
	"github.com/ferry-migrate/ferry/internal/host"
	"github.com/ferry-migrate/ferry/internal/journal"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/transport"
	"github.com/ferry-migrate/ferry/internal/transport/transporttest"
)

// FuzzDestinationSession plays a source whose control channel carries the
// fuzzer's bytes, raw, to Destination.Receive with the fake runtime.
//
// The input is a script, one line per action (a line's bytes are sent as
// they are, valid JSON or not):
//
//	!TEXT   an error frame saying TEXT (a source giving up)
//	~TEXT   a data frame (a protocol error on a control channel)
//	^       an end frame (the same)
//	#KIND   open a channel of KIND and close it at once (only rootfs.live,
//	        rootfs.final, images, rounds and probe: pages, lazy and the
//	        pre-dump channels would start CRIU)
//	%stop   cancel the destination's context (its agent stopping)
//	other   one control frame: the first is the offer, the rest steps
//
// Whatever the script, the destination must not panic; once the script
// is played the source closes the control channel, then (after 10 ms) the
// session, and Receive must have returned within 2 s of that; it must
// never restore or start anything (no state is ever complete), must
// discard every container it prepared exactly once, journal nothing and
// leave no scratch; and one run must not allocate more than fuzzHeapBound
// nor leave goroutines behind.
//
// Safety: the run must create nothing on this host outside its temporary
// directory. Read from destination.go and network.go, what an offer can
// reach with this Destination: prepareNetwork refuses any Network (no
// SegmentBridge) before cnet creates a namespace; the runtime set holds
// only the fake runtime (runc, Podman, LXC are never driven); faults are
// off (AllowFaults false: no signals to this process, no CRIU kills); no
// CRIU process starts, since only the pages, lazy and pre-dump channels
// start one and the script cannot open them; liftThrottle and the network
// bring-up run only after a restore, which needs state the script cannot
// send; memory prewarming touches at most twice what the admission
// policy admits (8 MiB here). One thing is reachable: the offer's ID names the scratch
// directory (Host.WorkDir(ID)), created and then removed with
// mounts.RemoveAll (which first detaches every mount below it) without
// any check of the ID, so "../.." would unmount and delete outside the
// state directory (see TestOfferIDStaysInTheWorkRoot). The harness
// therefore decodes the offer as Receive will (same bytes, same type) and
// replaces an ID that is not a plain name before sending.
func FuzzDestinationSession(f *testing.F) {
	offer := func(mode, extra string) string {
		return `{"id":"0123456789ab","container":"web","mode":"` + mode + `","source_host":"h1","runtime":"fake","memory_bytes":65536` + extra + `}`
	}
	lines := func(ls ...string) []byte { return []byte(strings.Join(ls, "\n") + "\n") }
	f.Add(lines(offer("cold", ""), `{"do":"restore"}`, `{"do":"commit"}`))
	f.Add(lines(offer("cold", ""), `{"do":"commit"}`))
	f.Add(lines(offer("cold", ""), "#rootfs.live", "#images", `{"do":"restore"}`))
	f.Add(lines(offer("precopy", ""), "#rounds", `{"do":"restore"}`))
	f.Add(lines(offer("precopy", `,"precopy":{"max_rounds":3,"switchover":"rebuild"}`), "#rootfs.final", `{"do":"abort"}`))
	f.Add(lines(offer("precopy", `,"precopy":{"max_rounds":64,"engine":"native"}`), `{"do":"restore"}`))
	f.Add(lines(offer("postcopy", ""), "#images", `{"do":"restore"}`, "%stop"))
	f.Add(lines(offer("hybrid", ""), "!dump on h1: criu failed"))
	f.Add(lines(offer("auto", ""), "#probe", `{"do":"mode","mode":"precopy","precopy":{"max_rounds":2}}`, `{"do":"restore"}`))
	f.Add(lines(offer("auto", ""), `{"do":"mode","mode":"auto"}`))
	f.Add(lines(offer("cold", ""), "%stop", `{"do":"restore"}`))
	f.Add(lines(offer("cold", ""), "~some bytes", `{"do":"restore"}`))
	f.Add(lines(offer("cold", ""), "^"))
	f.Add(lines(offer("cold", `,"network":{"ifaces":[{"name":"eth0","mac":"02:00:00:00:00:01","mtu":1500,"addrs":["10.77.0.5/24"]}],"gateway":"10.77.0.1"}`)))
	f.Add(lines(offer("cold", `,"faults":["kill-destination@restore"]`), `{"do":"restore"}`))
	f.Add(lines(offer("cold", `,"memory_bytes":9223372036854775807`)))
	f.Add(lines(`{"id":"../../x","container":"../x","mode":"teleport","runtime":"podman"}`))
	f.Add(lines(`{"id":"..\u002f..","container":"web","mode":"cold","runtime":"fake"}`, `{"do":"restore"}`))
	f.Add(lines(`{"id":"0123456789ab","container":"web","mode":"cold","runtime":"fake","meta":{"k":"AAAA"},"spec":{"ociVersion":"1.0.2"},"image":"sha256:00"}`, `[1,2,3]`, `{"do":"restore"}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		script, ok := parseSessionScript(in)
		if !ok {
			t.Skip("input beyond the script's bounds")
		}
		if !script.safeOffer() {
			t.Skip("offer with an unsafe ID that cannot be re-encoded")
		}
		playSession(t, script)
	})
}

// A script's bounds: the fuzzer's inputs rarely reach them, and within
// them everything the source writes fits in yamux's initial stream window
// (256 KiB), so no write can block on a destination that stopped reading.
const (
	maxScriptBytes = 64 << 10
	maxScriptLines = 64
)

// fuzzHeapBound is what one run may allocate (runtime.MemStats.TotalAlloc
// over the run: everything the process allocated meanwhile, freed or not).
// A run's input is at most 64 KiB in at most 64 messages of one frame
// each, so the transport's own bound (a control message reassembles to at
// most 256 MiB) is never approached. A run allocates about 350 KiB for a
// small script and about 1 MiB for the largest (a 64 KiB offer; see the
// log with FERRY_FUZZ_ALLOC=1): harness, session, and the destination's
// decoding and bookkeeping. 16 MiB, 256 times the largest input, can only
// be crossed by the destination sizing something by what a message
// announces (memory_bytes, max_rounds, a count) rather than by what
// arrived. Memory prewarming maps memory outside Go's heap, which this
// does not see; the admission policy here bounds it (8 MiB announced,
// twice that for the rebuild switchover).
const fuzzHeapBound = 16 << 20

type scriptLine struct {
	op   byte // 'c' control, '!' error, '~' data, '^' end, '#' open, '%' stop
	data []byte
}

type sessionScript []scriptLine

var openable = map[string]bool{ChanRootfsLive: true, ChanRootfsFinal: true, ChanImages: true, ChanRounds: true, ChanProbe: true}

func parseSessionScript(in []byte) (sessionScript, bool) {
	if len(in) > maxScriptBytes {
		return nil, false
	}
	raw := bytes.Split(in, []byte("\n"))
	if n := len(raw); n > 0 && len(raw[n-1]) == 0 {
		raw = raw[:n-1] // the last line's newline
	}
	if len(raw) > maxScriptLines {
		return nil, false
	}
	var s sessionScript
	for _, l := range raw {
		switch {
		case len(l) > 0 && (l[0] == '!' || l[0] == '~' || l[0] == '#'):
			if l[0] == '#' && !openable[string(l[1:])] {
				continue // a channel that could start CRIU, or one nobody expects
			}
			s = append(s, scriptLine{op: l[0], data: l[1:]})
		case string(l) == "^":
			s = append(s, scriptLine{op: '^'})
		case string(l) == "%stop":
			s = append(s, scriptLine{op: '%'})
		default:
			s = append(s, scriptLine{op: 'c', data: l})
		}
	}
	return s, true
}

// plainID is an ID that names a directory right below the work root.
var plainID = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$`)

// safeOffer replaces the offer's ID when it is not a plain name; false if
// the offer cannot be re-encoded. The offer is the first frame on the
// control channel when that is a control frame: decoded here exactly as
// Receive decodes it (json.Unmarshal of the same bytes into an Offer).
func (s sessionScript) safeOffer() bool {
	for i, l := range s {
		switch l.op {
		case '#', '%':
			continue // not on the control channel
		case 'c':
		default:
			return true // Receive fails on reading the offer
		}
		var o Offer
		if json.Unmarshal(l.data, &o) != nil {
			return true // so does Receive
		}
		if plainID.MatchString(o.ID) {
			return true
		}
		o.ID = "f0f0f0f0f0f0"
		b, err := json.Marshal(o)
		if err != nil {
			return false
		}
		s[i].data = b
		return true
	}
	return true
}

// rawSource is the source's end of a session, spoken by hand: the Hello
// and yamux as transport does it, then frames written as they are.
type rawSource struct {
	mux *yamux.Session
	ctl *yamux.Stream
	seq uint64 // the control channel's next frame
}

func dialRaw(conn net.Conn) (*rawSource, error) {
	hello, err := json.Marshal(transport.Hello{Version: transport.ProtocolVersion, Name: "h1", Role: "agent"})
	if err != nil {
		return nil, err
	}
	if err := transport.WriteFrame(conn, transport.Frame{Type: transport.FrameControl, Payload: hello}); err != nil {
		return nil, err
	}
	if _, err := transport.ReadFrame(conn, nil); err != nil {
		return nil, err
	}
	cfg := yamux.DefaultConfig()
	cfg.EnableKeepAlive = false
	cfg.LogOutput = io.Discard
	mux, err := yamux.Client(conn, cfg)
	if err != nil {
		return nil, err
	}
	ctl, err := openRaw(mux, ChanIncoming)
	if err != nil {
		mux.Close()
		return nil, err
	}
	return &rawSource{mux: mux, ctl: ctl, seq: 1}, nil
}

// openRaw opens a channel: a stream whose first frame names its kind.
func openRaw(mux *yamux.Session, kind string) (*yamux.Stream, error) {
	st, err := mux.OpenStream()
	if err != nil {
		return nil, err
	}
	name, _ := json.Marshal(kind)
	if err := transport.WriteFrame(st, transport.Frame{Type: transport.FrameControl, Payload: name}); err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}

func (r *rawSource) frame(t transport.FrameType, p []byte) {
	_ = r.ctl.SetWriteDeadline(time.Now().Add(2 * time.Second))
	// A write may fail: the destination closes the channel when it gives up.
	_ = transport.WriteFrame(r.ctl, transport.Frame{Type: t, Seq: r.seq, Payload: p})
	r.seq++
}

// playSession runs one script against a fresh destination and checks
// what it left.
func playSession(t *testing.T, script sessionScript) {
	base := t.TempDir()
	state := filepath.Join(base, "state")
	j, err := journal.Open(filepath.Join(state, "journal"))
	if err != nil {
		t.Fatal(err)
	}
	rt := &fakeRuntime{caps: allCaps, root: filepath.Join(base, "containers")}
	if err := os.MkdirAll(rt.root, 0o700); err != nil {
		t.Fatal(err)
	}
	d := &Destination{
		Host:        host.Config{Name: "h2", StateDir: state},
		Runtimes:    runtime.Set{"fake": rt},
		CRIUVersion: "4.1",
		Journal:     j,
		Admission:   admission.Policy{MaxMemoryBytes: 8 << 20},
		// Not set, on purpose: SegmentBridge (offers with an address of
		// their own are refused), AllowFaults (no signals, no CRIU kills).
	}

	// A run that hangs before the session closes (where the checks
	// below cannot see it) crashes the worker with every stack, so the
	// fuzzer keeps the input.
	watchdog := time.AfterFunc(20*time.Second, func() {
		panic("FuzzDestinationSession: one run took 20 s\n" + stacks())
	})
	defer watchdog.Stop()
	goroutines := goruntime.NumGoroutine()
	var before goruntime.MemStats
	goruntime.ReadMemStats(&before)

	a, b := net.Pipe()
	srv := make(chan *transport.Session, 1)
	go func() {
		s, _ := transporttest.Accept(b, "h2")
		srv <- s
	}()
	src, err := dialRaw(a)
	dst := <-srv
	if err != nil || dst == nil {
		a.Close()
		b.Close()
		t.Fatalf("session: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	router := transport.NewRouter()
	started, done, served := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(served)
		router.Serve(dst, func(ch *transport.Channel) {
			if ch.Kind != ChanIncoming { // the script opens no other
				ch.Close()
				return
			}
			close(started)
			defer close(done)
			d.Receive(ctx, dst, router, ch)
		})
	}()
	// The destination has the control channel before anything happens
	// (else a session closed early would end Serve before Receive ran).
	select {
	case <-started:
	case <-time.After(2 * time.Second):
		t.Fatal("the destination never took the control channel")
	}
	drained := make(chan struct{})
	go func() { // what the destination answers, read and dropped
		defer close(drained)
		_, _ = io.Copy(io.Discard, src.ctl)
	}()

	for _, l := range script {
		switch l.op {
		case 'c':
			src.frame(transport.FrameControl, l.data)
		case '!':
			src.frame(transport.FrameError, l.data)
		case '~':
			src.frame(transport.FrameData, l.data)
		case '^':
			src.frame(transport.FrameEnd, nil)
		case '#':
			if st, err := openRaw(src.mux, string(l.data)); err == nil {
				st.Close()
			}
		case '%':
			cancel()
		}
	}
	// The script is played: the source hangs up, the control channel
	// first (a destination before the restore returns on that), then the
	// session (one asked to restore waits for state until then).
	src.ctl.Close()
	select {
	case <-done:
	case <-time.After(10 * time.Millisecond):
	}
	src.mux.Close()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatalf("Receive did not return within 2 s of the session closing\n%s", stacks())
	}
	dst.Close()
	<-served
	<-drained

	var after goruntime.MemStats
	goruntime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	if alloc > fuzzHeapBound {
		t.Errorf("one run allocated %d MiB (bound %d MiB)", alloc>>20, fuzzHeapBound>>20)
	}
	if os.Getenv("FERRY_FUZZ_ALLOC") != "" {
		t.Logf("allocated %d KiB", alloc>>10)
	}

	c := rt.counts()
	if c.restored != 0 || c.started != 0 {
		t.Errorf("the runtime saw %+v: restored or started without the state", c)
	}
	for i, tg := range rt.targets {
		tg.mu.Lock()
		n := tg.discards
		tg.mu.Unlock()
		if n != 1 {
			t.Errorf("container %d of %d prepared was discarded %d times, want once", i+1, len(rt.targets), n)
		}
		if _, err := os.Stat(tg.dir); !os.IsNotExist(err) {
			t.Errorf("container %d's root filesystem left behind (%v)", i+1, err)
		}
	}
	if pend, err := j.Pending(); err != nil || len(pend) > 0 {
		t.Errorf("journal holds %+v (%v) not settled, want nothing", pend, err)
	}
	if left, err := os.ReadDir(d.Host.WorkRoot()); err == nil && len(left) > 0 {
		t.Errorf("scratch left behind: %v", names(left))
	}

	// Everything this run started ends with it.
	for deadline := time.Now().Add(2 * time.Second); goruntime.NumGoroutine() > goroutines; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines before the run, %d two seconds after it ended\n%s", goroutines, goruntime.NumGoroutine(), stacks())
		}
	}
}

func names(es []os.DirEntry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

func stacks() string {
	buf := make([]byte, 1<<20)
	return string(buf[:goruntime.Stack(buf, true)])
}

// The harness's own safety: whatever spelling the fuzzer finds, the offer
// Receive decodes has a plain ID.
func TestSessionScriptKeepsTheOfferIDPlain(t *testing.T) {
	for _, in := range []string{
		`{"id":"../..","mode":"cold"}`,
		`{"ID":"../..","mode":"cold"}`,
		`{"id":"..\u002f..","mode":"cold"}`,
		`{"id":"x","Id":""}`,
		`{"id":".."}`,
		`{"id":"."}`,
		`{}`,
		"#probe\n%stop\n" + `{"iD":"/etc"}`,
	} {
		s, ok := parseSessionScript([]byte(in))
		if !ok || !s.safeOffer() {
			t.Fatalf("%s: refused", in)
		}
		for _, l := range s {
			if l.op != 'c' {
				continue
			}
			var o Offer
			if err := json.Unmarshal(l.data, &o); err != nil {
				t.Fatalf("%s: %v", in, err)
			}
			if !plainID.MatchString(o.ID) || o.ID == "." || o.ID == ".." || filepath.Base(o.ID) != o.ID {
				t.Errorf("%s: the destination would get ID %q", in, o.ID)
			}
			break
		}
	}
}
