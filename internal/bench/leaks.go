package bench

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/ferry-migrate/ferry/internal/cgroups"
	"github.com/ferry-migrate/ferry/internal/lab"
	"github.com/ferry-migrate/ferry/internal/lazyrelay"
	"github.com/ferry-migrate/ferry/internal/procs"
)

// leakSet is what a lab holds that a migration could leave behind, each
// thing named so that two snapshots can be compared.
type leakSet map[string]bool

// snapshot lists CRIU processes and post-copy relays, network namespaces, mounts under the
// lab's directories, the lab hosts' container cgroups and scratch
// entries, and what the other runtimes keep of a container (runtimeLeftovers).
func snapshot(l *lab.Lab) leakSet {
	s := leakSet{}
	for _, pid := range labCRIUs(l) {
		s[fmt.Sprintf("process: criu pid %d", pid)] = true
	}
	for _, pid := range labRelays(l, lazyrelay.Command) {
		s[fmt.Sprintf("process: ferry lazy-relay pid %d", pid)] = true
	}
	for _, pid := range labRelays(l, lazyrelay.KeeperCommand) {
		s[fmt.Sprintf("process: ferry page-keeper pid %d", pid)] = true
	}
	if ents, err := os.ReadDir("/var/run/netns"); err == nil {
		for _, e := range ents {
			s["netns: "+e.Name()] = true
		}
	}
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			// Podman's overlay driver bind-mounts its own storage directory
			// the first time Podman runs on a host (the agent asks it
			// whether it knows a container) and keeps it, and dockerd
			// its network namespace the first time a container joins it:
			// the daemons' own, not leaks.
			if len(fs) > 4 && (strings.HasPrefix(fs[4], lab.StateDir) || strings.HasPrefix(fs[4], lab.ScratchDir)) &&
				!strings.HasSuffix(fs[4], "/podman/storage/overlay") && !strings.HasSuffix(fs[4], "/docker/exec/netns/default") {
				s["mount: "+fs[4]] = true
			}
		}
		f.Close()
	}
	for _, h := range l.Hosts {
		// cgroup v1's controllers, the hybrid layout's v2 tree (unified),
		// and a v2-only machine's single tree ("").
		for _, ctl := range []string{"freezer", "memory", "cpu", "pids", "unified", ""} {
			ents, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup", ctl, h.CgroupParent))
			for _, e := range ents {
				if e.IsDir() {
					s["cgroup: "+filepath.Join(ctl, h.CgroupParent, e.Name())] = true
				}
			}
		}
		if ents, err := os.ReadDir(h.ScratchDir); err == nil {
			for _, e := range ents {
				s["scratch: "+filepath.Join(h.ScratchDir, e.Name())] = true
			}
		}
		// The agent's rescue directory is its own, not a migration's; a
		// record left in it is a process CRIU changed and nobody put back.
		rescue := h.RescueDir()
		delete(s, "scratch: "+rescue)
		if ents, err := os.ReadDir(rescue); err == nil {
			for _, e := range ents {
				s["CRIU rescue record: "+filepath.Join(rescue, e.Name())] = true
			}
		}
	}
	runtimeLeftovers(s, cgroups.Root, l.Hosts)
	return s
}

// runtimeLeftovers adds to s what each lab runtime keeps of a container
// outside the lab's cgroup parent and scratch (lab.Runtime's Cgroups and
// Stored: Podman's, LXC's and Docker's cgroups, their and containerd's
// storage). The machine's cgroups are shared by every lab host, so they
// are listed once.
func runtimeLeftovers(s leakSet, root string, hosts []lab.Host) {
	for _, rt := range lab.Runtimes() {
		if rt.Cgroups != nil {
			// unified: the hybrid layout's v2 tree, where CRIU puts a
			// restored copy back into the cgroup path it dumped.
			for _, ctl := range []string{"freezer", "memory", "cpu", "pids", "unified"} {
				for _, cg := range rt.Cgroups(filepath.Join(root, ctl)) {
					s["cgroup: "+filepath.Join(ctl, cg)] = true
				}
			}
		}
		if rt.Stored != nil {
			for i := range hosts {
				for _, dir := range rt.Stored(&hosts[i]) {
					s["storage: "+dir] = true
				}
			}
		}
	}
}

// since lists what s holds that before did not, sorted.
func (s leakSet) since(before leakSet) []string {
	var out []string
	for k := range s {
		if !before[k] {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// leftSince is what is here now and was not before, once the runtimes'
// stores have had a few seconds to finish removing: containerd deletes a
// removed container's snapshot directory in its next garbage collection,
// not in the call that removed it.
func leftSince(l *lab.Lab, before leakSet) []string {
	left := snapshot(l).since(before)
	for deadline := time.Now().Add(5 * time.Second); len(left) > 0 && time.Now().Before(deadline); {
		time.Sleep(250 * time.Millisecond)
		left = snapshot(l).since(before)
	}
	return left
}

// cleanLeaks removes what a case left, so the next starts clean: CRIU
// processes (by their PIDs) and scratch directories. Namespaces, mounts
// and cgroups are the lab's to remove when it goes down.
func cleanLeaks(l *lab.Lab) {
	for _, pid := range labCRIUs(l) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, h := range l.Hosts {
		ents, _ := os.ReadDir(h.ScratchDir)
		for _, e := range ents {
			if p := filepath.Join(h.ScratchDir, e.Name()); p != h.RescueDir() { // the agent's own
				_ = os.RemoveAll(p)
			}
		}
	}
}

// labRelays lists the processes of package lazyrelay running cmd (the
// destination's relay, the source's page keeper) the lab hosts' agents
// started: each should end with its pull.
func labRelays(l *lab.Lab, cmd string) []int {
	return slices.DeleteFunc(l.HostProcesses(), func(pid int) bool {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		args := strings.Split(string(b), "\x00")
		return len(args) < 2 || args[1] != cmd
	})
}

// labCRIUs lists the CRIU processes in a lab host's network namespace
// (where its agent started them): those are the lab's, and no others.
func labCRIUs(l *lab.Lab) []int {
	criu := procs.Named("criu")
	return slices.DeleteFunc(l.HostProcesses(), func(pid int) bool { return !slices.Contains(criu, pid) })
}
