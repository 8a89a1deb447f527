package labtool

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// StreamResult is what a connection-keeping client prints when its stdin
// closes.
type StreamResult struct {
	Sent     int `json:"sent"`
	Received int `json:"received"`
	// MaxGapMs is the longest the connection went without an answer.
	MaxGapMs float64 `json:"max_gap_ms"`
	OK       bool    `json:"ok"`
	Error    string  `json:"error,omitempty"`
}

// answerWait bounds one exchange: past the longest downtime a migration
// may cause, so that a kept connection shows as a gap, not an error.
const answerWait = time.Minute

// exchanger runs the i-th exchange on one connection, which close ends.
type exchanger struct {
	exchange func(ctx context.Context, i int) error
	close    func()
}

// hold runs one exchange per interval on the connection ex holds, until
// stdin closes or an exchange fails, then prints the StreamResult: a
// migration that kept the connection shows as a gap between answers; one
// that lost it, as an error.
func hold(ctx context.Context, ex exchanger, interval time.Duration, stdin io.Reader, stdout io.Writer) error {
	defer ex.close()
	fmt.Fprintln(stdout, "connected")
	stop := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, stdin); close(stop) }()
	var res StreamResult
	last := time.Now()
	t := time.NewTicker(interval)
	defer t.Stop()
loop:
	for i := 1; i < 1<<20; i++ {
		select {
		case <-stop:
			break loop
		case <-ctx.Done():
			res.Error = ctx.Err().Error()
			break loop
		case <-t.C:
		}
		res.Sent++
		if err := ex.exchange(ctx, i); err != nil {
			res.Error = fmt.Sprintf("after %d answers: %v", res.Received, err)
			break
		}
		res.Received++
		now := time.Now()
		res.MaxGapMs = max(res.MaxGapMs, float64(now.Sub(last).Microseconds())/1000)
		last = now
	}
	res.OK = res.Error == "" && res.Received == res.Sent && res.Received > 0
	return json.NewEncoder(stdout).Encode(res)
}

// Stream numbers a line every interval to memhog's echo port at addr, on
// one connection: every answer must be the line's number.
func Stream(ctx context.Context, addr string, interval time.Duration, stdin io.Reader, stdout io.Writer) error {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	rd := bufio.NewReader(conn)
	return hold(ctx, exchanger{close: func() { conn.Close() }, exchange: func(_ context.Context, i int) error {
		_ = conn.SetDeadline(time.Now().Add(answerWait))
		if _, err := fmt.Fprintf(conn, "%d\n", i); err != nil {
			return err
		}
		line, err := rd.ReadString('\n')
		if err != nil {
			return fmt.Errorf("connection lost: %w", err)
		}
		if got := strings.TrimSpace(line); got != fmt.Sprint(i) {
			return fmt.Errorf("answer %q where %d was due", got, i)
		}
		return nil
	}}, interval, stdin, stdout)
}

// Redis sends INCR key every interval to the Redis server at addr, on one
// connection that is never re-dialed (go-redis, retries off): each reply
// must be one more than the last, nothing lost, nothing doubled.
func Redis(ctx context.Context, addr, key string, interval time.Duration, stdin io.Reader, stdout io.Writer) error {
	client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, PoolSize: 1,
		DialTimeout: 5 * time.Second, ReadTimeout: answerWait, WriteTimeout: answerWait})
	conn := client.Conn()
	closeAll := func() {
		conn.Close()
		client.Close()
	}
	if err := conn.Ping(ctx).Err(); err != nil {
		closeAll()
		return fmt.Errorf("redis at %s: %w", addr, err)
	}
	var prev int64
	return hold(ctx, exchanger{close: closeAll, exchange: func(ctx context.Context, _ int) error {
		n, err := conn.Incr(ctx, key).Result()
		var rerr redis.Error
		switch {
		case errors.As(err, &rerr):
			return fmt.Errorf("reply: %w", err)
		case err != nil:
			return fmt.Errorf("connection lost: %w", err)
		case prev != 0 && n != prev+1:
			return fmt.Errorf("counter went from %d to %d", prev, n)
		}
		prev = n
		return nil
	}}, interval, stdin, stdout)
}
