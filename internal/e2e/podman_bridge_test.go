package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/api/client"

	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/procs"
)

// pmt runs Podman's CLI on a lab host and fails the test on an error.
func pmt(t *testing.T, h *lab.Host, args ...string) string {
	t.Helper()
	out, err := pm(context.Background(), h, args...)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// TestPodmanBridgeAndVolume: a Podman container on Podman's default
// network with its probe port published and a named volume the workload
// writes into moves in each technique the host can run: memory and
// records intact, the probe answering through h2's published port,
// h2's Podman listing the container on its network and the volume, h1's
// neither; a volume of the same name at the destination refuses the move
// before anything is frozen.
func TestPodmanBridgeAndVolume(t *testing.T) {
	bin, l, h1, h2 := podmanLab(t)
	run := func(t *testing.T, name, vol string) {
		t.Helper()
		t.Cleanup(func() {
			for _, h := range []*lab.Host{h1, h2} {
				_, _ = pm(context.Background(), h, "rm", "--force", "--ignore", "--time", "0", name)
				_, _ = pm(context.Background(), h, "volume", "rm", "--force", vol)
			}
		})
		args := append([]string{"run", "--detach", "--name", name, "--publish", memhogPort + ":" + memhogPort + "/udp", "--volume", vol + ":/data",
			"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "--pull", "never", "localhost/" + podmanImage + ":latest"},
			memhogArgs("64M", "200")...)
		pmt(t, h1, append(args, "--journal", "/data/journal", "--journal-rate", "512K")...)
	}
	for _, mode := range []string{engine.ModeCold, engine.ModePrecopy, engine.ModePostcopy, engine.ModeHybrid} {
		t.Run(mode, func(t *testing.T) {
			name, vol := "pmb-"+mode, "pmb-"+mode+"-data"
			run(t, name, vol)
			p := startProbe(t, l, bin, "64M")
			rep, pr, perr := migrate(t, l, p, engine.Request{Container: name, Mode: mode, Runtime: "podman"})
			checkMoved(t, "podman", mode, rep, pr, perr)
			if len(rep.Volumes) != 1 || rep.Volumes[0].Name != vol || rep.Volumes[0].Bytes == 0 {
				t.Errorf("report's volumes: %+v", rep.Volumes)
			}
			if len(rep.Networks) != 1 || !rep.Networks[0].HostLocal || !slices.Contains(rep.Networks[0].Ports, memhogPort+"->"+memhogPort+"/udp") {
				t.Errorf("report's networks: %+v", rep.Networks)
			}
			if pr.LastAddr != h2.Addr+":"+memhogPort {
				t.Errorf("the probe last heard %s, not h2's published port", pr.LastAddr)
			}
			if got := pmt(t, h2, "inspect", "--type", "container", "--format", "{{.State.Status}} {{range $k, $v := .NetworkSettings.Networks}}{{$k}}{{end}}", name); got != "running podman" {
				t.Errorf("h2's Podman: %q, want running on its network podman", got)
			}
			if got := strings.Fields(pmt(t, h2, "volume", "ls", "--quiet")); !slices.Contains(got, vol) {
				t.Errorf("podman volume ls on h2: %v, want %s", got, vol)
			}
			if got := strings.Fields(pmt(t, h1, "volume", "ls", "--quiet")); slices.Contains(got, vol) {
				t.Errorf("podman volume ls on h1 still lists %s", vol)
			}
			if got := podmanPs(t, h1, true); len(got) != 0 {
				t.Errorf("podman ps --all on h1: %v", got)
			}
		})
	}
	// A writable bind mount of the lab's shared storage: mounted again at
	// h2, not copied, the journal memhog writes there intact.
	t.Run("shared bind mount", func(t *testing.T) {
		name, dir := "pmb-shared", filepath.Join(lab.SharedStorage, "pmb-shared")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		run(t, name, dir)
		p := startProbe(t, l, bin, "64M")
		rep, pr, perr := migrate(t, l, p, engine.Request{Container: name, Mode: engine.ModeCold, Runtime: "podman"})
		checkMoved(t, "podman", engine.ModeCold, rep, pr, perr)
		if len(rep.Volumes) != 0 || len(rep.Shared) != 1 || rep.Shared[0].Source != dir || rep.Shared[0].Path != "/data" {
			t.Errorf("report's volumes %+v, shared %+v", rep.Volumes, rep.Shared)
		}
		if st, err := os.Stat(filepath.Join(dir, "journal")); err != nil || st.Size() == 0 || st.Size()%4096 != 0 {
			t.Errorf("the journal on the shared directory: %v %v", st, err)
		}
	})
	t.Run("volume taken", func(t *testing.T) {
		name, vol := "pmb-taken", "pmb-taken-data"
		run(t, name, vol)
		pmt(t, h2, "volume", "create", vol)
		expectRefused(t, l, []refusal{
			{engine.Request{Container: name, Mode: engine.ModeCold, Runtime: "podman"}, `already has a volume named "` + vol + `"`, "destination"},
		}, func() {
			if got := pmt(t, h1, "inspect", "--type", "container", "--format", "{{.State.Status}}", name); got != "running" {
				t.Errorf("h1's copy after the refusal: %s", got)
			}
			if got := podmanPs(t, h2, true); len(got) != 0 {
				t.Errorf("h2's Podman has %v after a refusal", got)
			}
		})
	})
}

// TestPodmanSourceNeverRunsAgain: after the commit the source's copy is
// removed without running again. Podman's rm thaws a paused container
// before it kills it, and the source's copy answered a client once more,
// beside the destination's (bench migrate, pre-copy: 1 run in 3). Its
// processes' states are read every millisecond from the commit to their
// end: S (sleeping in a call, as memhog does between its ticks) is the
// copy running; a process killed while frozen only passes through R on
// its way out.
func TestPodmanSourceNeverRunsAgain(t *testing.T) {
	_, l, h1, h2 := podmanLab(t)
	for i := range 3 {
		name := fmt.Sprintf("pm-once-%d", i)
		podmanRun(t, l, name, podmanImage, memhogArgs("32M", "200"))
		pid, err := strconv.Atoi(pmt(t, h1, "inspect", "--type", "container", "--format", "{{.State.Pid}}", name))
		if err != nil {
			t.Fatal(err)
		}
		type sample struct {
			at    time.Time
			state byte
		}
		var trace []sample
		done, watched := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(watched)
			for {
				select {
				case <-done:
					return
				case <-time.After(time.Millisecond):
				}
				if c, ok := procs.State(pid); ok && (len(trace) == 0 || trace[len(trace)-1].state != c) {
					trace = append(trace, sample{time.Now(), c})
				}
			}
		}()
		rep, err := client.Migrate(context.Background(), client.Socket(h1.ControlSock), engine.Request{Container: name, To: h2.AgentAddr, Mode: engine.ModeCold, Runtime: "podman"}, nil)
		// Until its processes are gone.
		for deadline := time.Now().Add(5 * time.Second); procs.Alive(pid) && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		}
		close(done)
		<-watched
		if err != nil || !rep.OK {
			t.Fatalf("%s: %v %s", name, err, rep.Error)
		}
		var commit time.Time
		for _, ph := range rep.Phases {
			if ph.Name == "commit" {
				commit = rep.StartedAt.Add(time.Duration(ph.StartMs * float64(time.Millisecond)))
			}
		}
		var states []string
		ran := false
		for _, x := range trace {
			states = append(states, fmt.Sprintf("%c@%+dms", x.state, x.at.Sub(commit).Milliseconds()))
			ran = ran || x.at.After(commit) && x.state == 'S'
		}
		if ran {
			t.Errorf("%s: the source's copy ran after the commit: %v", name, states)
		}
		// The next one listens on the same port.
		pmt(t, h2, "rm", "--force", "--time", "0", name)
	}
}
