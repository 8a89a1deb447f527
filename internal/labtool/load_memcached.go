package labtool

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// memcachedLoad sets w:<run>:<i> on its first connection and gets the
// newest acknowledged one on the others, like redisLoad. memcached may
// evict under memory pressure: the check reports evictions beside any
// missing key, since they explain it (start memcached with -m above the
// fill and the load).
type memcachedLoad struct {
	kvLoad
	addr    string
	rec     *recorder
	clients []*memcache.Client
	// evictions is the server's count when the load began.
	evictions int64
}

// newMemcachedClient keeps one connection to addr (gomemcache dials again
// after one fails); dialed hears of every dial that succeeded.
func newMemcachedClient(addr string, dialed func()) *memcache.Client {
	c := memcache.New(addr)
	c.Timeout = answerWait
	c.MaxIdleConns = 1
	d := net.Dialer{Timeout: 5 * time.Second}
	c.DialContext = func(ctx context.Context, network, address string) (net.Conn, error) {
		conn, err := d.DialContext(ctx, network, address)
		if err == nil && dialed != nil {
			dialed()
		}
		return conn, err
	}
	return c
}

func connectMemcached(ctx context.Context, o LoadOptions, rec *recorder) (workload, error) {
	w := &memcachedLoad{addr: o.Addr, rec: rec}
	w.init(o.Run)
	ev, err := memcachedEvictions(ctx, o.Addr)
	if err != nil {
		return nil, err
	}
	w.evictions = ev
	for range o.Conns {
		var dials atomic.Int64
		c := newMemcachedClient(o.Addr, func() {
			if dials.Add(1) > 1 {
				rec.reconnected()
			}
		})
		w.clients = append(w.clients, c)
		// Ping dials the connection the requests will use.
		if err := c.Ping(); err != nil {
			w.close()
			return nil, err
		}
	}
	return w, nil
}

func (w *memcachedLoad) run(ctx context.Context, rate float64, stop <-chan struct{}) {
	tickRequests(ctx, w.rec, len(w.clients), rate, stop, w.request)
}

func (w *memcachedLoad) request(_ context.Context, lane, i int) error {
	c := w.clients[lane]
	return w.exchange(kvConn{
		set: func(key string, v []byte) error { return c.Set(&memcache.Item{Key: key, Value: v}) },
		get: func(key string) ([]byte, bool, error) {
			it, err := c.Get(key)
			if errors.Is(err, memcache.ErrCacheMiss) {
				return nil, false, nil
			}
			if err != nil {
				return nil, false, err
			}
			return it.Value, true, nil
		},
		ping: c.Ping,
	}, lane, i)
}

func (w *memcachedLoad) check(ctx context.Context) (bool, string, error) {
	c := newMemcachedClient(w.addr, nil)
	defer c.Close()
	keys := w.ackedKeys()
	missing, wrong, err := memcachedCompare(c, keys, loadValueSize)
	if err != nil {
		return false, "", err
	}
	fr, err := checkFillMemcachedWith(c)
	if err != nil {
		return false, "", err
	}
	ok, state := w.verdict(len(keys), missing, wrong, fr, "sets", "gets")
	if ev, err := memcachedEvictions(ctx, w.addr); err == nil && ev > 0 {
		state += fmt.Sprintf("; the server evicted %d items (%d during the load): give it more memory (-m)", ev, ev-w.evictions)
	}
	return ok, state, nil
}

func (w *memcachedLoad) close() {
	for _, c := range w.clients {
		c.Close()
	}
}

// memcachedCompare reads keys (GetMulti, in batches) and counts those
// absent and those not holding value(key, size).
func memcachedCompare(c *memcache.Client, keys []string, size int) (missing, wrong int, err error) {
	return compareValues(keys, size, func(batch []string) (map[string][]byte, error) {
		items, err := c.GetMulti(batch)
		if err != nil {
			return nil, err
		}
		got := make(map[string][]byte, len(items))
		for k, it := range items {
			got[k] = it.Value
		}
		return got, nil
	})
}

// memcachedEvictions reads the server's evictions counter ("stats"),
// which gomemcache does not expose.
func memcachedEvictions(ctx context.Context, addr string) (int64, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(answerWait))
	if _, err := conn.Write([]byte("stats\r\n")); err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(conn)
	var ev int64 = -1
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 1 && f[0] == "END" {
			break
		}
		if len(f) == 3 && f[0] == "STAT" && f[1] == "evictions" {
			ev, _ = strconv.ParseInt(f[2], 10, 64)
		}
	}
	if ev < 0 {
		return 0, fmt.Errorf("no evictions in the server's stats (%v)", sc.Err())
	}
	return ev, nil
}

func fillMemcached(_ context.Context, addr string, bytes int64) error {
	c := newMemcachedClient(addr, nil)
	defer c.Close()
	n := fillCount(bytes, fillValueSize)
	for i := range n {
		if err := c.Set(&memcache.Item{Key: fillKey(i), Value: value(fillKey(i), fillValueSize)}); err != nil {
			return err
		}
	}
	return c.Set(&memcache.Item{Key: fillMarkerKey, Value: fmt.Appendf(nil, "%d %d", n, fillValueSize)})
}

func checkFillMemcached(_ context.Context, addr string) (fillReport, error) {
	c := newMemcachedClient(addr, nil)
	defer c.Close()
	return checkFillMemcachedWith(c)
}

func checkFillMemcachedWith(c *memcache.Client) (fillReport, error) {
	it, err := c.Get(fillMarkerKey)
	if errors.Is(err, memcache.ErrCacheMiss) {
		return fillReport{}, nil
	}
	if err != nil {
		return fillReport{}, err
	}
	return checkFillKeys(string(it.Value), func(keys []string, size int) (int, int, error) { return memcachedCompare(c, keys, size) })
}
