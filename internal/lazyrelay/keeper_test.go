package lazyrelay

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// closeCmd is a lazy-pages daemon's closing request.
func closeCmd() []byte {
	b := make([]byte, 32)
	binary.LittleEndian.PutUint32(b, 0x1023) // PS_IOV_CLOSE
	return b
}

// fakePageServer plays CRIU's lazy page server on loopback: it serves one
// connection (as CRIU does), answering each GET with reply and the close
// with its 4 bytes, and reports each request it saw and when its
// connection ended.
func fakePageServer(t *testing.T) (addr string, asked <-chan uint64, ended <-chan struct{}) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	a, e := make(chan uint64, 16), make(chan struct{})
	go func() {
		defer close(e)
		c, err := l.Accept()
		l.Close()
		if err != nil {
			return
		}
		defer c.Close()
		req := make([]byte, 32)
		for {
			if _, err := io.ReadFull(c, req); err != nil {
				return
			}
			if binary.LittleEndian.Uint32(req) == 0x1023 {
				_, _ = c.Write([]byte{0, 0, 0, 0})
				continue
			}
			vaddr := binary.LittleEndian.Uint64(req[16:])
			a <- vaddr
			if _, err := c.Write(reply(vaddr)); err != nil {
				return
			}
		}
	}()
	return l.Addr().String(), a, e
}

func startKeeper(t *testing.T, dir, addr string) (*Process, *net.UnixConn) {
	t.Helper()
	p, err := StartKeeper(os.Args[0], dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	criu, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	agent, err := Keep(dir, criu.(*net.TCPConn))
	criu.Close() // the keeper holds its own copy
	if err != nil {
		t.Fatal(err)
	}
	return p, agent
}

func ask(t *testing.T, c net.Conn, vaddr uint64) {
	t.Helper()
	if _, err := c.Write(get(vaddr)); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 32+4096)
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, reply(vaddr)) {
		t.Fatalf("reply to %#x is not the page server's", vaddr)
	}
}

// The keeper holds CRIU's connection across agents: the agent that handed
// it over dies (its connection closes, a request in flight with it), the
// page server's connection stays, the next agent asks again and is
// answered, the request already answered coming from the reply kept, not
// from CRIU a second time; CRIU's close ends the keeper, done.
func TestKeeperOutlivesTheAgent(t *testing.T) {
	addr, asked, ended := fakePageServer(t)
	dir := t.TempDir()
	p, agent := startKeeper(t, dir, addr)

	ask(t, agent, 0x1000)
	if v := <-asked; v != 0x1000 {
		t.Fatalf("page server asked for %#x", v)
	}
	// The agent asks, then dies before it reads the reply.
	if _, err := agent.Write(get(0x2000)); err != nil {
		t.Fatal(err)
	}
	<-asked
	agent.Close()
	select {
	case <-ended:
		t.Fatal("the page server's connection ended with the agent's")
	case <-time.After(200 * time.Millisecond):
	}
	if !keeperRuns(dir) {
		t.Fatal("the keeper is gone with its agent")
	}

	next, err := DialKeeper(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	ask(t, next, 0x2000) // the destination asks again for what it did not get
	select {
	case v := <-asked:
		t.Fatalf("page server asked again for %#x: the kept reply was not used", v)
	default:
	}
	ask(t, next, 0x3000)
	<-asked

	if _, err := next.Write(closeCmd()); err != nil {
		t.Fatal(err)
	}
	ans := make([]byte, 4)
	if _, err := io.ReadFull(next, ans); err != nil {
		t.Fatal(err)
	}
	// Ending well (status 0) is how a keeper says it passed CRIU's close on.
	if err := p.Wait(); err != nil {
		t.Fatalf("a keeper that passed CRIU's close on did not end well: %v", err)
	}
	within(t, ended, "CRIU's connection outlived its keeper")
}

// A keeper killed (an operator, the agent ending a dump) closes CRIU's
// connection, so CRIU ends its dump; the page server never hears a close.
func TestKeeperKilledEndsThePageServer(t *testing.T) {
	addr, asked, ended := fakePageServer(t)
	dir := t.TempDir()
	p, agent := startKeeper(t, dir, addr)
	defer agent.Close()
	ask(t, agent, 0x1000)
	<-asked
	p.Kill()
	within(t, ended, "CRIU's connection outlived its keeper")
	if p.Wait() == nil || keeperRuns(dir) {
		t.Fatal("a killed keeper says it finished, or still runs")
	}
}

// A first connection that hands over nothing is refused: the keeper ends
// (nothing to keep), rather than serving an agent with no page server.
func TestKeeperWantsCRIUsConnectionFirst(t *testing.T) {
	dir := t.TempDir()
	p, err := StartKeeper(os.Args[0], dir)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	c, err := DialKeeper(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(get(0x1000)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := waitEnd(t, p, "the keeper waits on without CRIU's connection"); err == nil {
		t.Fatal("the keeper ended well without CRIU's connection")
	}
}

// A keeper whose socket goes (its work directory cleared by a restarted
// agent that found nothing to go on with) ends, with CRIU's connection,
// without waiting out its idle time.
func TestKeeperEndsWithItsSocket(t *testing.T) {
	addr, asked, ended := fakePageServer(t)
	dir := t.TempDir()
	p, agent := startKeeper(t, dir, addr)
	ask(t, agent, 0x1000)
	<-asked
	agent.Close()
	if err := os.Remove(KeeperSocket(dir)); err != nil {
		t.Fatal(err)
	}
	waitEnd(t, p, "the keeper outlived its socket")
	within(t, ended, "CRIU's connection outlived its keeper")
}

// A keeper that never got CRIU's connection ends with its socket too.
func TestKeeperWithoutCRIUEndsWithItsSocket(t *testing.T) {
	dir := t.TempDir()
	p, err := StartKeeper(os.Args[0], dir)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	if err := os.Remove(KeeperSocket(dir)); err != nil {
		t.Fatal(err)
	}
	waitEnd(t, p, "the keeper outlived its socket")
}

// keeperRuns says whether a keeper accepts connections in dir (the one
// made to ask is, to the keeper, an agent that asks nothing).
func keeperRuns(dir string) bool {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: KeeperSocket(dir), Net: "unix"})
	if err == nil {
		c.Close()
	}
	return err == nil
}

// within fails t with why unless ch is closed within 5 s.
func within(t *testing.T, ch <-chan struct{}, why string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal(why)
	}
}

// waitEnd returns p's end (its Wait), failing t with why unless it ends
// within 5 s.
func waitEnd(t *testing.T, p *Process, why string) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- p.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal(why)
		return nil
	}
}
