package lab

import (
	"github.com/ferry-migrate/ferry/internal/cgroups"
	"github.com/ferry-migrate/ferry/internal/mounts"
	"github.com/ferry-migrate/ferry/internal/procs"
	"github.com/ferry-migrate/ferry/internal/runtime"

	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ferry-migrate/ferry/internal/cnet"
	"github.com/ferry-migrate/ferry/internal/kubelab"
)

var (
	hostNSRe  = regexp.MustCompile(`^ferry-h([1-9][0-9]*)$`)
	hostDirRe = regexp.MustCompile(`^h([1-9][0-9]*)$`)
)

// leftoverIndexes lists host indexes that have a namespace or a state
// directory, whatever the state file says.
func leftoverIndexes() []int {
	var idx []int
	scan := func(dir string, re *regexp.Regexp) {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if m := re.FindStringSubmatch(e.Name()); m != nil {
				i, _ := strconv.Atoi(m[1])
				idx = append(idx, i)
			}
		}
	}
	scan(netnsDir, hostNSRe)
	scan(StateDir, hostDirRe)
	slices.Sort(idx)
	return slices.Compact(idx)
}

// Down removes the lab: agents, containers, every process left in the
// lab's namespaces, the namespaces (and with them the links), the hosts'
// cgroups and the state. It needs no state file: names are derived from
// host indexes, found on disk. Calling it again does nothing.
func Down(ctx context.Context) error {
	if os.Geteuid() != 0 {
		return errors.New("ferry lab needs root (network namespaces, cgroups, runc)")
	}
	var errs []error
	// The cluster first, while the namespaces its processes run in
	// exist: it knows its own processes, cgroups and rules (its state in
	// KubeDir), also after a crash.
	if err := kubelab.Down(KubeDir); err != nil {
		errs = append(errs, fmt.Errorf("the lab's Kubernetes: %w", err))
	}
	byIndex := map[int]*Host{}
	for i := 1; i <= MaxHosts; i++ {
		h := newHost(i)
		byIndex[i] = &h
	}
	for _, i := range leftoverIndexes() {
		if byIndex[i] == nil {
			h := newHost(i)
			byIndex[i] = &h
		}
	}
	if l, err := Load(); err == nil {
		for _, h := range l.Hosts {
			byIndex[h.Index] = &h
		}
	}
	var hosts []*Host
	for _, h := range byIndex {
		hosts = append(hosts, h)
	}
	slices.SortFunc(hosts, func(a, b *Host) int { return a.Index - b.Index })

	// Agents first, so that none starts or restores a container meanwhile.
	var pids []int
	for _, h := range hosts {
		if h.AgentPID > 0 && procs.Alive(h.AgentPID) && isAgentOf(h.AgentPID, h) {
			pids = append(pids, h.AgentPID)
		}
	}
	if err := procs.Terminate(pids, stopGrace); err != nil {
		errs = append(errs, err)
	}
	// The delay lines by their records; one whose record is lost goes
	// below with the rest of the switch's namespace.
	if err := stopDelayLines(hosts); err != nil {
		errs = append(errs, err)
	}
	for _, h := range hosts {
		if err := deleteContainers(ctx, h); err != nil {
			errs = append(errs, err)
		}
		if err := deleteOtherRuntimes(ctx, h); err != nil {
			errs = append(errs, err)
		}
	}
	// Whatever else still runs in a lab host (an agent whose PID was not
	// recorded, a page server, a test's iperf3) goes with the host.
	var names []string
	for _, h := range hosts {
		names = append(names, h.NetNSName)
	}
	names = append(names, SwitchNetNS)
	// Containers' own namespaces (service segment) go too.
	if ents, err := os.ReadDir(netnsDir); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), cnet.Prefix) {
				names = append(names, e.Name())
			}
		}
	}
	if err := procs.Terminate(processesIn(names), stopGrace); err != nil {
		errs = append(errs, err)
	}
	for _, n := range names {
		if err := delNetNS(n); err != nil {
			errs = append(errs, err)
		}
	}
	if err := removeCgroups(); err != nil {
		errs = append(errs, err)
	}
	for _, d := range []string{StateDir, RunDir, ScratchDir} {
		if err := removeAllSettled(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// deleteContainers force-deletes every container in the host's runc root.
func deleteContainers(ctx context.Context, h *Host) error {
	if _, err := os.Stat(h.RuncRoot()); err != nil {
		return nil
	}
	rc := h.Runc()
	sts, err := rc.List(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", h.Name, err)
	}
	var errs []error
	for _, st := range sts {
		if err := rc.Delete(ctx, st.ID); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", h.Name, err))
		}
	}
	return errors.Join(errs...)
}

// HostProcesses lists the live processes in the lab hosts' network
// namespaces, except this one.
func (l *Lab) HostProcesses() []int {
	var names []string
	for _, h := range l.Hosts {
		names = append(names, h.NetNSName)
	}
	return processesIn(names)
}

// processesIn lists live processes in any of the named namespaces, found
// by the namespace's inode (not by name), except this process.
func processesIn(nsNames []string) []int {
	inodes := map[string]bool{}
	for _, n := range nsNames {
		if ino, err := netnsInode(n); err == nil {
			inodes[fmt.Sprintf("net:[%d]", ino)] = true
		}
	}
	if len(inodes) == 0 {
		return nil
	}
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		link, err := os.Readlink("/proc/" + e.Name() + "/ns/net")
		if err == nil && inodes[link] && procs.Alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// removeCgroups removes the lab hosts' cgroup parents (ferry-hN) from every
// mounted hierarchy: the v1 controllers and the v2 tree, whether mounted at
// /sys/fs/cgroup/unified (hybrid) or /sys/fs/cgroup itself.
func removeCgroups() error {
	var errs []error
	for _, r := range cgroups.Hierarchies(cgroups.Root) {
		ents, _ := os.ReadDir(r)
		for _, e := range ents {
			if e.IsDir() && hostNSRe.MatchString(e.Name()) {
				if err := rmCgroupTree(filepath.Join(r, e.Name())); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}

// rmCgroupTree removes a cgroup and its children, deepest first. A cgroup
// whose last process has just died can stay busy for a moment.
func rmCgroupTree(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	var errs []error
	for _, e := range ents {
		if e.IsDir() {
			if err := rmCgroupTree(filepath.Join(dir, e.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return errors.Join(errs...)
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return errors.Join(append(errs, fmt.Errorf("remove cgroup %s: %w%s", dir, err, cgroupProcs(dir)))...)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func cgroupProcs(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil || len(strings.TrimSpace(string(b))) == 0 {
		return ""
	}
	return " (still holds pids " + strings.Join(strings.Fields(string(b)), ",") + ")"
}

// removeAllSettled removes dir, retrying briefly: a process that was just
// stopped (a runc shim, an agent's last log line) may still add an entry
// while the tree is being removed. What is left after that is reported.
func removeAllSettled(dir string) error {
	var err error
	for i := 0; i < 5; i++ {
		// A CRIU killed mid-restore leaves its cgroup yard mounted.
		if err = mounts.RemoveAll(dir); err == nil {
			return nil
		}
		time.Sleep(time.Duration(i+1) * 50 * time.Millisecond)
	}
	var left []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, e error) error {
		if len(left) < 5 && p != dir {
			left = append(left, p)
		}
		return nil
	})
	return fmt.Errorf("%w (still there: %s)", err, strings.Join(left, ", "))
}

// deleteOtherRuntimes removes the host's LXC containers, its containerd's
// and Docker's containers (and stops the daemons) and its Podman instance (containers,
// storage mounts, directory).
func deleteOtherRuntimes(ctx context.Context, h *Host) error {
	var errs []error
	// A half-removed lab: its namespace may be gone already.
	_, nsErr := os.Stat(h.NetNS)
	if ents, err := os.ReadDir(h.LXCPath()); err == nil {
		rt := h.LXC()
		if nsErr != nil {
			rt.NetNS = ""
		}
		for _, e := range ents {
			if e.IsDir() {
				errs = append(errs, rt.Remove(ctx, &runtime.Container{Name: e.Name(), ID: e.Name()}))
			}
		}
	}
	errs = append(errs, h.Containerd().Stop(ctx), h.Docker().Stop(ctx))
	if _, err := os.Stat(h.PodmanDir()); err == nil {
		ph := h.Podman()
		if nsErr != nil {
			ph.NetNS = ""
		}
		errs = append(errs, ph.Cleanup(ctx))
	}
	return errors.Join(errs...)
}
