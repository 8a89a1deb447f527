package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"

	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/transport"
)

// CRIU's page traffic never crosses hosts on a port of its own: at the
// source, CRIU's page-server client connects to a loopback listener of the
// agent, which takes only CRIU's own connection; at the destination, CRIU's
// page server gets one end of a socketpair (--ps-socket). Between them the
// bytes ride the agent's session as a framed, checksummed channel.

type halfCloser interface {
	net.Conn
	CloseWrite() error
}

// splice copies conn<->ch in both directions until both ends finish.
func splice(conn halfCloser, ch *transport.Channel) error {
	return spliceVia(conn, ch, plainCopy, plainCopy, nil)
}

// channelError is a failure of the channel's side of a splice (the
// session), as opposed to CRIU's.
type channelError struct{ error }

func (e channelError) Unwrap() error { return e.error }

// taggedChannel marks the channel's errors as channelErrors.
type taggedChannel struct{ ch *transport.Channel }

func (t taggedChannel) Read(p []byte) (int, error) {
	n, err := t.ch.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		err = channelError{err}
	}
	return n, err
}

func (t taggedChannel) Write(p []byte) (int, error) {
	n, err := t.ch.Write(p)
	if err != nil {
		err = channelError{err}
	}
	return n, err
}

// plainCopy is a stream transform that changes nothing.
func plainCopy(dst io.Writer, src io.Reader) error {
	_, err := io.Copy(dst, src)
	return err
}

// spliceVia moves conn's bytes to ch through up and ch's bytes to conn
// through down, each side's write end closed when its stream ends, and
// returns once both directions are done. When either direction fails,
// conn is closed: CRIU, waiting for an answer that cannot come, fails
// instead of waiting forever; when the channel failed (not CRIU), broke
// (if set) runs first.
func spliceVia(conn halfCloser, ch *transport.Channel, up, down func(dst io.Writer, src io.Reader) error, broke func()) error {
	var once sync.Once
	failed := func(err error) error {
		if err != nil {
			once.Do(func() {
				var ce channelError
				if broke != nil && errors.As(err, &ce) {
					broke()
				}
				conn.Close()
			})
		}
		return err
	}
	tch := taggedChannel{ch}
	errc := make(chan error, 2)
	go func() {
		err := up(tch, conn)
		if err == nil {
			err = ch.CloseWrite()
		}
		errc <- failed(err)
	}()
	go func() {
		err := down(conn, tch)
		if err == nil {
			err = conn.CloseWrite()
		}
		errc <- failed(err)
	}()
	return errors.Join(<-errc, <-errc)
}

// loopbackTunnel accepts CRIU's page client on a loopback port and hands
// its connection to serve, which moves its bytes through a channel. Any
// local process can connect to that port: a connection that is not from a
// CRIU this agent started is closed, and the tunnel waits on. It returns
// the address for CRIU and a wait function returning serve's outcome.
func loopbackTunnel(ctx context.Context, serve func(conn halfCloser) error) (string, func() error, error) {
	l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return "", nil, err
	}
	done := make(chan error, 1)
	go func() {
		stop := context.AfterFunc(ctx, func() { l.Close() })
		defer stop()
		conn, err := acceptCRIU(l, loggerFrom(ctx))
		l.Close()
		if err != nil {
			done <- fmt.Errorf("page tunnel: CRIU never connected: %w", err)
			return
		}
		defer conn.Close()
		done <- serve(conn)
	}()
	return l.Addr().String(), func() error { return <-done }, nil
}

// acceptCRIU accepts until a connection comes from this agent's CRIU.
func acceptCRIU(l *net.TCPListener, log *slog.Logger) (*net.TCPConn, error) {
	for {
		conn, err := l.AcceptTCP()
		if err != nil {
			return nil, err
		}
		ok, err := criu.FromOwnCRIU(conn)
		if ok {
			return conn, nil
		}
		log.Warn("page tunnel: closed a connection not from this agent's CRIU", "from", conn.RemoteAddr(), "error", err)
		conn.Close()
	}
}

// pageClientTunnel is loopbackTunnel splicing to ch, with CRIU's bytes
// passed through transform when one is set.
func pageClientTunnel(ctx context.Context, ch *transport.Channel, transform func(dst io.Writer, src io.Reader) error) (string, func() error, error) {
	return loopbackTunnel(ctx, func(conn halfCloser) error {
		if transform == nil {
			return splice(conn, ch)
		}
		return spliceVia(conn, ch, transform, plainCopy, nil)
	})
}

// runPageServer runs CRIU's page server at the destination, fed from ch,
// writing pages into imagesDir. It returns when CRIU's session ends.
func runPageServer(ctx context.Context, ch *transport.Channel, imagesDir, workDir string) error {
	return criu.PageServer(ctx, imagesDir, workDir, func(conn *net.UnixConn) error { return splice(conn, ch) })
}
