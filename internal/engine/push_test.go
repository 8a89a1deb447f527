package engine

import (
	"context"
	"encoding/binary"
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
	p.wait = time.Minute
	k1, k2, k3 := pages.Key{PID: 1, Addr: 0x1000}, pages.Key{PID: 1, Addr: 0x2000}, pages.Key{PID: 1, Addr: 0x3000}
	page := make([]byte, pages.PageSize)
	p.store.Put(k1, page)
	if !p.await(k1) {
		t.Fatal("a stored page awaited in vain")
	}
	got := make(chan bool)
	go func() { got <- p.await(k2) }()
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
	go func() { got <- p.await(k3) }()
	p.finish()
	if <-got {
		t.Fatal("await said yes for a page the push never brought")
	}
}

// A page the push has not brought within the wait is asked of the source,
// though other pages keep coming.
func TestPushedAwaitGivesUpAfterItsWait(t *testing.T) {
	p := newPushed(pages.NewStore())
	p.wait = 200 * time.Millisecond
	k := pages.Key{PID: 1, Addr: 0x1000}
	got := make(chan bool, 1)
	start := time.Now()
	go func() { got <- p.await(k) }()
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
			t.Errorf("gave up %v after the start, within its wait of %v", d, p.wait)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("await still waits for a page that does not come")
	}
}

// waitFor lets the sender go once enough was acknowledged, and stops it
// when the acknowledgments end or ctx does.
func TestPushCredit(t *testing.T) {
	pr, pw := io.Pipe()
	c := newCredit()
	go c.read(pr)
	if err := c.waitFor(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.waitFor(context.Background(), 128) }()
	ack := func(n uint64) {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], n)
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
