package delayline

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strings"
	"time"
)

// A relay running as a process of its own is steered through a unix
// socket, one command a line, one reply a line:
//
//	rtt          -> the round trip now, e.g. "20ms"
//	rtt 40ms     -> "ok" once frames arriving from then on get it
//	stats        -> Stats as JSON
//
// A failed command's reply starts with "error: ".

// Serve answers control commands on a unix socket at path until ctx ends.
func (r *Relay) Serve(ctx context.Context, path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "unix", path)
	if err != nil {
		return fmt.Errorf("delay line: control socket: %w", err)
	}
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	defer os.Remove(path)
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("delay line: control socket: %w", err)
		}
		go r.answer(c)
	}
}

func (r *Relay) answer(c net.Conn) {
	defer c.Close()
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		if _, err := fmt.Fprintln(c, r.command(sc.Text())); err != nil {
			return
		}
	}
}

// command carries out one control line and is its reply.
func (r *Relay) command(line string) string {
	f := strings.Fields(line)
	switch {
	case len(f) == 1 && f[0] == "rtt":
		return r.RTT().String()
	case len(f) == 2 && f[0] == "rtt":
		d, err := time.ParseDuration(f[1])
		if err == nil {
			err = r.SetRTT(d)
		}
		if err != nil {
			return "error: " + err.Error()
		}
		return "ok"
	case len(f) == 1 && f[0] == "stats":
		b, err := json.Marshal(r.Stats())
		if err != nil {
			return "error: " + err.Error()
		}
		return string(b)
	}
	return fmt.Sprintf("error: unknown command %q (rtt [DURATION], stats)", line)
}

// ask sends one command to the relay whose control socket is at path.
func ask(path, line string) (string, error) {
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return "", fmt.Errorf("delay line at %s: %w", path, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintln(c, line); err != nil {
		return "", fmt.Errorf("delay line at %s: %w", path, err)
	}
	reply, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("delay line at %s: %w", path, err)
	}
	reply = strings.TrimSuffix(reply, "\n")
	if msg, ok := strings.CutPrefix(reply, "error: "); ok {
		return "", fmt.Errorf("delay line at %s: %s", path, msg)
	}
	return reply, nil
}

// SetRTT changes the round trip of the relay whose control socket is at
// path.
func SetRTT(path string, d time.Duration) error {
	_, err := ask(path, "rtt "+d.String())
	return err
}

// GetRTT is the round trip of the relay whose control socket is at path.
func GetRTT(path string) (time.Duration, error) {
	s, err := ask(path, "rtt")
	if err != nil {
		return 0, err
	}
	return time.ParseDuration(s)
}

// GetStats is the counts of the relay whose control socket is at path.
func GetStats(path string) (Stats, error) {
	var s Stats
	b, err := ask(path, "stats")
	if err != nil {
		return s, err
	}
	return s, json.Unmarshal([]byte(b), &s)
}

// Main runs a relay with its control socket at control (none if empty)
// until ctx ends: the process `ferry-lab lab-tool delay-line` is.
func Main(ctx context.Context, c Config, control string) error {
	r, err := New(c)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	served := make(chan error, 1)
	if control != "" {
		go func() { served <- r.Serve(ctx, control) }()
	} else {
		served <- nil
	}
	runErr := r.Run(ctx)
	cancel()
	return errors.Join(runErr, <-served)
}
