package engine

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/pages"
)

// await returns at once for a stored page, waits for one on its way, and
// gives up on one the push ended without.
func TestPushedAwait(t *testing.T) {
	p := newPushed(pages.NewStore())
	p.begin(io.Discard)
	p.wait = time.Minute
	k1, k2, k3 := pages.Key{PID: 1, Addr: 0x1000}, pages.Key{PID: 1, Addr: 0x2000}, pages.Key{PID: 1, Addr: 0x3000}
	page := make([]byte, pages.PageSize)
	p.store.Put(k1, page)
	if !p.await(k1, 1) {
		t.Fatal("a stored page awaited in vain")
	}
	got := make(chan bool)
	go func() { got <- p.await(k2, 1) }()
	select {
	case <-got:
		t.Fatal("await returned before the page came")
	case <-time.After(50 * time.Millisecond):
	}
	p.store.Put(k2, page)
	p.mu.Lock()
	p.cond.Broadcast()
	p.mu.Unlock()
	if !<-got {
		t.Fatal("the page came, await said no")
	}
	go func() { got <- p.await(k3, 1) }()
	p.finish()
	if <-got {
		t.Fatal("await said yes for a page the push never brought")
	}
}

// Before the push has come, a request does not wait for it: the source
// answers. Once it has, the same request waits.
func TestPushedAwaitBeforeThePush(t *testing.T) {
	p := newPushed(pages.NewStore())
	p.wait, p.stall = time.Minute, time.Minute
	k := pages.Key{PID: 1, Addr: 0x1000}
	for _, hint := range []uint64{0, 16} {
		got := make(chan bool, 1)
		go func() { got <- p.await(k, hint) }()
		select {
		case ok := <-got:
			if ok {
				t.Fatalf("hint %d: await said yes for a page never stored", hint)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("hint %d: await waits for a push that has not begun", hint)
		}
	}
	p.begin(io.Discard)
	got := make(chan bool, 1)
	go func() { got <- p.await(k, 16) }()
	select {
	case <-got:
		t.Fatal("once the push has begun, await did not wait for its pages")
	case <-time.After(50 * time.Millisecond):
	}
	p.store.Put(k, make([]byte, pages.PageSize))
	p.mu.Lock()
	p.cond.Broadcast()
	p.mu.Unlock()
	if !<-got {
		t.Fatal("the page came, await said no")
	}
}

// A page the push has not brought within the wait is asked of the source,
// though other pages keep coming.
func TestPushedAwaitGivesUp(t *testing.T) {
	p := newPushed(pages.NewStore())
	p.begin(io.Discard)
	p.wait = 200 * time.Millisecond
	k := pages.Key{PID: 1, Addr: 0x1000}
	got := make(chan bool, 1)
	start := time.Now()
	go func() { got <- p.await(k, 1) }()
	stop := make(chan struct{})
	defer close(stop)
	go func() { // other pages keep coming
		for i := uint64(2); ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			p.store.Put(pages.Key{PID: 1, Addr: i << 12}, make([]byte, pages.PageSize))
			p.mu.Lock()
			p.cond.Broadcast()
			p.mu.Unlock()
		}
	}()
	select {
	case ok := <-got:
		if ok {
			t.Fatal("await said yes for a page never stored")
		}
		if d := time.Since(start); d < p.wait {
			t.Errorf("gave up after %v, within its wait of %v", d, p.wait)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("await still waits for a page that does not come")
	}
}

// Without a hint (stock CRIU's request), a request waits while the push
// stores pages, and gives up once it stored none for its stall time.
func TestPushedAwaitWithoutAHintFollowsThePush(t *testing.T) {
	p := newPushed(pages.NewStore())
	p.begin(io.Discard)
	p.wait, p.stall = 10*time.Millisecond, 300*time.Millisecond
	k := pages.Key{PID: 1, Addr: 0x1000}
	got := make(chan bool, 1)
	start := time.Now()
	go func() { got <- p.await(k, 0) }()
	// Pages that are not this one keep the push alive for 300 ms.
	for i := 0; i < 6; i++ {
		time.Sleep(50 * time.Millisecond)
		p.mu.Lock()
		p.progress = time.Now()
		p.cond.Broadcast()
		p.mu.Unlock()
	}
	select {
	case <-got:
		t.Fatal("await gave up on a push that was storing pages")
	default:
	}
	select {
	case ok := <-got:
		if ok {
			t.Fatal("await said yes for a page never stored")
		}
		if d := time.Since(start); d < 500*time.Millisecond {
			t.Errorf("gave up %v after the start, before the push had been quiet for its stall time", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("await still waits on a push that stalled")
	}
}

// The destination tells the source which pages its daemon waits for, on
// the push channel between the counts of pages stored; the source's reader
// passes them on and keeps counting.
func TestPushRecordsBackToTheSource(t *testing.T) {
	pr, pw := io.Pipe()
	p := newPushed(pages.NewStore())
	p.begin(pw)
	c := newCredit()
	wanted := make(chan pushNext, 4)
	go c.read(pr, func(w pushNext) { wanted <- w })
	go func() {
		_ = p.send(pushRecord{kind: recStored, n: 16})
		p.wait = time.Millisecond
		p.await(pages.Key{PID: 9, Addr: 0x7000}, 2000)
		_ = p.send(pushRecord{kind: recStored, n: 32})
	}()
	if err := c.waitFor(context.Background(), 32); err != nil {
		t.Fatal(err)
	}
	select {
	case w := <-wanted:
		if w.pid != 9 || w.start != 0x7000 || w.served != 0 || w.ahead != wantedAhead {
			t.Fatalf("wanted %+v: want pid 9 from 0x7000, %d pages ahead", w, wantedAhead)
		}
	default:
		t.Fatal("the wanted pages did not reach the source")
	}
	pw.Close()
}

// waitFor lets the sender go once enough was acknowledged, and stops it
// when the acknowledgments end or ctx does.
func TestPushCredit(t *testing.T) {
	pr, pw := io.Pipe()
	c := newCredit()
	go c.read(pr, func(pushNext) {})
	if err := c.waitFor(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.waitFor(context.Background(), 128) }()
	ack := func(n uint64) {
		b := pushRecord{kind: recStored, n: n}.encode()
		if _, err := pw.Write(b[:]); err != nil {
			t.Fatal(err)
		}
	}
	ack(64)
	select {
	case err := <-done:
		t.Fatalf("went on at 64 of 128: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	ack(128)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- c.waitFor(ctx, 1000) }()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled wait: %v", err)
	}
	go func() { done <- c.waitFor(context.Background(), 1000) }()
	pw.Close()
	if err := <-done; err == nil {
		t.Fatal("the acknowledgments ended, the wait did not")
	}
}

// The push's window holds two round trips of a 1 Gbit/s link, within its
// bounds, and the destination acknowledges well within the smallest.
func TestPushWindow(t *testing.T) {
	for _, c := range []struct {
		rtt         time.Duration
		window, ack uint64
	}{
		{0, minPushWindow, minPushWindow / 4},
		{100 * time.Microsecond, minPushWindow, minPushWindow / 4}, // a LAN: 256 KiB
		{2 * time.Millisecond, 122, 30},
		{time.Second, maxPushWindow, maxPushWindow / 4},
	} {
		w, a := pushWindow(c.rtt)
		if w != c.window || a != c.ack {
			t.Errorf("round trip %v: window %d, flush every %d; want %d, %d", c.rtt, w, a, c.window, c.ack)
		}
		if pushAckPages > w/2 {
			t.Errorf("round trip %v: acknowledgements every %d pages in a window of %d", c.rtt, pushAckPages, w)
		}
	}
}
