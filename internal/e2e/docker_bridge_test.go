package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/api/client"

	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/lab"
)

// Docker containers as people run them: on Docker's default bridge, a
// port published, a named volume the workload writes into while it moves.

const (
	dockerWorkload = "localhost/ferry-workload:latest"
	echoPort       = "7001"
)

// dockerRunBridged starts memhog on h1's default bridge (or as extra
// says) with its UDP probe port and a TCP echo port published (where
// publish), writing records into the named volume vol at /data; the
// container and the volume are removed from both hosts when the test
// ends.
func dockerRunBridged(t *testing.T, l *lab.Lab, name, vol string, publish bool, extra ...string) {
	t.Helper()
	t.Cleanup(func() {
		for _, h := range l.Hosts[:2] {
			_ = l.RemoveFrom(context.Background(), "docker", h.Name, name)
			_, _ = dkTry(&h, "volume", "rm", "--force", vol)
		}
	})
	args := []string{"run", "-d", "--name", name, "-v", vol + ":/data"}
	if publish {
		args = append(args, "-p", memhogPort+":"+memhogPort+"/udp", "-p", echoPort+":"+echoPort)
	}
	args = append(args, extra...)
	args = append(args, dockerWorkload)
	args = append(args, memhogArgs("64M", "200")...)
	args = append(args, "--echo-port", echoPort, "--journal", "/data/journal", "--journal-rate", "512K")
	dk(t, &l.Hosts[0], args...)
}

// dkTry runs Docker's CLI against a lab host's daemon, for cleanups.
func dkTry(h *lab.Host, args ...string) (string, error) {
	out, err := dockerCmd(h, args...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// heldConnection is a client connected to the container's echo port
// through h1's published port, from h3.
func heldConnection(t *testing.T, l *lab.Lab) net.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The published port answers once the container's server listens.
	var c net.Conn
	var err error
	for {
		if c, err = l.Hosts[2].Dial(ctx, "tcp", l.Hosts[0].Addr+":"+echoPort); err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 6)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hello\n" {
		t.Fatalf("echo through h1's published port: %q %v", buf, err)
	}
	return c
}

// migrateCold moves name from h1 to h2, cold, and fails the test unless
// it committed.
func migrateCold(t *testing.T, l *lab.Lab, name string) engine.Report {
	t.Helper()
	rep, err := client.Migrate(context.Background(), client.Socket(l.Hosts[0].ControlSock), engine.Request{Container: name, To: l.Hosts[1].AgentAddr,
		Mode: engine.ModeCold, Runtime: "docker"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK {
		t.Fatalf("moving %s: %s (at %s)", name, rep.Error, rep.FailedAt)
	}
	return rep
}

// TestDockerBridgeAndVolume: a container on Docker's default bridge with
// published ports and a named volume moves in each technique: its memory
// and the volume's records intact (memhog's VERIFY reads the journal back
// from inside the container), the probe answering through h2's published
// port, h2's Docker listing the container, its bridge address and the
// volume, h1's neither, and a client connected through h1's published port
// disconnected rather than left hanging.
func TestDockerBridgeAndVolume(t *testing.T) {
	bin, l, h1, h2 := dockerLab(t)
	for _, mode := range []string{engine.ModeCold, engine.ModePrecopy, engine.ModePostcopy, engine.ModeHybrid} {
		t.Run(mode, func(t *testing.T) {
			name, vol := "dkb-"+mode, "dkb-"+mode+"-data"
			dockerRunBridged(t, l, name, vol, true)
			conn := heldConnection(t, l)
			p := startProbe(t, l, bin, "64M")
			rep, pr, perr := migrate(t, l, p, engine.Request{Container: name, Mode: mode, Runtime: "docker"})
			checkMoved(t, "docker", mode, rep, pr, perr)
			var phases []string
			for _, ph := range rep.Phases {
				phases = append(phases, fmt.Sprintf("%s %.0f-%.0f", ph.Name, ph.StartMs, ph.EndMs))
			}
			t.Logf("phases (ms): %s; the probe's gap %.0f to %.0f", strings.Join(phases, ", "),
				float64(pr.GapFrom.Sub(rep.StartedAt).Microseconds())/1000, float64(pr.GapTo.Sub(rep.StartedAt).Microseconds())/1000)

			if len(rep.Volumes) != 1 || rep.Volumes[0].Name != vol || rep.Volumes[0].Path != "/data" || rep.Volumes[0].Bytes == 0 {
				t.Errorf("report's volumes: %+v", rep.Volumes)
			}
			if len(rep.Networks) != 1 || rep.Networks[0].Name != "bridge" || !rep.Networks[0].HostLocal ||
				!slices.Contains(rep.Networks[0].Ports, memhogPort+"->"+memhogPort+"/udp") || !strings.Contains(rep.Networks[0].Outcome, "connections are closed") {
				t.Errorf("report's networks: %+v", rep.Networks)
			}
			// The probe's last answers came through h2's published port.
			if pr.LastAddr != h2.Addr+":"+memhogPort {
				t.Errorf("the probe last heard %s, not h2's published port", pr.LastAddr)
			}
			// What Docker says on each host.
			if got := dk(t, h2, "inspect", "--format", "{{.State.Status}} {{range $k, $v := .NetworkSettings.Networks}}{{$k}}={{$v.IPAddress}}{{end}}", name); !strings.HasPrefix(got, "running bridge=172.17.") {
				t.Errorf("h2's Docker: %q, want running on its bridge", got)
			}
			if got := dk(t, h2, "port", name, memhogPort+"/udp"); !strings.Contains(got, ":"+memhogPort) {
				t.Errorf("docker port on h2: %q", got)
			}
			if got := strings.Fields(dk(t, h2, "volume", "ls", "--quiet")); !slices.Contains(got, vol) {
				t.Errorf("docker volume ls on h2: %v, want %s", got, vol)
			}
			if got := strings.Fields(dk(t, h1, "volume", "ls", "--quiet")); slices.Contains(got, vol) {
				t.Errorf("docker volume ls on h1 still lists %s", vol)
			}
			if got := dockerPs(t, h1, true); slices.Contains(got, name+":running") || slices.Contains(got, name+":paused") {
				t.Errorf("docker ps on h1: %v", got)
			}
			// The volume's file, as h2 keeps it: whole records only.
			dir := dk(t, h2, "volume", "inspect", "--format", "{{.Mountpoint}}", vol)
			st, err := os.Stat(filepath.Join(dir, "journal"))
			if err != nil || st.Size() == 0 || st.Size()%4096 != 0 {
				t.Errorf("the journal on h2's volume: %v %v", st, err)
			}
			// The client of h1's published port: its connection ends, it
			// does not hang.
			connectionEnded(t, conn, "a connection through h1's published port")
			// A new client reaches the container through h2's port.
			echoes(t, &l.Hosts[2], h2.Addr+":"+echoPort, "a new client of h2's published port")
		})
	}

	// On a user-defined network both hosts have, the container keeps its
	// address where it is free at the destination, and gets another
	// where a container there holds it.
	t.Run("user network", func(t *testing.T) {
		for _, h := range []*lab.Host{h1, h2} {
			dk(t, h, "network", "create", "--driver", "bridge", "--subnet", "172.30.0.0/24", "dkb-user")
			t.Cleanup(func() { _, _ = dkTry(h, "network", "rm", "dkb-user") })
		}
		addr := func(h *lab.Host, name string) string {
			return dk(t, h, "inspect", "--format", "{{(index .NetworkSettings.Networks \"dkb-user\").IPAddress}}", name)
		}
		name := "dkb-user-kept"
		dockerRunBridged(t, l, name, name+"-data", false, "--network", "dkb-user", "--ip", "172.30.0.50")
		rep := migrateCold(t, l, name)
		if got := addr(h2, name); got != "172.30.0.50" {
			t.Errorf("address on h2: %s, want the source's 172.30.0.50 (%+v)", got, rep.Networks)
		}
		if len(rep.Networks) != 1 || rep.Networks[0].Name != "dkb-user" || rep.Networks[0].Address != "172.30.0.50" {
			t.Errorf("report's networks: %+v", rep.Networks)
		}
		// Its address is taken at h2 now: the next container that had it
		// at h1 gets another.
		other := "dkb-user-taken"
		dockerRunBridged(t, l, other, other+"-data", false, "--network", "dkb-user", "--ip", "172.30.0.50")
		migrateCold(t, l, other)
		if got := addr(h2, other); got == "172.30.0.50" || !strings.HasPrefix(got, "172.30.0.") {
			t.Errorf("address on h2 of a container whose address was taken there: %q", got)
		}
	})

	// A macvlan network on the lab's segment is one both hosts share: the
	// container keeps its address, and a client's TCP connection to it
	// carries on across the move.
	t.Run("macvlan", func(t *testing.T) {
		for _, h := range []*lab.Host{h1, h2} {
			dk(t, h, "network", "create", "--driver", "macvlan", "--subnet", lab.SegmentSubnet+"0/24", "--opt", "parent="+lab.SegmentBridge, "dkb-seg")
			t.Cleanup(func() { _, _ = dkTry(h, "network", "rm", "dkb-seg") })
		}
		for i, mode := range []string{engine.ModeCold, engine.ModePrecopy} {
			// An address of its own each: the segment's switch learned
			// the last one's MAC (Docker's, made from the address) at h2.
			ip := fmt.Sprintf("%s%d", lab.SegmentSubnet, 60+i)
			name := "dkb-seg-" + mode
			dockerRunBridged(t, l, name, name+"-data", false, "--network", "dkb-seg", "--ip", ip)
			m := moveHeld(t, l, bin, ip, engine.Request{Container: name, Mode: mode, Runtime: "docker"})
			rep, pr, perr, sr, serr := m.rep, m.pr, m.perr, m.sr, m.serr
			checkMoved(t, "docker", mode, rep, pr, perr)
			if serr != nil || !sr.OK {
				t.Errorf("%s: the client's TCP connection did not carry on: %+v %v", mode, sr, serr)
			}
			if len(rep.Networks) != 1 || rep.Networks[0].HostLocal || rep.Networks[0].Address != ip || !strings.Contains(rep.Networks[0].Outcome, "kept") {
				t.Errorf("%s: report's networks: %+v", mode, rep.Networks)
			}
			if got := dk(t, h2, "inspect", "--format", "{{(index .NetworkSettings.Networks \"dkb-seg\").IPAddress}}", name); got != ip {
				t.Errorf("%s: address on h2: %q, want %s", mode, got, ip)
			}
			t.Logf("docker macvlan %s: downtime %.0f ms, probe's gap %.0f ms, the TCP client's longest wait %.0f ms", mode, rep.DowntimeMs, pr.ClientDowntimeMs, sr.MaxGapMs)
		}
		// A restore that fails: the source's links, down since the
		// freeze, come back, and the connection carries on there.
		ip, name := lab.SegmentSubnet+"62", "dkb-seg-fails"
		dockerRunBridged(t, l, name, name+"-data", false, "--network", "dkb-seg", "--ip", ip)
		m := moveHeld(t, l, bin, ip, engine.Request{Container: name, Mode: engine.ModeCold, Runtime: "docker", Faults: []string{"restore-fails@restore"}})
		rep, sr, serr := m.rep, m.sr, m.serr
		if rep.OK || rep.SourceState != "resumed" {
			t.Errorf("failed restore: ok=%v source %q: %s", rep.OK, rep.SourceState, rep.Error)
		}
		if serr != nil || !sr.OK {
			t.Errorf("failed restore: the client's TCP connection did not carry on at the source: %+v %v", sr, serr)
		}
		if m.perr != nil || !m.pr.StateOK {
			t.Errorf("failed restore: workload state after the resume: %+v %v", m.pr, m.perr)
		}
		if got := dk(t, h1, "inspect", "--format", "{{.State.Status}}", name); got != "running" {
			t.Errorf("failed restore: h1's copy is %s", got)
		}
		t.Logf("docker macvlan, failed restore: the TCP client's longest wait %.0f ms", sr.MaxGapMs)
	})

	// A bind mount of storage both hosts have (the lab's shared directory,
	// as one network filesystem mounted on both): remounted at h2 and
	// not copied, the journal memhog writes there intact (its VERIFY
	// reads it back), the report naming it.
	t.Run("shared bind mount", func(t *testing.T) {
		name, dir := "dkb-shared", filepath.Join(lab.SharedStorage, "dkb-shared")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		dockerRunBridged(t, l, name, dir, true)
		p := startProbe(t, l, bin, "64M")
		rep, pr, perr := migrate(t, l, p, engine.Request{Container: name, Mode: engine.ModePrecopy, Runtime: "docker"})
		checkMoved(t, "docker", engine.ModePrecopy, rep, pr, perr)
		if len(rep.Volumes) != 0 || len(rep.Shared) != 1 || rep.Shared[0].Source != dir || rep.Shared[0].Path != "/data" {
			t.Errorf("report's volumes %+v, shared %+v", rep.Volumes, rep.Shared)
		}
		if got := dk(t, h2, "inspect", "--format", "{{range .Mounts}}{{.Type}} {{.Source}}{{end}}", name); got != "bind "+dir {
			t.Errorf("h2's container mounts %q, want bind %s", got, dir)
		}
		if st, err := os.Stat(filepath.Join(dir, "journal")); err != nil || st.Size() == 0 || st.Size()%4096 != 0 {
			t.Errorf("the journal on the shared directory: %v %v", st, err)
		}
	})

	t.Run("refused", func(t *testing.T) {
		name, vol := "dkb-refused", "dkb-refused-data"
		dockerRunBridged(t, l, name, vol, true)
		// A volume of that name at the destination is someone's data.
		dk(t, h2, "volume", "create", vol)
		// A user-defined network the destination lacks.
		dk(t, h1, "network", "create", "--driver", "bridge", "dkb-net")
		t.Cleanup(func() { _, _ = dkTry(h1, "network", "rm", "dkb-net") })
		other := "dkb-refused-net"
		dockerRunBridged(t, l, other, other+"-data", false, "--network", "dkb-net")
		// A bind mount of a host directory.
		bound := "dkb-refused-bind"
		t.Cleanup(func() { _ = l.RemoveFrom(context.Background(), "docker", h1.Name, bound) })
		dk(t, h1, "run", "-d", "--name", bound, "-v", t.TempDir()+":/data", dockerWorkload, "/bin/memhog", "--memory", "8M")
		// A port h2 publishes already, for another container.
		ported := "dkb-refused-port"
		t.Cleanup(func() { _ = l.RemoveFrom(context.Background(), "docker", h1.Name, ported) })
		dk(t, h1, append([]string{"run", "-d", "--name", ported, "-p", "7002:7002", dockerWorkload}, memhogArgs("8M", "0")...)...)
		t.Cleanup(func() { _ = l.RemoveFrom(context.Background(), "docker", h2.Name, "dkb-h2-port") })
		dk(t, h2, append([]string{"run", "-d", "--name", "dkb-h2-port", "-p", "7002:7002", dockerWorkload}, memhogArgs("8M", "0")...)...)
		expectRefused(t, l, []refusal{
			{engine.Request{Container: ported, Mode: engine.ModeCold, Runtime: "docker"}, "publishes port 7002/tcp already", "destination"},
			{engine.Request{Container: name, Mode: engine.ModeCold, Runtime: "docker"}, `already has a volume named "` + vol + `"`, "destination"},
			{engine.Request{Container: other, Mode: engine.ModePrecopy, Runtime: "docker"}, `has no network "dkb-net"`, "destination"},
			{engine.Request{Container: bound, Mode: engine.ModeCold, Runtime: "docker"}, "not under a directory this host allows (agent --allow-bind)", "destination"},
		}, func() {
			for _, c := range []string{name, other, bound, ported} {
				if got := dk(t, h1, "inspect", "--format", "{{.State.Status}}", c); got != "running" {
					t.Errorf("%s on h1 after the refusal: %s", c, got)
				}
			}
			if got := dockerPs(t, h2, true); !slices.Equal(got, []string{"dkb-h2-port:running"}) {
				t.Errorf("h2's Docker has %v after a refusal", got)
			}
		})
		if got := strings.Fields(dk(t, h2, "volume", "ls", "--quiet")); !slices.Equal(got, []string{vol}) {
			t.Errorf("h2's volumes after the refusals: %v, want only its own %s", got, vol)
		}
	})

	// A volume the destination's filesystem cannot hold: its volumes'
	// directory is a 16 MiB tmpfs for this case.
	t.Run("volume too big", func(t *testing.T) {
		name, vol := "dkb-big", "dkb-big-data"
		run := append([]string{"run", "-d", "--name", name, "-v", vol + ":/data", dockerWorkload}, memhogArgs("16M", "100")...)
		t.Cleanup(func() {
			for _, h := range l.Hosts[:2] {
				_ = l.RemoveFrom(context.Background(), "docker", h.Name, name)
				_, _ = dkTry(&h, "volume", "rm", "--force", vol)
			}
		})
		dk(t, h1, append(run, "--journal", "/data/journal", "--journal-fill", "64M")...)
		// Written on from there, after its first 64 MiB ("need 64M" or more).
		filled := func() (int64, error) {
			out, err := dkTry(h1, "exec", name, "stat", "-c", "%s", "/data/journal")
			if err != nil {
				return 0, err
			}
			return strconv.ParseInt(out, 10, 64)
		}
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if n, err := filled(); err == nil && n >= 64<<20 {
				break
			}
		}
		if n, err := filled(); n < 64<<20 {
			t.Fatalf("the volume's journal: %d bytes, %v", n, err)
		}
		dir := filepath.Join(h2.Docker().Dir, "data", "volumes")
		if err := unix.Mount("ferry-e2e-small", dir, "tmpfs", 0, "size=16m"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
		expectRefused(t, l, []refusal{
			{engine.Request{Container: name, Mode: engine.ModePrecopy, Runtime: "docker"}, "volumes " + vol + " need 6", "destination"},
		}, func() {
			if got := dk(t, h1, "inspect", "--format", "{{.State.Status}}", name); got != "running" {
				t.Errorf("%s on h1 after the refusal: %s", name, got)
			}
			if got := dockerPs(t, h2, true); len(got) != 0 {
				t.Errorf("h2's Docker has %v after a refusal", got)
			}
			if got := strings.Fields(dk(t, h2, "volume", "ls", "--quiet")); len(got) != 0 {
				t.Errorf("h2's Docker keeps volumes %v after a refusal", got)
			}
		})
	})

	t.Run("destination killed mid-volume-sync", func(t *testing.T) {
		name, vol := "dkb-killed", "dkb-killed-data"
		dockerRunBridged(t, l, name, vol, true)
		p := startProbe(t, l, bin, "64M")
		rep, err := client.Migrate(context.Background(), client.Socket(h1.ControlSock), engine.Request{Container: name, To: h2.AgentAddr,
			Mode: engine.ModePrecopy, Runtime: "docker", Faults: []string{"kill-destination@volume-sync"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if rep.OK || rep.FrozenMs != 0 || (rep.SourceState != "" && rep.SourceState != "resumed") {
			t.Errorf("report: ok=%v source %q frozen %.0f ms at %q: %s", rep.OK, rep.SourceState, rep.FrozenMs, rep.FailedAt, rep.Error)
		}
		if err := l.RestartAgent(context.Background(), h2.Name); err != nil {
			t.Fatal(err)
		}
		pr, perr := p.Stop()
		if perr != nil || !pr.StateOK {
			t.Fatalf("workload state after the failed move: %+v %v", pr, perr)
		}
		if got := dk(t, h1, "inspect", "--format", "{{.State.Status}}", name); got != "running" {
			t.Errorf("h1's copy: %s, want running", got)
		}
		// The restarted agent removed what its predecessor made.
		left := func() []string {
			return append(dockerPs(t, h2, true), strings.Fields(dk(t, h2, "volume", "ls", "--quiet"))...)
		}
		for deadline := time.Now().Add(30 * time.Second); len(left()) > 0 && time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		}
		if got := left(); len(got) != 0 {
			t.Errorf("h2's Docker keeps %v after its agent's restart", got)
		}
		noScratch(t, h2)
	})
}
