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
	addr, runName string
	rec           *recorder
	clients       []*redis.Client
	dials         []atomic.Int64 // by lane: past the first, reconnects

	mu       sync.Mutex
	acked    []int // writes answered OK, by index
	newest   atomic.Int64
	reads    atomic.Int64
	badReads atomic.Int64
}

func writeKey(run string, i int) string { return fmt.Sprintf("w:%s:%d", run, i) }

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
	w := &redisLoad{addr: o.Addr, runName: o.Run, rec: rec, dials: make([]atomic.Int64, o.Conns)}
	w.newest.Store(-1)
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
	err := w.exchange(ctx, lane, i)
	var reply redis.Error
	if err != nil && !errors.As(err, &reply) {
		w.clients[lane].Close()
		w.clients[lane] = w.laneClient(lane)
	}
	return err
}

// exchange is the request itself: lane 0 writes key i, the other lanes
// read the newest key written (PING before the first).
func (w *redisLoad) exchange(ctx context.Context, lane, i int) error {
	c := w.clients[lane]
	if lane == 0 {
		key := writeKey(w.runName, i)
		if err := c.Set(ctx, key, value(key, loadValueSize), 0).Err(); err != nil {
			return err
		}
		w.mu.Lock()
		w.acked = append(w.acked, i)
		w.mu.Unlock()
		w.newest.Store(int64(i))
		return nil
	}
	j := w.newest.Load()
	if j < 0 {
		return c.Ping(ctx).Err()
	}
	key := writeKey(w.runName, int(j))
	got, err := c.Get(ctx, key).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	w.reads.Add(1)
	if err != nil || got != string(value(key, loadValueSize)) {
		w.badReads.Add(1)
	}
	return nil
}

func (w *redisLoad) check(ctx context.Context) (bool, string, error) {
	c := newRedisClient(w.addr, nil)
	defer c.Close()
	w.mu.Lock()
	acked := append([]int(nil), w.acked...)
	w.mu.Unlock()
	keys := make([]string, len(acked))
	for n, i := range acked {
		keys[n] = writeKey(w.runName, i)
	}
	missing, wrong, err := redisCompare(ctx, c, keys, loadValueSize)
	if err != nil {
		return false, "", err
	}
	fr, err := checkFillRedisWith(ctx, c)
	if err != nil {
		return false, "", err
	}
	state := fmt.Sprintf("writes: %d acknowledged, %d missing, %d wrong; reads: %d, %d without the acknowledged value; %s",
		len(keys), missing, wrong, w.reads.Load(), w.badReads.Load(), fr)
	return missing == 0 && wrong == 0 && w.badReads.Load() == 0 && fr.ok(), state, nil
}

func (w *redisLoad) close() {
	for _, c := range w.clients {
		c.Close()
	}
}

// redisCompare reads keys (MGET, in batches) and counts those absent and
// those not holding value(key, size).
func redisCompare(ctx context.Context, c *redis.Client, keys []string, size int) (missing, wrong int, err error) {
	for len(keys) > 0 {
		batch := keys[:min(checkBatch, len(keys))]
		keys = keys[len(batch):]
		vals, err := c.MGet(ctx, batch...).Result()
		if err != nil {
			return 0, 0, err
		}
		for n, v := range vals {
			s, ok := v.(string)
			switch {
			case v == nil:
				missing++
			case !ok || s != string(value(batch[n], size)):
				wrong++
			}
		}
	}
	return missing, wrong, nil
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
	items, size, err := parseFillMarker(marker)
	if err != nil {
		return fillReport{}, err
	}
	keys := make([]string, items)
	for i := range keys {
		keys[i] = fillKey(i)
	}
	r := fillReport{Items: items, Size: size}
	r.Missing, r.Wrong, err = redisCompare(ctx, c, keys, size)
	return r, err
}
