package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"
)

// hog is the running workload: its memory, its counter and its identity.
type hog struct {
	mem     *memory
	boot    string
	counter atomic.Uint64
	journal atomic.Pointer[journal] // nil without --journal
	watch   atomic.Pointer[watch]   // nil without --watch
}

// statReply is the answer to STAT.
type statReply struct {
	Boot        string `json:"boot"`
	Counter     uint64 `json:"counter"`
	Digest      string `json:"digest"`
	Writes      uint64 `json:"writes"`
	Ready       bool   `json:"ready"`
	Pages       uint64 `json:"pages"`
	MemoryBytes uint64 `json:"memory_bytes"`
}

// verifyReply is the answer to VERIFY.
type verifyReply struct {
	statReply
	VerifyOK bool   `json:"verify_ok"`
	BadPages uint64 `json:"bad_pages"`
	// With --journal: the records written and those the file does not
	// hold as written (VerifyOK covers them too).
	JournalRecords uint64 `json:"journal_records,omitempty"`
	JournalBad     uint64 `json:"journal_bad,omitempty"`
	// With --watch: whether the watch reported a write (VerifyOK covers
	// it too).
	WatchOK *bool `json:"watch_ok,omitempty"`
}

// stat reads only atomics, so it never waits for the dirtier or a VERIFY.
func (h *hog) stat() statReply {
	return statReply{
		Boot:        h.boot,
		Counter:     h.counter.Load(),
		Digest:      fmt.Sprintf("%016x", h.mem.digest.Load()),
		Writes:      h.mem.writes.Load(),
		Ready:       h.mem.ready.Load(),
		Pages:       h.mem.pages,
		MemoryBytes: uint64(len(h.mem.buf)),
	}
}

func (h *hog) verify() verifyReply {
	var r verifyReply
	r.BadPages, r.VerifyOK = h.mem.verify(func() { r.statReply = h.stat() })
	if j := h.journal.Load(); j != nil {
		var ok bool
		r.JournalRecords, r.JournalBad, ok = j.check()
		r.VerifyOK = r.VerifyOK && ok
	}
	if w := h.watch.Load(); w != nil {
		ok := w.check()
		r.WatchOK = &ok
		r.VerifyOK = r.VerifyOK && ok
	}
	return r
}

// tick advances the counter once per pass of its own loop, so time the
// process spends frozen (checkpointed) adds at most one.
func (h *hog) tick() {
	for {
		time.Sleep(time.Millisecond)
		h.counter.Add(1)
	}
}

// dirtyLoop dirties rate pages per second of its own running time.
func (h *hog) dirtyLoop(rate float64) {
	if rate <= 0 {
		return
	}
	paced(rate, func(n uint64) bool { h.mem.dirty(n); return true })
}

// paced calls do, every 10 ms of its own running time, with how many
// units rate per second asks for since the last call (fractions carried
// over), until do returns false. A longer gap (a freeze, a VERIFY, a
// clock jump after restore on another machine) counts as 100 ms: it is
// not made up for in one burst.
func paced(rate float64, do func(n uint64) bool) {
	const (
		period  = 10 * time.Millisecond
		maxStep = 100 * time.Millisecond
	)
	last := time.Now()
	var carry float64
	for {
		time.Sleep(period)
		now := time.Now()
		step := min(max(now.Sub(last), 0), maxStep)
		last = now
		want := rate*step.Seconds() + carry
		n := uint64(want)
		carry = want - float64(n)
		if !do(n) {
			return
		}
	}
}

// maxVerifies bounds VERIFY requests in flight; more are dropped and the
// client retries.
const maxVerifies = 4

// serve answers requests until conn is closed.
func (h *hog) serve(conn *net.UDPConn) error {
	verifying := make(chan struct{}, maxVerifies)
	buf := make([]byte, 512)
	for {
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			time.Sleep(time.Millisecond) // transient; don't spin
			continue
		}
		var reply any
		switch req := strings.ToUpper(strings.TrimSpace(string(buf[:n]))); req {
		case "STAT":
			reply = h.stat()
		case "VERIFY":
			select {
			case verifying <- struct{}{}:
			default:
				continue
			}
			// Rehashing takes a while; STAT keeps being answered meanwhile.
			go func() {
				defer func() { <-verifying }()
				send(conn, from, h.verify())
			}()
			continue
		default:
			reply = map[string]string{"error": fmt.Sprintf("unknown request %q (want STAT or VERIFY)", req)}
		}
		send(conn, from, reply)
	}
}

func send(conn *net.UDPConn, to netip.AddrPort, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	// A lost reply is the client's timeout to handle.
	_, _ = conn.WriteToUDPAddrPort(b, to)
}
