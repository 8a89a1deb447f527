// Package probe talks to the memhog workload over its UDP protocol: one
// datagram request ("STAT" or "VERIFY"), one JSON datagram reply. It measures
// what a client of a migrated container sees: how long the workload stopped
// answering, and whether its state survived.
package probe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"
)

// Requests understood by memhog.
const (
	ReqStat   = "STAT"
	ReqVerify = "VERIFY"
)

// Stat is memhog's reply. VerifyOK and BadPages are only meaningful in a
// reply to VERIFY.
type Stat struct {
	Boot        string `json:"boot"`
	Counter     uint64 `json:"counter"`
	Digest      string `json:"digest"`
	Writes      uint64 `json:"writes"`
	Ready       bool   `json:"ready"`
	Pages       uint64 `json:"pages"`
	MemoryBytes uint64 `json:"memory_bytes"`
	VerifyOK    bool   `json:"verify_ok,omitempty"`
	BadPages    uint64 `json:"bad_pages,omitempty"`
	// Error is set instead of the fields above when the request was not
	// understood.
	Error string `json:"error,omitempty"`
}

// maxReply bounds a reply datagram; memhog's replies are a few hundred bytes.
const maxReply = 64 << 10

// Query sends one request to addr (host:port) and waits up to timeout (or
// until ctx ends) for the reply. Each call uses its own socket, so a late
// reply to an earlier request can never be mistaken for this one's.
func Query(ctx context.Context, addr string, req string, timeout time.Duration) (Stat, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "udp", addr)
	if err != nil {
		return Stat{}, err
	}
	defer conn.Close()
	deadline := time.Now().Add(timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	if err := conn.SetDeadline(deadline); err != nil {
		return Stat{}, err
	}
	// Unblock the read at once when ctx is cancelled.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()

	if _, err := conn.Write([]byte(req)); err != nil {
		return Stat{}, ctxErr(ctx, err)
	}
	buf := make([]byte, maxReply)
	n, err := conn.Read(buf)
	if err != nil {
		return Stat{}, ctxErr(ctx, err)
	}
	var s Stat
	if err := json.Unmarshal(buf[:n], &s); err != nil {
		return Stat{}, fmt.Errorf("bad reply from %s: %w", addr, err)
	}
	if s.Error != "" {
		return s, fmt.Errorf("%s answered %q: %s", addr, req, s.Error)
	}
	return s, nil
}

// ctxErr prefers the context's error over the deadline error it caused.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// QueryAny sends req to every address at once and returns the first reply
// and the address that gave it. The others are abandoned.
func QueryAny(ctx context.Context, addrs []string, req string, timeout time.Duration) (Stat, string, error) {
	if len(addrs) == 0 {
		return Stat{}, "", errors.New("probe: no addresses")
	}
	if len(addrs) == 1 {
		s, err := Query(ctx, addrs[0], req, timeout)
		return s, addrs[0], err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type reply struct {
		s    Stat
		addr string
		err  error
	}
	ch := make(chan reply, len(addrs))
	for _, a := range addrs {
		go func() {
			s, err := Query(ctx, a, req, timeout)
			ch <- reply{s, a, err}
		}()
	}
	var errs []error
	for range addrs {
		r := <-ch
		if r.err == nil {
			return r.s, r.addr, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", r.addr, r.err))
	}
	return Stat{}, "", errors.Join(errs...)
}

// WaitReady polls STAT on all addrs until one answers ready, for at most
// timeout.
func WaitReady(ctx context.Context, addrs []string, timeout time.Duration) (Stat, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		s, _, err := QueryAny(ctx, addrs, ReqStat, 200*time.Millisecond)
		switch {
		case err == nil && s.Ready:
			return s, nil
		case err == nil:
			last = errors.New("answering but not ready")
		default:
			last = err
		}
		select {
		case <-ctx.Done():
			return Stat{}, fmt.Errorf("probe: %v not ready within %v: %w", addrs, timeout, last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// verifyTimeout is how long one VERIFY may take: memhog rehashes its whole
// buffer, which for gigabytes under a CPU quota takes a while.
const verifyTimeout = 5 * time.Second

// Verify asks the workload to rehash its memory, trying all addrs at once and
// retrying until one answers or ctx ends (30 s if ctx has no deadline). It
// returns an error only if nobody answered; a failed check is Stat.VerifyOK ==
// false.
func Verify(ctx context.Context, addrs []string) (Stat, error) {
	s, _, err := verify(ctx, addrs)
	return s, err
}

func verify(ctx context.Context, addrs []string) (Stat, string, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	for {
		s, addr, err := QueryAny(ctx, addrs, ReqVerify, verifyTimeout)
		if err == nil {
			return s, addr, nil
		}
		select {
		case <-ctx.Done():
			return Stat{}, "", fmt.Errorf("probe: verify: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
