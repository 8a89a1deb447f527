package stripe

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

// fastOpts detect a dead path in well under a second.
var fastOpts = Options{PathTimeout: 300 * time.Millisecond, OutageTimeout: 3 * time.Second}

// rig is a client and a server Conn over loopback TCP. Every connection the
// listener accepts (initial or re-dialed) is added to the server, as ferry's
// accept side would do after authenticating it.
type rig struct {
	t              *testing.T
	ln             net.Listener
	client, server *Conn
	fwd            []*forwarder // per initial path; nil when direct
	down           atomic.Bool  // makes Redial fail
	dials          atomic.Int64 // successful redials

	mu                   sync.Mutex
	clientRaw, serverRaw []net.Conn
	acceptDone           chan struct{}
	closeOnce            sync.Once
}

// newRig attaches n paths; path i goes through a freezable forwarder when
// forwarded(i). With redial, the client re-dials the listener directly.
func newRig(t *testing.T, opts Options, n int, forwarded func(i int) bool, redial bool) *rig {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, ln: ln, server: New(opts), acceptDone: make(chan struct{})}
	go r.accept()
	copts := opts
	if redial {
		copts.Redial = r.redial
	}
	r.client = New(copts)
	t.Cleanup(r.close)
	for i := range n {
		addr := ln.Addr().String()
		var f *forwarder
		if forwarded != nil && forwarded(i) {
			f = newForwarder(t, addr)
			addr = f.ln.Addr().String()
		}
		r.fwd = append(r.fwd, f)
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		r.mu.Lock()
		r.clientRaw = append(r.clientRaw, c)
		r.mu.Unlock()
		if err := r.client.Add(c); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

func (r *rig) accept() {
	defer close(r.acceptDone)
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.mu.Lock()
		r.serverRaw = append(r.serverRaw, c)
		r.mu.Unlock()
		r.server.Add(c)
	}
}

func (r *rig) redial(ctx context.Context) (net.Conn, error) {
	if r.down.Load() {
		return nil, errors.New("network down")
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", r.ln.Addr().String())
	if err == nil {
		r.dials.Add(1)
	}
	return c, err
}

// close tears everything down and waits for both Conns to finish.
func (r *rig) close() { r.closeOnce.Do(r.doClose) }

func (r *rig) doClose() {
	r.client.Close()
	r.server.Close()
	r.ln.Close()
	<-r.acceptDone
	for _, f := range r.fwd {
		if f != nil {
			f.close()
		}
	}
	for _, c := range []*Conn{r.client, r.server} {
		select {
		case <-c.Done():
		case <-time.After(10 * time.Second):
			r.t.Error("Conn did not finish after Close")
		}
	}
}

// rawConn returns the i-th TCP socket accepted or dialed on one side.
func (r *rig) rawConn(server bool, i int) net.Conn {
	r.mu.Lock()
	defer r.mu.Unlock()
	if server {
		return r.serverRaw[i]
	}
	return r.clientRaw[i]
}

// forwarder relays one loopback TCP hop and can freeze: it then stops
// relaying without closing anything, like a cut network path.
type forwarder struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu     sync.Mutex
	thaw   chan struct{} // non-nil while frozen; closed on unfreeze
	conns  []net.Conn
	closed bool
}

func newForwarder(t *testing.T, target string) *forwarder {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &forwarder{ln: ln, target: target}
	f.wg.Add(1)
	go f.accept()
	return f
}

func (f *forwarder) accept() {
	defer f.wg.Done()
	for {
		in, err := f.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", f.target)
		if err != nil {
			in.Close()
			continue
		}
		f.mu.Lock()
		if f.closed {
			f.mu.Unlock()
			in.Close()
			out.Close()
			return
		}
		f.conns = append(f.conns, in, out)
		f.mu.Unlock()
		f.wg.Add(2)
		go f.pump(out, in)
		go f.pump(in, out)
	}
}

func (f *forwarder) pump(dst, src net.Conn) {
	defer f.wg.Done()
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		f.mu.Lock()
		thaw := f.thaw
		f.mu.Unlock()
		if thaw != nil {
			<-thaw
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (f *forwarder) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.thaw == nil {
		f.thaw = make(chan struct{})
	}
}

func (f *forwarder) unfreeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.thaw != nil {
		close(f.thaw)
		f.thaw = nil
	}
}

func (f *forwarder) close() {
	f.ln.Close()
	f.mu.Lock()
	f.closed = true
	for _, c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.unfreeze()
	f.wg.Wait()
}

// sendRandom writes size pseudo-random bytes in pieces of random size and
// returns their hash.
func sendRandom(w io.Writer, seed uint64, size int64) ([]byte, error) {
	src := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)})
	sizes := rand.New(rand.NewPCG(seed, 1))
	h := sha256.New()
	buf := make([]byte, 256<<10)
	for size > 0 {
		p := buf[:min(int64(1+sizes.IntN(len(buf))), size)]
		src.Read(p)
		h.Write(p)
		if _, err := w.Write(p); err != nil {
			return nil, err
		}
		size -= int64(len(p))
	}
	return h.Sum(nil), nil
}

type counter struct{ n *atomic.Int64 }

func (c counter) Write(p []byte) (int, error) {
	if c.n != nil {
		c.n.Add(int64(len(p)))
	}
	return len(p), nil
}

func recvHash(r io.Reader, size int64, progress *atomic.Int64) ([]byte, error) {
	h := sha256.New()
	_, err := io.CopyN(io.MultiWriter(h, counter{progress}), r, size)
	return h.Sum(nil), err
}

// exchange sends size bytes each way at once and checks both arrive intact.
// progress (optional) counts bytes the server has received.
func exchange(t *testing.T, client, server *Conn, size int64, progress *atomic.Int64) {
	t.Helper()
	type result struct {
		name string
		sum  []byte
		err  error
	}
	res := make(chan result, 4)
	run := func(name string, f func() ([]byte, error)) {
		go func() {
			sum, err := f()
			res <- result{name, sum, err}
		}()
	}
	run("client send", func() ([]byte, error) { return sendRandom(client, 1, size) })
	run("server send", func() ([]byte, error) { return sendRandom(server, 2, size) })
	run("server recv", func() ([]byte, error) { return recvHash(server, size, progress) })
	run("client recv", func() ([]byte, error) { return recvHash(client, size, nil) })
	sums := map[string][]byte{}
	timeout := time.After(2 * time.Minute)
	for range 4 {
		select {
		case r := <-res:
			if r.err != nil {
				t.Errorf("%s: %v", r.name, r.err)
			}
			sums[r.name] = r.sum
		case <-timeout:
			client.Close() // unblocks everything
			server.Close()
			t.Fatal("transfer timed out")
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	if !bytes.Equal(sums["client send"], sums["server recv"]) {
		t.Error("client to server: data differs")
	}
	if !bytes.Equal(sums["server send"], sums["client recv"]) {
		t.Error("server to client: data differs")
	}
}

// when runs f in the background once progress reaches n.
func when(progress *atomic.Int64, n int64, f func()) (wait func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for progress.Load() < n {
			time.Sleep(time.Millisecond)
		}
		f()
	}()
	return func() { <-done }
}

// eventually polls cond for up to 10s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func alive(c *Conn) (n int) {
	for _, p := range c.Paths() {
		if p.Alive {
			n++
		}
	}
	return n
}

func TestRoundTrip(t *testing.T) {
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprintf("paths=%d", n), func(t *testing.T) {
			r := newRig(t, Options{}, n, nil, false)
			exchange(t, r.client, r.server, 64<<20, nil)
			// Every path should have carried data, not just pings. In one
			// direction at least: the sender fills the paths with room, and
			// on a loaded machine one path's writer may fall behind for a
			// whole direction (make test saw 60 bytes sent, 16 MB received).
			for i, p := range r.client.Paths() {
				if !p.Alive || p.Sent+p.Received < 64<<10 {
					t.Errorf("path %d: %+v", i, p)
				}
			}
		})
	}
}

func TestAbruptClose(t *testing.T) {
	for _, side := range []string{"client", "server"} {
		t.Run(side, func(t *testing.T) {
			r := newRig(t, fastOpts, 3, nil, false)
			var progress atomic.Int64
			wait := when(&progress, 4<<20, func() {
				c := r.rawConn(side == "server", 1).(*net.TCPConn)
				c.SetLinger(0) // RST, not FIN
				c.Close()
			})
			exchange(t, r.client, r.server, 32<<20, &progress)
			wait()
			eventually(t, "both sides to drop the path", func() bool {
				return alive(r.client) == 2 && alive(r.server) == 2
			})
		})
	}
}

func TestSilentPath(t *testing.T) {
	r := newRig(t, fastOpts, 2, func(i int) bool { return i == 1 }, true)
	var progress atomic.Int64
	wait := when(&progress, 4<<20, r.fwd[1].freeze)
	exchange(t, r.client, r.server, 32<<20, &progress)
	wait()
	frozen := r.fwd[1].ln.Addr().String()
	eventually(t, "the frozen path to be replaced", func() bool {
		ps := r.client.Paths()
		return len(ps) >= 3 && alive(r.client) == 2 && alive(r.server) == 2
	})
	for _, p := range r.client.Paths() {
		if p.Remote == frozen {
			if p.Alive || p.Err == nil {
				t.Errorf("frozen path reported %+v", p)
			}
			t.Logf("frozen path dropped: %v", p.Err)
		}
	}
	if r.dials.Load() == 0 {
		t.Error("no redial")
	}
	// The replacement works.
	exchange(t, r.client, r.server, 4<<20, nil)
}

func TestOutageRecovers(t *testing.T) {
	r := newRig(t, fastOpts, 2, func(int) bool { return true }, true)
	var progress atomic.Int64
	wait := when(&progress, 4<<20, func() {
		r.down.Store(true)
		for _, f := range r.fwd {
			f.freeze()
		}
		for alive(r.client) > 0 || alive(r.server) > 0 {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(300 * time.Millisecond) // a real outage, shorter than OutageTimeout
		r.down.Store(false)
	})
	exchange(t, r.client, r.server, 32<<20, &progress)
	wait()
	if r.dials.Load() == 0 {
		t.Error("no redial")
	}
	select {
	case <-r.client.Done():
		t.Error("client ended")
	default:
	}
}

func TestOutageFails(t *testing.T) {
	opts := fastOpts
	opts.OutageTimeout = 1500 * time.Millisecond
	r := newRig(t, opts, 2, func(int) bool { return true }, true)
	exchange(t, r.client, r.server, 1<<20, nil)
	r.down.Store(true)
	for _, f := range r.fwd {
		f.freeze()
	}
	start := time.Now()
	errs := make(chan error, 3)
	go func() { _, err := r.client.Read(make([]byte, 10)); errs <- err }()
	go func() { _, err := r.server.Read(make([]byte, 10)); errs <- err }()
	go func() {
		buf := make([]byte, 64<<10)
		for {
			if _, err := r.client.Write(buf); err != nil {
				errs <- err
				return
			}
		}
	}()
	for range 3 {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrOutage) || !strings.Contains(err.Error(), "outage") {
				t.Errorf("got %v, want an outage error", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("Read/Write still blocked")
		}
	}
	if d := time.Since(start); d < opts.OutageTimeout {
		t.Errorf("failed after %v, before the outage timeout", d)
	}
	for _, c := range []*Conn{r.client, r.server} {
		select {
		case <-c.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("Done not closed")
		}
		if !errors.Is(c.Err(), ErrOutage) {
			t.Errorf("Err() = %v", c.Err())
		}
	}
}

func TestGracefulClose(t *testing.T) {
	base := runtime.NumGoroutine()
	func() {
		r := newRig(t, Options{}, 2, nil, false)
		const size = 8 << 20
		sent := make(chan []byte, 1)
		go func() {
			sum, err := sendRandom(r.client, 3, size)
			if err != nil {
				t.Error(err)
			}
			r.client.Close() // right away: data still in flight must arrive
			sent <- sum
		}()
		data, err := io.ReadAll(r.server) // reads until io.EOF
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		if len(data) != size || !bytes.Equal(sum[:], <-sent) {
			t.Fatalf("got %d bytes, corrupt or short", len(data))
		}
		if n, err := r.server.Read(make([]byte, 1)); n != 0 || err != io.EOF { //nolint:errorlint // io.Reader's contract: io.EOF itself
			t.Errorf("Read after EOF: %d, %v", n, err)
		}
		if _, err := r.server.Write([]byte("x")); !errors.Is(err, ErrPeerClosed) {
			t.Errorf("Write after peer Close: %v", err)
		}
		if err := r.server.Close(); err != nil {
			t.Error(err)
		}
		for _, c := range []*Conn{r.client, r.server} {
			select {
			case <-c.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("Done not closed after Close")
			}
			if c.Err() != nil {
				t.Errorf("Err() = %v", c.Err())
			}
		}
		if _, err := r.client.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
			t.Errorf("Write after Close: %v", err)
		}
		r.close()
	}()
	for deadline := time.Now().Add(10 * time.Second); runtime.NumGoroutine() > base; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines left, %d before:\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
	}
}

func TestIdlePathsStayAlive(t *testing.T) {
	r := newRig(t, fastOpts, 2, nil, false)
	time.Sleep(4 * fastOpts.PathTimeout) // only PINGs flow
	for _, c := range []*Conn{r.client, r.server} {
		for _, p := range c.Paths() {
			if !p.Alive || p.Received == 0 {
				t.Errorf("idle path: %+v", p)
			}
		}
	}
}

// TestBadPeer feeds hand-made frames to a Conn: garbage condemns the path,
// overrunning the window fails the Conn.
func TestBadPeer(t *testing.T) {
	attach := func(c *Conn) net.Conn {
		a, b := net.Pipe()
		if err := c.Add(a); err != nil {
			t.Fatal(err)
		}
		go io.Copy(io.Discard, b) // swallow PINGs
		t.Cleanup(func() { b.Close() })
		return b
	}
	c := New(Options{Window: 64 << 10, ChunkSize: 32 << 10})
	defer c.Close()
	good := attach(c)
	bad := attach(c)
	bad.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	eventually(t, "the garbage path to die", func() bool { return alive(c) == 1 })
	if err := c.Paths()[1].Err; err == nil || !strings.Contains(err.Error(), "stripe:") {
		t.Errorf("path error: %v", err)
	}
	for seq := range uint64(3) { // 96 KiB unread > 64 KiB window
		good.Write(encodeFrame(frameData, seq, make([]byte, 32<<10)))
	}
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("window overrun not detected")
	}
	if err := c.Err(); err == nil || !strings.Contains(err.Error(), "window") {
		t.Errorf("Err() = %v", err)
	}
}

func TestCloseUnblocks(t *testing.T) {
	r := newRig(t, Options{Window: 64 << 10}, 1, nil, false)
	errs := make(chan error, 2)
	go func() { _, err := r.client.Read(make([]byte, 1)); errs <- err }()
	go func() { _, err := r.client.Write(make([]byte, 1<<20)); errs <- err }() // beyond the window
	time.Sleep(50 * time.Millisecond)
	r.client.Close()
	for range 2 {
		select {
		case err := <-errs:
			if !errors.Is(err, net.ErrClosed) {
				t.Errorf("got %v, want net.ErrClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Close did not unblock")
		}
	}
}

func TestDeadlines(t *testing.T) {
	r := newRig(t, Options{Window: 64 << 10}, 2, nil, false)
	r.client.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	_, err := r.client.Read(make([]byte, 1))
	if ne, ok := err.(net.Error); !ok || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) { //nolint:errorlint // net.Conn's contract: the error itself is a net.Error
		t.Fatalf("Read: got %v, want a timeout", err)
	}
	r.client.SetReadDeadline(time.Time{})
	go r.server.Write([]byte("hi"))
	buf := make([]byte, 2)
	if _, err := io.ReadFull(r.client, buf); err != nil || string(buf) != "hi" {
		t.Fatalf("Read after clearing deadline: %q, %v", buf, err)
	}

	// Nobody reads on the server, so the window fills.
	r.client.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	n, err := r.client.Write(make([]byte, 1<<20))
	if !errors.Is(err, os.ErrDeadlineExceeded) || n != 64<<10 {
		t.Fatalf("Write: %d, %v; want the window then a timeout", n, err)
	}
	r.client.SetWriteDeadline(time.Time{})
	go io.CopyN(io.Discard, r.server, 1<<20)
	if _, err := r.client.Write(make([]byte, 1<<20-n)); err != nil {
		t.Fatal(err)
	}
}

// TestYamux runs ferry's multiplexer over a Conn while a path breaks.
func TestYamux(t *testing.T) {
	r := newRig(t, fastOpts, 3, nil, true)
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	cs, err := yamux.Client(r.client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	ss, err := yamux.Server(r.server, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	go func() { // echo server
		for {
			s, err := ss.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(s, s); s.Close() }()
		}
	}()
	s, err := cs.Open()
	if err != nil {
		t.Fatal(err)
	}
	const size = 16 << 20
	var progress atomic.Int64
	wait := when(&progress, 2<<20, func() { r.rawConn(false, 0).Close() })
	sent := make(chan []byte, 1)
	go func() {
		sum, err := sendRandom(s, 4, size)
		if err != nil {
			t.Error(err)
		}
		sent <- sum
	}()
	got, err := recvHash(s, size, &progress)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, <-sent) {
		t.Fatal("echo differs")
	}
	wait()
}

// BenchmarkStripe measures one-way throughput over loopback.
func BenchmarkStripe(b *testing.B) {
	run := func(b *testing.B, w io.Writer, r io.Reader) {
		buf := make([]byte, 1<<20)
		b.SetBytes(int64(len(buf)))
		done := make(chan error, 1)
		go func() {
			_, err := io.CopyN(io.Discard, r, int64(b.N)*int64(len(buf)))
			done <- err
		}()
		b.ResetTimer()
		for range b.N {
			if _, err := w.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	b.Run("tcp", func(b *testing.B) {
		c, s := tcpPairs(b, 1)
		run(b, c[0], s[0])
	})
	for _, n := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("paths=%d", n), func(b *testing.B) {
			client, server := New(Options{}), New(Options{})
			defer client.Close()
			defer server.Close()
			c, s := tcpPairs(b, n)
			for i := range n {
				client.Add(c[i])
				server.Add(s[i])
			}
			run(b, client, server)
		})
	}
}

// tcpPairs connects n loopback TCP connections, closed at cleanup.
func tcpPairs(b *testing.B, n int) (clients, servers []net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	for range n {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			c.Close()
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close(); s.Close() })
		clients, servers = append(clients, c), append(servers, s)
	}
	return clients, servers
}
