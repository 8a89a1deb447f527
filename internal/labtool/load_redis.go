package labtool

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

const (
	// fillValueSize is a redis or memcached fill key's value, and an MQTT
	// fill message's payload.
	fillValueSize = 4096
	// loadValueSize is the value of a key a load client writes.
	loadValueSize = 256
	// checkBatch is how many keys a check reads per round trip.
	checkBatch = 500
)

// redisLoad writes on its first connection (SET w:<run>:<i>) and, on the
// others, reads back the newest acknowledged write (GET): a read that
// finds another value, or none, is a broken promise.
type redisLoad struct {
	kvLoad
	addr    string
	rec     *recorder
	clients []*redis.Client
	dials   []atomic.Int64 // by lane: past the first, reconnects
}

// newRedisClient holds one connection, never retried under a command: a
// lost connection fails the command, and so does a failed dial (one
// attempt). dialed hears of every dial that succeeded.
func newRedisClient(addr string, dialed func()) *redis.Client {
	d := net.Dialer{Timeout: 5 * time.Second}
	return redis.NewClient(&redis.Options{
		Addr: addr, PoolSize: 1, MaxRetries: -1, DialerRetries: 1,
		DialTimeout: 5 * time.Second, ReadTimeout: answerWait, WriteTimeout: answerWait,
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err == nil && dialed != nil {
				dialed()
			}
			return c, err
		},
	})
}

// quietRedis drops go-redis's log lines: it logs every failed dial, which
// the load counts as errors already, on the stderr its parent reads.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

var silenceRedis sync.Once

func connectRedis(ctx context.Context, o LoadOptions, rec *recorder) (workload, error) {
	silenceRedis.Do(func() { redis.SetLogger(quietRedis{}) })
	w := &redisLoad{addr: o.Addr, rec: rec, dials: make([]atomic.Int64, o.Conns)}
	w.init(o.Run)
	for lane := range o.Conns {
		c := w.laneClient(lane)
		w.clients = append(w.clients, c)
		if err := c.Ping(ctx).Err(); err != nil {
			w.close()
			return nil, err
		}
	}
	return w, nil
}

// laneClient is a client for lane's connection, to dial at its first
// command.
func (w *redisLoad) laneClient(lane int) *redis.Client {
	return newRedisClient(w.addr, func() {
		if w.dials[lane].Add(1) > 1 {
			w.rec.reconnected()
		}
	})
}

func (w *redisLoad) run(ctx context.Context, rate float64, stop <-chan struct{}) {
	tickRequests(ctx, w.rec, len(w.clients), rate, stop, w.request)
}

// request runs lane's i-th request; when it lost the connection (any
// error but the server's reply), the lane's next request dials afresh:
// go-redis's own pool would, after a failed dial, fail fast for a second
// and probe on its own, hiding when the server came back.
func (w *redisLoad) request(ctx context.Context, lane, i int) error {
	c := w.clients[lane]
	err := w.exchange(kvConn{
		set: func(key string, v []byte) error { return c.Set(ctx, key, v, 0).Err() },
		get: func(key string) ([]byte, bool, error) {
			got, err := c.Get(ctx, key).Bytes()
			if errors.Is(err, redis.Nil) {
				return nil, false, nil
			}
			return got, err == nil, err
		},
		ping: func() error { return c.Ping(ctx).Err() },
	}, lane, i)
	var reply redis.Error
	if err != nil && !errors.As(err, &reply) {
		w.clients[lane].Close()
		w.clients[lane] = w.laneClient(lane)
	}
	return err
}

func (w *redisLoad) check(ctx context.Context) (bool, string, error) {
	c := newRedisClient(w.addr, nil)
	defer c.Close()
	keys := w.ackedKeys()
	missing, wrong, err := redisCompare(ctx, c, keys, loadValueSize)
	if err != nil {
		return false, "", err
	}
	fr, err := checkFillRedisWith(ctx, c)
	if err != nil {
		return false, "", err
	}
	ok, state := w.verdict(len(keys), missing, wrong, fr, "writes", "reads")
	return ok, state, nil
}

func (w *redisLoad) close() {
	for _, c := range w.clients {
		c.Close()
	}
}

// redisCompare reads keys (MGET, in batches) and counts those absent and
// those not holding value(key, size).
func redisCompare(ctx context.Context, c *redis.Client, keys []string, size int) (missing, wrong int, err error) {
	return compareValues(keys, size, func(batch []string) (map[string][]byte, error) {
		vals, err := c.MGet(ctx, batch...).Result()
		if err != nil {
			return nil, err
		}
		got := make(map[string][]byte, len(vals))
		for n, v := range vals {
			switch s := v.(type) {
			case nil:
			case string:
				got[batch[n]] = []byte(s)
			default:
				got[batch[n]] = []byte{} // not a string: never the value
			}
		}
		return got, nil
	})
}

func fillKey(n int) string { return "fill:" + strconv.Itoa(n) }

// fillMarkerKey holds "<items> <size>" for redis and memcached fills.
const fillMarkerKey = "fill:count"

func fillRedis(ctx context.Context, addr string, bytes int64) error {
	c := newRedisClient(addr, nil)
	defer c.Close()
	n := fillCount(bytes, fillValueSize)
	for start := 0; start < n; start += checkBatch {
		pipe := c.Pipeline()
		for i := start; i < min(start+checkBatch, n); i++ {
			pipe.Set(ctx, fillKey(i), value(fillKey(i), fillValueSize), 0)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
	}
	return c.Set(ctx, fillMarkerKey, fmt.Sprintf("%d %d", n, fillValueSize), 0).Err()
}

func checkFillRedis(ctx context.Context, addr string) (fillReport, error) {
	c := newRedisClient(addr, nil)
	defer c.Close()
	return checkFillRedisWith(ctx, c)
}

func checkFillRedisWith(ctx context.Context, c *redis.Client) (fillReport, error) {
	marker, err := c.Get(ctx, fillMarkerKey).Result()
	if errors.Is(err, redis.Nil) {
		return fillReport{}, nil
	}
	if err != nil {
		return fillReport{}, err
	}
	return checkFillKeys(marker, func(keys []string, size int) (int, int, error) { return redisCompare(ctx, c, keys, size) })
}
