package labtool

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/jackc/pgx/v5"
)

// serviceCase is one service the load client drives, with a way to damage
// its fill (one item gone, one changed) to show the check notices.
type serviceCase struct {
	name   string
	start  func(t *testing.T) *testServer
	damage func(t *testing.T, addr string)
}

var serviceCases = []serviceCase{
	{"redis", func(t *testing.T) *testServer { return startRedis(t) }, func(t *testing.T, addr string) {
		c := newRedisClient(addr, nil)
		defer c.Close()
		ctx := context.Background()
		if err := c.Del(ctx, fillKey(3)).Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.Set(ctx, fillKey(5), "x", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}},
	{"memcached", startMemcached, func(t *testing.T, addr string) {
		c := newMemcachedClient(addr, nil)
		defer c.Close()
		if err := c.Delete(fillKey(3)); err != nil {
			t.Fatal(err)
		}
		if err := c.Set(&memcache.Item{Key: fillKey(5), Value: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}},
	{"mqtt", startMosquitto, func(t *testing.T, addr string) {
		c, err := connectMQTTOnce(addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Disconnect(250)
		// An empty retained message clears the topic's.
		for topic, payload := range map[string]string{mqttFillTopic(3): "", mqttFillTopic(5): "x"} {
			if err := mqttWait(c.Publish(topic, 1, true, payload), 10*time.Second); err != nil {
				t.Fatal(err)
			}
		}
	}},
	{"postgres", startPostgres, func(t *testing.T, addr string) {
		c, err := pgx.Connect(context.Background(), addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		for _, q := range []string{`DELETE FROM ferry_fill WHERE id = 3`, `UPDATE ferry_fill SET payload = 'x' WHERE id = 5`} {
			if _, err := c.Exec(context.Background(), q); err != nil {
				t.Fatal(err)
			}
		}
	}},
}

// Each service, for real: filled and read back whole; a second of load
// over two connections with every promise kept; a 400 ms freeze of the
// server mid-load felt as a stall of about that, with no error and no
// reconnect; a damaged fill noticed.
func TestLoadServices(t *testing.T) {
	for _, sc := range serviceCases {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			s := sc.start(t)
			ctx := context.Background()
			if err := Fill(ctx, sc.name, s.addr, 1<<20); err != nil {
				t.Fatal(err)
			}
			ok, summary, err := CheckFill(ctx, sc.name, s.addr)
			if err != nil || !ok || !strings.Contains(summary, "256 items of 4096 bytes intact") && !strings.Contains(summary, "1024 items of 1000 bytes intact") {
				t.Fatalf("fill check: %v %q %v", ok, summary, err)
			}

			t.Run("load", func(t *testing.T) {
				r := runLoad(t, LoadOptions{Service: sc.name, Addr: s.addr, Rate: 200, Conns: 2}, func() { time.Sleep(time.Second) })
				if !r.StateOK || r.Errors != 0 || r.Reconnects != 0 || r.Ops < 100 || r.Ops > 220 || r.Sent != r.Ops {
					t.Errorf("a second at 200/s: %+v", r)
				}
				if n := len(r.Timeline); n < 9 || n > 12 || r.BucketMs != 100 {
					t.Errorf("%d buckets of %v ms for a second", n, r.BucketMs)
				}
				if !strings.Contains(r.State, "intact") {
					t.Errorf("the state check did not read the fill back: %s", r.State)
				}
			})

			t.Run("freeze", func(t *testing.T) {
				r := runLoad(t, LoadOptions{Service: sc.name, Addr: s.addr, Rate: 100, Conns: 2}, func() {
					time.Sleep(300 * time.Millisecond)
					s.freeze(400 * time.Millisecond)
					time.Sleep(300 * time.Millisecond)
				})
				if r.LongestStallMs < 350 || r.LongestStallMs >= 1500 || r.Errors != 0 || r.Reconnects != 0 || !r.StateOK {
					t.Errorf("a 400 ms freeze: %+v", r)
				}
				worst := 0.0
				for _, b := range r.Timeline {
					worst = max(worst, b.MaxMs)
				}
				if worst < 300 {
					t.Errorf("no bucket shows the freeze (worst latency %.1f ms): %+v", worst, r.Timeline)
				}
			})

			t.Run("damaged fill", func(t *testing.T) {
				sc.damage(t, s.addr)
				ok, summary, err := CheckFill(ctx, sc.name, s.addr)
				if err != nil || ok || !strings.Contains(summary, "1 of ") || !strings.Contains(summary, "missing, 1 wrong") {
					t.Errorf("one fill item deleted and one changed: %v %q %v", ok, summary, err)
				}
			})
		})
	}
}

// Postgres: the load's connections terminated by the server
// (pg_terminate_backend) cost an error and a reconnect each, and no
// acknowledged row.
func TestLoadPostgresTerminated(t *testing.T) {
	t.Parallel()
	s := startPostgres(t)
	r := runLoad(t, LoadOptions{Service: "postgres", Addr: s.addr, Rate: 100, Conns: 2}, func() {
		time.Sleep(300 * time.Millisecond)
		c, err := pgx.Connect(context.Background(), s.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		var n int
		if err := c.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE application_name = $1 AND pid <> pg_backend_pid()`, postgresAppName).Scan(&n); err != nil || n != 2 {
			t.Errorf("terminated %d connections: %v", n, err)
		}
		time.Sleep(500 * time.Millisecond)
	})
	if r.Reconnects != 2 || r.Errors < 2 || !r.StateOK {
		t.Errorf("two connections terminated: %+v", r)
	}
}

// Redis: a server killed and started again on its port (an append-only
// file synced at every write, so it keeps what it acknowledged) costs
// errors while it is down and a reconnect per connection, and no
// acknowledged write.
func TestLoadRedisRestarted(t *testing.T) {
	t.Parallel()
	s := startRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	if err := Fill(context.Background(), "redis", s.addr, 256<<10); err != nil {
		t.Fatal(err)
	}
	r := runLoad(t, LoadOptions{Service: "redis", Addr: s.addr, Rate: 100, Conns: 2}, func() {
		time.Sleep(300 * time.Millisecond)
		s.kill()
		time.Sleep(300 * time.Millisecond)
		s.start()
		time.Sleep(500 * time.Millisecond)
	})
	if r.Reconnects != 2 || r.Errors < 2 || !r.StateOK {
		t.Errorf("a restarted server: %+v", r)
	}
	down := 0
	for _, b := range r.Timeline {
		if b.Errors > 0 {
			down++
		}
	}
	if down < 2 {
		t.Errorf("errors in %d buckets for 300 ms down: %+v", down, r.Timeline)
	}
}

// The benchmark tools run beside the client and say what they saw.
func TestLoadTools(t *testing.T) {
	for _, tc := range []struct {
		name, bin string
		start     func(t *testing.T) *testServer
		want      string
	}{
		{"redis", "/usr/bin/redis-benchmark", func(t *testing.T) *testServer { return startRedis(t) }, "0 failed"},
		{"mqtt", "/usr/bin/mosquitto_pub", startMosquitto, "acknowledged"},
		{"postgres", "/usr/lib/postgresql/15/bin/pgbench", startPostgres, "0 failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			need(t, tc.bin, tc.name+" tools")
			s := tc.start(t)
			r := runLoad(t, LoadOptions{Service: tc.name, Addr: s.addr, Rate: 50, Tool: true}, func() { time.Sleep(1500 * time.Millisecond) })
			if !r.StateOK || r.Errors != 0 || !strings.Contains(r.Tool, tc.want) {
				t.Errorf("with %s: %+v", tc.bin, r)
			}
		})
	}
}

// MQTT: a broker killed and started again (without persistence, so it
// forgets the sessions) costs each client a lost connection (an error)
// and a reconnect; the publisher's client keeps its messages and sends
// them again, the subscriber's subscribes again. Messages the broker took
// while the subscriber was away are lost, as they would be: failures, and
// lost in the state. A publish the broker never acknowledged is a failure
// too, even where the client's resend was delivered after the reconnect.
// (Not parallel: it shortens the wait for them.)
func TestLoadMQTTRestarted(t *testing.T) {
	drain := mqttDrain
	mqttDrain = time.Second
	defer func() { mqttDrain = drain }()
	s := startMosquitto(t)
	r := runLoad(t, LoadOptions{Service: "mqtt", Addr: s.addr, Rate: 100}, func() {
		time.Sleep(300 * time.Millisecond)
		s.kill()
		time.Sleep(300 * time.Millisecond)
		s.start()
		time.Sleep(time.Second)
	})
	var sent, acked, delivered, lost int
	if _, err := fmt.Sscanf(r.State, "messages: %d published, %d acknowledged, %d delivered; lost %d,", &sent, &acked, &delivered, &lost); err != nil {
		t.Fatalf("state %q: %v", r.State, err)
	}
	if r.Reconnects != 2 || r.Errors != 2+(sent-acked)+lost || r.LongestStallMs < 250 || r.StateOK != (lost == 0) {
		t.Errorf("a restarted broker: %+v", r)
	}
}
