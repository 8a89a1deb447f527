package labtool

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
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
	addr, runName string
	rec           *recorder
	clients       []*memcache.Client
	// evictions is the server's count when the load began.
	evictions int64

	mu       sync.Mutex
	acked    []int
	newest   atomic.Int64
	reads    atomic.Int64
	badReads atomic.Int64
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
	w := &memcachedLoad{addr: o.Addr, runName: o.Run, rec: rec}
	w.newest.Store(-1)
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
	if lane == 0 {
		key := writeKey(w.runName, i)
		if err := c.Set(&memcache.Item{Key: key, Value: value(key, loadValueSize)}); err != nil {
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
		return c.Ping()
	}
	key := writeKey(w.runName, int(j))
	it, err := c.Get(key)
	if err != nil && !errors.Is(err, memcache.ErrCacheMiss) {
		return err
	}
	w.reads.Add(1)
	if err != nil || string(it.Value) != string(value(key, loadValueSize)) {
		w.badReads.Add(1)
	}
	return nil
}

func (w *memcachedLoad) check(ctx context.Context) (bool, string, error) {
	c := newMemcachedClient(w.addr, nil)
	defer c.Close()
	w.mu.Lock()
	acked := append([]int(nil), w.acked...)
	w.mu.Unlock()
	keys := make([]string, len(acked))
	for n, i := range acked {
		keys[n] = writeKey(w.runName, i)
	}
	missing, wrong, err := memcachedCompare(c, keys, loadValueSize)
	if err != nil {
		return false, "", err
	}
	fr, err := checkFillMemcachedWith(c)
	if err != nil {
		return false, "", err
	}
	state := fmt.Sprintf("sets: %d acknowledged, %d missing, %d wrong; gets: %d, %d without the acknowledged value; %s",
		len(keys), missing, wrong, w.reads.Load(), w.badReads.Load(), fr)
	if ev, err := memcachedEvictions(ctx, w.addr); err == nil && ev > 0 {
		state += fmt.Sprintf("; the server evicted %d items (%d during the load): give it more memory (-m)", ev, ev-w.evictions)
	}
	return missing == 0 && wrong == 0 && w.badReads.Load() == 0 && fr.ok(), state, nil
}

func (w *memcachedLoad) close() {
	for _, c := range w.clients {
		c.Close()
	}
}

// memcachedCompare reads keys (GetMulti, in batches) and counts those
// absent and those not holding value(key, size).
func memcachedCompare(c *memcache.Client, keys []string, size int) (missing, wrong int, err error) {
	for len(keys) > 0 {
		batch := keys[:min(checkBatch, len(keys))]
		keys = keys[len(batch):]
		got, err := c.GetMulti(batch)
		if err != nil {
			return 0, 0, err
		}
		for _, k := range batch {
			it, ok := got[k]
			switch {
			case !ok:
				missing++
			case string(it.Value) != string(value(k, size)):
				wrong++
			}
		}
	}
	return missing, wrong, nil
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
	items, size, err := parseFillMarker(string(it.Value))
	if err != nil {
		return fillReport{}, err
	}
	keys := make([]string, items)
	for i := range keys {
		keys[i] = fillKey(i)
	}
	r := fillReport{Items: items, Size: size}
	r.Missing, r.Wrong, err = memcachedCompare(c, keys, size)
	return r, err
}
