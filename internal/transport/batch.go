package transport

import (
	"bufio"
	"crypto/tls"
	"net"
	"sync"
)

// batchSize bounds what a batchedConn gathers before it writes, and its
// read buffer.
const batchSize = 256 << 10

// batchedConn sits under TLS. TLS seals at most 16 KiB per record and
// hands each record to the connection on its own: one system call per
// record each way, which on a bulk stream costs more CPU than the
// encryption. While a session's write is under way (between hold and
// release) the records gather here and leave in one write; reads come
// through a buffer, so that one system call fetches many records.
type batchedConn struct {
	net.Conn
	r *bufio.Reader // TLS reads one goroutine at a time

	mu   sync.Mutex
	held bool
	buf  []byte
}

func newBatchedConn(c net.Conn) *batchedConn {
	return &batchedConn{Conn: c, r: bufio.NewReaderSize(c, batchSize)}
}

func (b *batchedConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// Write passes p on at once, or gathers it while held.
func (b *batchedConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.held {
		return b.Conn.Write(p)
	}
	if len(b.buf)+len(p) > batchSize {
		if err := b.flushLocked(); err != nil {
			return 0, err
		}
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// hold gathers writes until release.
func (b *batchedConn) hold() {
	b.mu.Lock()
	b.held = true
	b.mu.Unlock()
}

// release writes what was gathered and passes writes on again. A write
// gathered reported success: a failure to send it is release's.
func (b *batchedConn) release() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held = false
	return b.flushLocked()
}

func (b *batchedConn) flushLocked() error {
	if len(b.buf) == 0 {
		return nil
	}
	_, err := b.Conn.Write(b.buf)
	b.buf = b.buf[:0]
	return err
}

// batchedListener hands out its connections batched, for TLS to wrap.
type batchedListener struct{ net.Listener }

func (l batchedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return newBatchedConn(c), nil
}

// batchUnder returns the batchedConn under conn's TLS, if there is one.
func batchUnder(conn net.Conn) *batchedConn {
	if tc, ok := conn.(*tls.Conn); ok {
		b, _ := tc.NetConn().(*batchedConn)
		return b
	}
	return nil
}
