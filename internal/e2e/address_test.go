package e2e

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/api/client"

	"github.com/ferry-migrate/ferry/internal/bench"
	"github.com/ferry-migrate/ferry/internal/cnet"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/labtool"
	"github.com/ferry-migrate/ferry/internal/probe"
	"github.com/ferry-migrate/ferry/internal/runc"
	"google.golang.org/protobuf/encoding/protowire"
)

// startClient runs a lab-tool client on host that holds one TCP connection
// (stream, redis); finish closes its stdin and returns its verdict.
func startClient(t *testing.T, h *lab.Host, bin string, args ...string) (finish func() labtool.StreamResult) {
	t.Helper()
	c, err := bench.StartStream(context.Background(), h, bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_, _ = c.Stop()
		}
	})
	return func() labtool.StreamResult {
		stopped = true
		r, err := c.Stop()
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return r
	}
}

// echoOnSegment runs memhog on h1 with an address of its own on the lab's
// L2 segment, the probe and a client on h3 holding one TCP connection to
// its echo port (a numbered line every 10 ms, each echoed back). finish
// stops both and fails t unless the connection carried on (no reconnect,
// every line answered in order) and the workload's state is intact.
func echoOnSegment(t *testing.T) (l *lab.Lab, finish func() (labtool.StreamResult, probe.Result)) {
	t.Helper()
	requireLab(t)
	bin := ferryBin(t)
	l = upLab(t, bin)
	ctx := context.Background()
	const ip = "10.79.0.10"
	if err := l.RunOnSegment(ctx, "h1", "hog", ip, nil, []string{"/bin/memhog", "--memory", "32M", "--dirty-rate", "100",
		"--port", memhogPort, "--echo-port", "7001"}); err != nil {
		t.Fatal(err)
	}
	p, _, err := bench.StartProbe(ctx, &l.Hosts[2], bin, []string{ip + ":" + memhogPort}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	stream := startClient(t, &l.Hosts[2], bin, "stream", "--addr", ip+":7001")
	time.Sleep(300 * time.Millisecond)
	return l, func() (labtool.StreamResult, probe.Result) {
		t.Helper()
		res := stream()
		pr, perr := p.Stop()
		if !res.OK {
			t.Fatalf("the TCP connection did not survive: %+v", res)
		}
		if perr != nil || !pr.StateOK {
			t.Fatalf("workload state: %+v %v", pr, perr)
		}
		return res, pr
	}
}

// TestKeepsAddressAndConnections runs memhog with an address of its own on
// the lab's L2 segment and a client on h3 holding one TCP connection to it
// (a numbered line every 10 ms, each echoed back), migrates it from h1 to
// h2, and checks the address moved with it and the connection carried on:
// no reconnect, every line answered in order.
func TestKeepsAddressAndConnections(t *testing.T) {
	for _, mode := range []string{engine.ModeCold, engine.ModePostcopy} {
		t.Run(mode, func(t *testing.T) {
			l, finish := echoOnSegment(t)
			ctx := context.Background()
			rep, err := client.Migrate(ctx, client.Socket(l.Hosts[0].ControlSock), engine.Request{Container: "hog", To: l.Hosts[1].AgentAddr, Mode: mode}, nil)
			if err != nil || !rep.OK {
				t.Fatalf("migration: %v %s", err, rep.Error)
			}
			time.Sleep(500 * time.Millisecond)
			res, pr := finish()
			// A container with a network of its own is dumped from a private
			// namespace: the lazy page server was never on the host's loopback.
			for _, w := range rep.Warnings {
				if strings.Contains(w, "page server listened on the host's loopback") {
					t.Errorf("report: %s", w)
				}
			}
			if _, err := os.Stat(cnet.Path(cnet.Name("h1", "hog"))); err == nil {
				t.Error("the source's network namespace is still there")
			}
			if _, err := os.Stat(cnet.Path(cnet.Name("h2", "hog"))); err != nil {
				t.Errorf("the destination has no network namespace for the container: %v", err)
			}
			// The client's retransmissions during the freeze were held at
			// the destination and delivered at the commit.
			if rep.HeldPackets == 0 {
				t.Error("no packet was held at the destination between the freeze and the commit")
			}
			t.Logf("%s: downtime %.0f ms; one TCP connection, %d lines echoed in order, longest wait %.0f ms; probe gap %.0f ms; %d packets held",
				mode, rep.DowntimeMs, res.Received, res.MaxGapMs, pr.ClientDowntimeMs, rep.HeldPackets)
		})
	}
}

// TestAddressComesBackWhenTheDestinationDies kills the destination's agent
// once it announced the container's address, before it answered the frozen
// source: the source must resume its copy (announcing the address again),
// and the client's connection carry on, every line answered in order.
func TestAddressComesBackWhenTheDestinationDies(t *testing.T) {
	l, finish := echoOnSegment(t)
	ctx := context.Background()
	rep, err := client.Migrate(ctx, client.Socket(l.Hosts[0].ControlSock),
		engine.Request{Container: "hog", To: l.Hosts[1].AgentAddr, Mode: engine.ModeCold, Faults: []string{"kill-destination@freeze"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || rep.SourceState != "resumed" {
		t.Fatalf("report: ok=%v source %q at %q: %s", rep.OK, rep.SourceState, rep.FailedAt, rep.Error)
	}
	time.Sleep(time.Second) // lines answered by the resumed source
	res, pr := finish()
	if err := l.RestartAgent(ctx, "h2"); err != nil {
		t.Fatal(err)
	}
	t.Logf("source resumed: %s; %d lines echoed in order, longest wait %.0f ms; probe gap %.0f ms", rep.Error, res.Received, res.MaxGapMs, pr.ClientDowntimeMs)
}

// TestRedisKeepsItsClient moves Debian's redis-server, with its address,
// while a client keeps one connection open and increments a counter every
// 10 ms: every reply must be the next number, with no reconnect.
func TestRedisKeepsItsClient(t *testing.T) {
	requireLab(t)
	const server = "/usr/bin/redis-server"
	if _, err := os.Stat(server); err != nil {
		t.Skip("redis-server is not installed (make setup installs it)")
	}
	bin := ferryBin(t)
	l := upLab(t, bin)
	ctx := context.Background()
	const ip = "10.79.0.11"
	if err := l.RunOnSegment(ctx, "h1", "redis", ip, []string{server}, []string{server, "--port", "6379",
		"--protected-mode", "no", "--save", "", "--appendonly", "no", "--daemonize", "no"}); err != nil {
		t.Fatal(err)
	}
	waitListening(t, &l.Hosts[2], bin, ip+":6379")
	finish := startClient(t, &l.Hosts[2], bin, "redis", "--addr", ip+":6379")
	time.Sleep(300 * time.Millisecond)
	rep, err := client.Migrate(ctx, client.Socket(l.Hosts[0].ControlSock), engine.Request{Container: "redis", To: l.Hosts[1].AgentAddr, Mode: engine.ModeCold}, nil)
	if err != nil || !rep.OK {
		t.Fatalf("migration: %v %s", err, rep.Error)
	}
	time.Sleep(500 * time.Millisecond)
	res := finish()
	if !res.OK {
		t.Fatalf("the Redis client's connection did not survive: %+v", res)
	}
	t.Logf("redis: downtime %.0f ms; %d INCRs on one connection, counter continuous, longest wait %.0f ms", rep.DowntimeMs, res.Received, res.MaxGapMs)
}

// TestDumpLeavesTheNetworkUnlocked checks what a dump of a container with
// a network of its own records as CRIU's network lock: none where the
// engine keeps the network quiet itself (the restore takes the method
// from the images, so neither side spends tens of milliseconds in
// iptables), CRIU's iptables lock otherwise.
func TestDumpLeavesTheNetworkUnlocked(t *testing.T) {
	requireLab(t)
	bin := ferryBin(t)
	l := upLab(t, bin)
	ctx := context.Background()
	if err := l.RunOnSegment(ctx, "h1", "quiet", "10.79.0.11", nil, []string{"/bin/memhog", "--memory", "8M", "--port", memhogPort}); err != nil {
		t.Fatal(err)
	}
	rc := l.Hosts[0].Runc()
	for _, c := range []struct {
		noLock bool
		want   uint64
	}{{true, criuNetworkLockSkip}, {false, criuNetworkLockIptables}} {
		dir := t.TempDir()
		if err := rc.Checkpoint(ctx, "quiet", runc.CheckpointOptions{ImagePath: dir, WorkPath: dir, LeaveRunning: true,
			TCPEstablished: true, NoNetworkLock: c.noLock}); err != nil {
			t.Fatal(err)
		}
		if got := inventoryLockMethod(t, dir); got != c.want {
			t.Errorf("NoNetworkLock %v: CRIU's network lock method %d, want %d", c.noLock, got, c.want)
		}
	}
}

// CRIU's enum NETWORK_LOCK_METHOD, in inventory.img's field 11.
const (
	criuNetworkLockIptables = 0
	criuNetworkLockSkip     = 2
)

// inventoryLockMethod reads the network lock method from a dump's
// inventory image: its magic, then one length-prefixed entry.
func inventoryLockMethod(t *testing.T, dir string) uint64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "inventory.img"))
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 8 {
		t.Fatalf("inventory.img of %d bytes", len(b))
	}
	n := binary.LittleEndian.Uint32(b[4:])
	entry := b[8:]
	if int(n) > len(entry) {
		t.Fatalf("inventory entry of %d bytes in %d", n, len(entry))
	}
	entry = entry[:n]
	for len(entry) > 0 {
		num, typ, l := protowire.ConsumeTag(entry)
		if l < 0 {
			t.Fatal("bad inventory entry")
		}
		entry = entry[l:]
		if num == 11 && typ == protowire.VarintType {
			v, _ := protowire.ConsumeVarint(entry)
			return v
		}
		l = protowire.ConsumeFieldValue(num, typ, entry)
		if l < 0 {
			t.Fatal("bad inventory entry")
		}
		entry = entry[l:]
	}
	return criuNetworkLockIptables // a default is not written
}
