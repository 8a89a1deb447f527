package kubelab

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/ferry-migrate/ferry/internal/cgroups"
	"github.com/ferry-migrate/ferry/internal/mounts"
)

// stopGrace is how long a component has to end after SIGTERM.
const stopGrace = 10 * time.Second

// cniResultsDir is where containerd's CNI library caches each attachment's
// result: a machine-wide directory (libcni's default; containerd has no
// setting for it).
const cniResultsDir = "/var/lib/cni/results"

// Down removes the cluster Up made in dir, reading what it made from
// dir/state.json, so that it works as well after Up failed or its caller
// crashed:
//
//   - the kubelets first (they would restart pods), then every pod's
//     processes, then containerd and the control plane: by PID, each
//     checked to be still the process Up started; then whatever is left
//     in the cluster's cgroups (containerd's shims), and those cgroups;
//   - everything mounted under dir (containers' root filesystems, pods'
//     network namespaces, volumes);
//   - in the caller's namespaces: the CNI bridges with the pods' veths,
//     the routes Up added, the kubelets' iptables chains;
//   - containerd's CNI cache entries and the kubelets' log links, which
//     live in fixed machine-wide paths;
//   - dir itself.
//
// Calling it again does nothing. A dir without state.json is removed only
// when empty (Up failed before making anything).
func Down(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("kubelab: Down: %q is not an absolute path", dir)
	}
	l := layout(filepath.Clean(dir))
	st, err := loadState(l.state())
	if errors.Is(err, errNoState) {
		if err := os.Remove(l.dir()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("kubelab: Down: %s holds no kubelab state and is not empty: left alone", dir)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("kubelab: Down: %w", err)
	}
	if os.Geteuid() != 0 {
		return errors.New("kubelab: Down needs root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	var kubelets, others []process
	for _, p := range st.Processes {
		if strings.HasPrefix(p.Name, "kubelet-") {
			kubelets = append(kubelets, p)
		} else {
			others = append(others, p)
		}
	}
	add(stopProcesses(kubelets, stopGrace))
	for _, root := range st.NodeCgroupRoots {
		add(cgroups.Destroy(cgroups.Root, root))
	}
	// One at a time, the last started first: the apiserver ends in a
	// second with etcd still there, and hangs for its whole grace when both
	// are told at once.
	slices.Reverse(others)
	for _, p := range others {
		add(stopProcesses([]process{p}, stopGrace))
	}
	if st.CgroupParent != "" && st.CgroupParent != "/" {
		add(cgroups.Destroy(cgroups.Root, st.CgroupParent))
	}
	add(mounts.UnmountUnder(l.dir()))

	for _, b := range st.Bridges {
		add(deleteBridge(b))
	}
	for _, r := range st.Routes {
		add(delRoute(r))
	}
	for _, ns := range st.KubeletNetNS {
		removeKubeletChains(ctx, ns)
	}
	add(removeCNIResults(l, st.CNINetworks))
	add(removeLogLinks(l.dir()))
	add(removeMachineDirs(st.MadeMachineDirs))

	if err := mounts.RemoveAll(l.dir()); err != nil {
		add(fmt.Errorf("remove %s: %w", l.dir(), err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("kubelab: Down %s: %w", dir, err)
	}
	return nil
}

// containerIDRE matches containerd's container and sandbox IDs.
var containerIDRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// removeCNIResults removes the cache entries (NETWORK-CONTAINERID-IFNAME)
// of the cluster's networks, and of any network (the loopback one) for a
// sandbox of the cluster's containerds, which left them when killed
// before it could tear a pod's network down.
func removeCNIResults(l layout, networks []string) error {
	ents, err := os.ReadDir(cniResultsDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	ids := sandboxIDs(l)
	var errs []error
	for _, e := range ents {
		name := e.Name()
		ours := slices.ContainsFunc(networks, func(n string) bool { return strings.HasPrefix(name, n+"-") })
		for _, part := range strings.Split(name, "-") {
			ours = ours || ids[part]
		}
		if ours {
			if err := os.Remove(filepath.Join(cniResultsDir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// sandboxIDs are the IDs of every container and sandbox the cluster's
// containerds know, found by their directories.
func sandboxIDs(l layout) map[string]bool {
	ids := map[string]bool{}
	nodes, _ := os.ReadDir(l.dir())
	for _, n := range nodes {
		nl := l.node(n.Name())
		for _, d := range []string{
			filepath.Join(nl.containerdRoot(), "io.containerd.grpc.v1.cri", "sandboxes"),
			filepath.Join(nl.containerdState(), "io.containerd.grpc.v1.cri", "sandboxes"),
			filepath.Join(nl.containerdState(), "io.containerd.runtime.v2.task", "k8s.io"),
		} {
			ents, _ := os.ReadDir(d)
			for _, e := range ents {
				if containerIDRE.MatchString(e.Name()) {
					ids[e.Name()] = true
				}
			}
		}
	}
	return ids
}

// removeLogLinks removes the kubelets' links in /var/log/containers that
// point into dir.
func removeLogLinks(dir string) error {
	ents, err := os.ReadDir(containerLogsDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		p := filepath.Join(containerLogsDir, e.Name())
		target, err := os.Readlink(p)
		if err != nil || !strings.HasPrefix(target, dir+"/") {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeMachineDirs removes the machine-wide directories the cluster's
// kubelets made, deepest first: in the device-plugin directory, what the
// kubelets left (their socket and device checkpoint); elsewhere only an
// empty directory (another cluster's kubelets may still use it).
func removeMachineDirs(made []string) error {
	var errs []error
	for _, d := range slices.Backward(made) {
		if d == devicePluginDir {
			for _, f := range []string{"kubelet.sock", "kubelet_internal_checkpoint"} {
				if err := os.Remove(filepath.Join(d, f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
					errs = append(errs, err)
				}
			}
		}
		if rest, err := os.ReadDir(d); err == nil && len(rest) == 0 {
			if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
