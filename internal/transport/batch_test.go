package transport

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
)

// writeRecorder is a connection that keeps the size of each write.
type writeRecorder struct {
	net.Conn
	mu     sync.Mutex
	writes []int
	fail   error
}

func (w *writeRecorder) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.writes = append(w.writes, len(p))
	fail := w.fail
	w.mu.Unlock()
	if fail != nil {
		return 0, fail
	}
	return w.Conn.Write(p)
}

func (w *writeRecorder) sizes() []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]int(nil), w.writes...)
}

func TestBatchedConnGathersWhileHeld(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	rec := &writeRecorder{Conn: a}
	bc := newBatchedConn(rec)
	got := make(chan []byte, 1)
	go func() {
		data, _ := io.ReadAll(b)
		got <- data
	}()

	cases := []struct {
		name  string
		held  bool
		sizes []int // writes made through bc
		want  []int // writes that reach the connection
	}{
		{"not held: each write at once", false, []int{10, 20}, []int{10, 20}},
		{"held: gathered into one", true, []int{100, 200, 300}, []int{600}},
		{"held: a write that would overflow sends what was gathered first", true, []int{batchSize - 10, 20}, []int{batchSize - 10, 20}},
		{"held, nothing written: nothing sent", true, nil, nil},
	}
	var sent bytes.Buffer
	for _, c := range cases {
		before := len(rec.sizes())
		if c.held {
			bc.hold()
		}
		for i, n := range c.sizes {
			p := bytes.Repeat([]byte{byte(len(sent.Bytes()) + i)}, n)
			sent.Write(p)
			if m, err := bc.Write(p); m != n || err != nil {
				t.Fatalf("%s: Write = %d, %v", c.name, m, err)
			}
		}
		if c.held {
			if err := bc.release(); err != nil {
				t.Fatalf("%s: release: %v", c.name, err)
			}
		}
		if w := rec.sizes()[before:]; !slices.Equal(w, c.want) {
			t.Errorf("%s: the connection got writes of %v, want %v", c.name, w, c.want)
		}
	}
	a.Close()
	if data := <-got; !bytes.Equal(data, sent.Bytes()) {
		t.Errorf("the peer read %d bytes, not the %d written, in order", len(data), sent.Len())
	}
}

// TestBatchedConnReleaseReportsFailure: a gathered write said it was
// sent; release says it was not.
func TestBatchedConnReleaseReportsFailure(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	broken := errors.New("broken")
	bc := newBatchedConn(&writeRecorder{Conn: a, fail: broken})
	bc.hold()
	if _, err := bc.Write([]byte("record")); err != nil {
		t.Fatalf("held write: %v", err)
	}
	if err := bc.release(); !errors.Is(err, broken) {
		t.Fatalf("release = %v, want %v", err, broken)
	}
}

// TestTLSRecordsLeaveTogether: a session's write over TLS, 16 KiB per
// record, reaches the TCP connection in a few writes, not one per record,
// and arrives whole; a session's own counting sees what was written.
func TestTLSRecordsLeaveTogether(t *testing.T) {
	p := newTestPKI(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	tl := tls.NewListener(batchedListener{l}, p.sec(t, "h2").ServerConfig())
	got := make(chan []byte, 1)
	go func() {
		c, err := tl.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		data, _ := io.ReadAll(c)
		got <- data
	}()
	raw, err := dialAgent(context.Background(), l.Addr().String(), false)
	if err != nil {
		t.Fatal(err)
	}
	rec := &writeRecorder{Conn: raw}
	tc := tls.Client(newBatchedConn(rec), p.sec(t, "h1").ClientConfig("h2"))
	defer tc.Close()
	if err := tc.HandshakeContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	cc := &countingConn{Conn: tc, batch: batchUnder(tc)}
	if cc.batch == nil {
		t.Fatal("no batchedConn found under the TLS connection")
	}
	handshake := len(rec.sizes())
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if n, err := cc.Write(data); n != len(data) || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	if cc.sent.Load() != int64(len(data)) {
		t.Errorf("counted %d bytes sent, wrote %d", cc.sent.Load(), len(data))
	}
	writes := rec.sizes()[handshake:]
	// 64 records of 16 KiB; what is gathered leaves in at most batchSize.
	if max := len(data)/batchSize + 2; len(writes) > max {
		t.Errorf("1 MiB over TLS took %d writes to the connection (%v), want at most %d", len(writes), writes, max)
	}
	tc.Close()
	if back := <-got; !bytes.Equal(back, data) {
		t.Errorf("the peer read %d bytes, want the %d written", len(back), len(data))
	}
}
