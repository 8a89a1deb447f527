package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/ferry-migrate/ferry/internal/pages"
	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/transport"
	"github.com/ferry-migrate/ferry/internal/units"
)

// Post-copy's push. CRIU's lazy-pages daemon pulls the memory one request
// at a time, and every fault shrinks its next background request back to
// 64 KiB: at a thousand faults a second round trips set the pull's pace,
// not the link, and the source's frozen copy stays needed that much longer.
// So once the copy runs at the destination, the source reads the frozen
// memory once and sends all of it on the push channel at link speed; the
// destination keeps it in a page store and answers the daemon's requests
// from there, waiting a little for pages on their way instead of asking
// for them again (pagestream.ServeLazyAwaiting), and telling the source
// where the daemon waits, which the push sends next (wantedAhead). Faults
// still go to the source's page server at once, and the push sends the
// pages after each fault next (pushAhead), as QEMU's post-copy moves its
// background stream to the faulted address.

// ChanPush carries post-copy's push (source -> destination): every page of
// the frozen container, in the rounds' encoding, as one round; the other
// way, pushRecords: the destination's count of pages stored, every
// pushAckPages, and the pages its daemon waits for.
const ChanPush = "push"

// The push keeps little unacknowledged: a fault's page travels the same
// connection and waits behind whatever push data is in flight, and a
// thread that faults page after page (Redis's, after its restore) waits
// that long for each. The window is what a 1 Gbit/s link carries in two
// of the session's round trips, at least 256 KiB (2 ms there; less starves
// the push on a LAN) and at most 16 MiB; the source flushes four times a
// window. And while the source answers a fault, the push waits (quiet), so the reply goes ahead of the next push data.
const (
	minPushWindow  = 64   // pages
	maxPushWindow  = 4096 // pages
	nominalLinkBps = 125_000_000
	// pushAckPages: the destination acknowledges every so many pages
	// stored, well within the smallest window (or the push would wait
	// for an acknowledgement that never comes).
	pushAckPages = minPushWindow / 4
)

var _ = [minPushWindow - 2*pushAckPages]struct{}{} // pushAckPages < minPushWindow

// pushAhead is how many pages after a fault the push sends before it
// goes on where it was.
const pushAhead = 256

// pushNext is where the push goes next: after a request the source's page
// server answered (a fault, or a background request the destination could
// not answer; the pages it sent need no push), or to pages the
// destination's lazy-pages daemon waits for.
type pushNext struct {
	pid    uint32
	start  uint64 // the first page's address
	served uint64 // pages the page server sent from start on
	ahead  uint64 // pages to push after those
}

// aheadRange is what the push sends next.
func (n pushNext) aheadRange() pages.Range {
	start := n.start + n.served*pageSize
	return pages.Range{PID: n.pid, Start: start, End: start + n.ahead*pageSize}
}

// wantedAhead is what the push sends where the daemon waits, before it
// goes on where it was: the first pages of a request are what it waits
// for (the rest follows as it asks on), and it has a few requests out at
// once.
const wantedAhead = 64

// The destination's words on the push channel, fixed records: how many
// pages it stored (the window's credit), or pages a request of its
// lazy-pages daemon waits for (the push goes there next).
const (
	recStored      = 1
	recWanted      = 2
	pushRecordSize = 24
)

type pushRecord struct {
	kind, pid uint32
	addr, n   uint64 // recStored: n pages stored; recWanted: n pages from addr
}

func (r pushRecord) encode() [pushRecordSize]byte {
	var b [pushRecordSize]byte
	binary.LittleEndian.PutUint32(b[0:], r.kind)
	binary.LittleEndian.PutUint32(b[4:], r.pid)
	binary.LittleEndian.PutUint64(b[8:], r.addr)
	binary.LittleEndian.PutUint64(b[16:], r.n)
	return b
}

func parsePushRecord(b []byte) pushRecord {
	return pushRecord{
		kind: binary.LittleEndian.Uint32(b[0:]),
		pid:  binary.LittleEndian.Uint32(b[4:]),
		addr: binary.LittleEndian.Uint64(b[8:]),
		n:    binary.LittleEndian.Uint64(b[16:]),
	}
}

// pushWindow sizes the window for a session's round trip.
func pushWindow(rtt time.Duration) (window, ack uint64) {
	w := uint64(2 * rtt.Seconds() * nominalLinkBps / pageSize)
	w = min(max(w, minPushWindow), maxPushWindow)
	return w, w / 4 // the source flushes four times a window
}

// startPush sends the frozen container's memory on the push channel until
// it is all sent or stop is called; stop returns once the push has ended.
// quiet, if set, returns once the source answers no fault.
func (m *migration) startPush(ctx context.Context, quiet func(), faults <-chan pushNext) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		err := m.push(ctx, quiet, faults)
		if err == nil {
			m.report.PushMs = units.Millis(time.Since(start)) // read once stop returned
		}
		if err != nil && ctx.Err() == nil {
			// The daemon asks the source for what did not come.
			m.log.Warn("post-copy: the push ended early", "container", m.ctr.Name, "error", err)
		}
	}()
	return func() { cancel(); <-done }
}

func (m *migration) push(ctx context.Context, quiet func(), faults <-chan pushNext) error {
	ch, err := m.sess.Open(ChanPush)
	if err != nil {
		return err
	}
	defer ch.Close()
	stop := context.AfterFunc(ctx, func() { ch.Fail(errors.New("push stopped: every page is in")) })
	defer stop()
	enc, err := pages.NewEncoder(ch, false) // memory does not compress much; the link is the limit
	if err != nil {
		return err
	}
	pids, err := pages.ContainerPIDs(m.ctr.PID)
	if err != nil {
		return err
	}
	rd, err := pages.NewReader(pids)
	if err != nil {
		return err
	}
	rtt, err := m.sess.RTT()
	if err != nil {
		return err
	}
	window, ackEvery := pushWindow(rtt)
	acked := newCredit()
	// Where the destination's daemon waits goes first: it has few
	// requests out, and its faults may wait behind them.
	wanted := make(chan pushNext, 16)
	go acked.read(ch, func(w pushNext) {
		select {
		case wanted <- w:
		default: // the push goes there in its turn
		}
	})
	resident := procs.TreeResident(m.ctr.PID) / pageSize
	m.setPushLeft(func() int64 { return max(0, resident-int64(acked.count())) })
	defer m.setPushLeft(nil) // all stored, or the daemon asks the source for the rest
	var sent uint64
	send := func(p pages.Page) error {
		if err := acked.waitFor(ctx, sent+1-window); err != nil {
			return err
		}
		if quiet != nil {
			quiet()
		}
		if err := enc.Page(p.Key, p.Data); err != nil {
			return err
		}
		sent++
		if sent%ackEvery == 0 {
			return enc.Flush() // the window counts what left
		}
		return nil
	}
	// The pages after faults go first, read by a reader of their own
	// (a page's data is the scan's buffer); the scan skips them later,
	// and the pages the page server sent itself.
	ahead, err := pages.NewReader(pids)
	if err != nil {
		return err
	}
	done := map[pages.Key]bool{}
	follow := func(f pushNext) error {
		for i := range f.served {
			done[pages.Key{PID: f.pid, Addr: f.start + i*pageSize}] = true
		}
		return ahead.ReadRange(f.aheadRange(), func(p pages.Page) error {
			if done[p.Key] {
				return nil
			}
			done[p.Key] = true
			return send(p)
		})
	}
	followFaults := func() error {
		for {
			var f pushNext
			select {
			case f = <-wanted:
			default:
				select {
				case f = <-wanted:
				case f = <-faults:
				default:
					return nil
				}
			}
			if err := follow(f); err != nil {
				return err
			}
		}
	}
	if _, err := rd.Scan(func(p pages.Page) error {
		if err := followFaults(); err != nil {
			return err
		}
		if done[p.Key] {
			return nil
		}
		return send(p)
	}); err != nil {
		return err
	}
	if err := enc.EndRound(0); err != nil {
		return err
	}
	if err := enc.Close(); err != nil {
		return err
	}
	return ch.CloseWrite()
}

// setPushLeft sets what progress reports as lazy pages pending.
func (m *migration) setPushLeft(f func() int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pushLeft = f
}

// credit is what the destination acknowledged of the push.
type credit struct {
	mu    sync.Mutex
	cond  *sync.Cond
	pages uint64
	err   error
}

func newCredit() *credit {
	c := &credit{}
	c.cond = sync.NewCond(&c.mu)
	return c
}

// read takes the destination's records until the channel ends: the
// counts, and where its daemon waits (wanted, which must not block).
func (c *credit) read(r io.Reader, wanted func(pushNext)) {
	var b [pushRecordSize]byte
	for {
		_, err := io.ReadFull(r, b[:])
		rec := parsePushRecord(b[:])
		if err == nil && rec.kind == recWanted {
			wanted(pushNext{pid: rec.pid, start: rec.addr, ahead: min(rec.n, wantedAhead)})
			continue
		}
		c.mu.Lock()
		if err != nil {
			c.err = fmt.Errorf("push acknowledgments: %w", err)
		} else if rec.kind != recStored {
			c.err = fmt.Errorf("push acknowledgments: a record of kind %d", rec.kind)
		} else if rec.n > c.pages {
			c.pages = rec.n
		}
		c.cond.Broadcast()
		err = c.err
		c.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// count is what the destination acknowledged so far.
func (c *credit) count() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pages
}

// waitFor waits until n pages (at least) were acknowledged.
func (c *credit) waitFor(ctx context.Context, n uint64) error {
	if int64(n) <= 0 {
		return nil
	}
	stop := context.AfterFunc(ctx, func() {
		c.mu.Lock()
		c.cond.Broadcast()
		c.mu.Unlock()
	})
	defer stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.pages < n {
		if c.err != nil {
			return c.err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		c.cond.Wait()
	}
	return nil
}

// pushWait is how long a background request of ferry's CRIU waits for a
// page not stored yet before the source is asked for it. The source, told
// where the daemon waits, pushes those pages next: they come within a few
// milliseconds, and a fault waits for the request only when it falls
// inside it.
const pushWait = 25 * time.Millisecond

// pushStall is how long a request of stock CRIU waits for a push that
// stores nothing before the source is asked instead. That daemon asks for
// its lowest missing pages, where the push is anyway, and reads replies in
// order: its requests wait as long as the push brings pages, but a push
// that stalls (it is not failing, so nothing ends it) must not stall the
// pull with it.
const pushStall = 5 * time.Second

// pushed is the destination's view of the push: the store it fills, and
// whether more may come.
type pushed struct {
	store *pages.Store
	mu    sync.Mutex
	cond  *sync.Cond
	done  bool
	// progress is when the push last stored a page.
	progress time.Time
	// wait, stall: pushWait and pushStall but in tests.
	wait, stall time.Duration

	// wmu orders the records sent back to the source on ch, open while
	// the push runs: the source opens it once the restore is confirmed,
	// and until then nothing is on its way.
	wmu sync.Mutex
	ch  io.Writer
}

func newPushed(store *pages.Store) *pushed {
	p := &pushed{store: store, progress: time.Now(), wait: pushWait, stall: pushStall}
	p.cond = sync.NewCond(&p.mu)
	return p
}

// begin records that the push has come on ch: records go back on it
// from now, and requests wait for its pages.
func (p *pushed) begin(ch io.Writer) {
	p.wmu.Lock()
	p.ch = ch
	p.wmu.Unlock()
}

// send writes a record to the source; one that cannot be sent is the
// channel gone, which receive hears.
func (p *pushed) send(r pushRecord) error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	if p.ch == nil {
		return nil
	}
	b := r.encode()
	_, err := p.ch.Write(b[:])
	return err
}

// receive stores the push's pages as they come, until it ends or fails.
func (p *pushed) receive(ctx context.Context, sess *transport.Session, router *transport.Router) error {
	defer p.finish()
	ch, err := router.Wait(ctx, sess, ChanPush)
	if err != nil {
		return err
	}
	defer ch.Close()
	p.begin(ch)
	defer func() {
		p.wmu.Lock()
		p.ch = nil
		p.wmu.Unlock()
	}()
	dec, err := pages.NewDecoder(ch)
	if err != nil {
		return err
	}
	var stored uint64
	for {
		_, endOfRound, err := dec.Next(p.store)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("post-copy push: %w", err)
		}
		p.mu.Lock()
		p.progress = time.Now()
		p.cond.Broadcast()
		p.mu.Unlock()
		if endOfRound {
			continue
		}
		if stored++; stored%pushAckPages == 0 {
			if err := p.send(pushRecord{kind: recStored, n: stored}); err != nil {
				return fmt.Errorf("post-copy push: %w", err)
			}
		}
	}
}

// finish wakes every waiter for good: nothing more will come.
func (p *pushed) finish() {
	p.mu.Lock()
	p.done = true
	p.cond.Broadcast()
	p.mu.Unlock()
}

// await waits until k is stored, or the push has ended, or it is better
// to ask the source (pagestream.Await). With a hint (ferry's CRIU), the
// source hears that the daemon waits for the hint pages from k on, and
// pushes them next; the wait lasts p.wait at most. Without (stock CRIU),
// it lasts while the push stores pages, up to p.stall without one.
//
// Before the push has begun (or after it ended) the source answers at once. The daemon's
// first requests come while the copy is being restored, for the lowest
// addresses (a program's data and the start of its heap, what the copy
// touches first when it runs); waiting for a push that starts only after
// the restore held the copy's first faults up behind them.
func (p *pushed) await(k pages.Key, hint uint64) bool {
	if _, ok := p.store.Hash(k); ok {
		return true
	}
	p.wmu.Lock()
	running := p.ch != nil // once it has ended, done says the same
	p.wmu.Unlock()
	if !running {
		return false
	}
	if hint > 0 {
		_ = p.send(pushRecord{kind: recWanted, pid: k.PID, addr: k.Addr, n: hint})
	}
	start := time.Now()
	wake := time.AfterFunc(p.wait, func() {
		p.mu.Lock()
		p.cond.Broadcast()
		p.mu.Unlock()
	})
	defer wake.Stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if _, ok := p.store.Hash(k); ok {
			return true
		}
		if p.done {
			return false
		}
		left := p.stall - time.Since(p.progress)
		if hint > 0 {
			left = p.wait - time.Since(start)
		}
		if left <= 0 {
			return false // the source answers this one
		}
		wake.Reset(left)
		p.cond.Wait()
	}
}
