package kubernetes

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/ferry-migrate/ferry/internal/cnet"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/shareddir"
)

func withNamespace(ctx context.Context, ns string) context.Context {
	return namespaces.WithNamespace(ctx, ns)
}

// emptyDirPlugin is the kubelet's directory of a pod's emptyDir volumes.
const emptyDirPlugin = "kubernetes.io~empty-dir"

// madeByKubelet are the volume plugins whose contents the replacement
// pod's kubelet makes again from the API (nothing of them moves).
var madeByKubelet = map[string]bool{
	"kubernetes.io~configmap":    true,
	"kubernetes.io~secret":       true,
	"kubernetes.io~projected":    true,
	"kubernetes.io~downward-api": true,
}

// mounts is what a pod container's bind mounts are to a migration.
type mounts struct {
	// emptyDirs move with the container.
	emptyDirs []runtime.Volume
	// shared are host directories of storage the target node shares.
	shared []shareddir.Dir
}

// classifyMounts sorts a pod container's bind mounts: its pod's own files
// and the volumes the kubelet makes from the API stay (the replacement
// has its own); emptyDir volumes move; those at a path of shared (storage
// the target shares, as the controller found) stay where they are;
// anything else (hostPath, a persistent volume) is refused, with which.
func classifyMounts(s *specs.Spec, podUID, sandboxID string, shared []string) (mounts, error) {
	var m mounts
	var refused []string
	for _, mt := range s.Mounts {
		if mt.Type != "bind" && !hasOption(mt.Options, "bind") && !hasOption(mt.Options, "rbind") {
			continue
		}
		plugin, vol, ok := podVolume(mt.Source, podUID)
		switch {
		case podUID != "" && strings.Contains(mt.Source, "/pods/"+podUID+"/volume-subpaths/"):
			refused = append(refused, fmt.Sprintf("part of a volume (subPath) at %s: ferry cannot tell here which volume it is from, so it moves pods that mount volumes whole", mt.Destination))
		case slices.Contains(shared, mt.Destination):
			m.shared = append(m.shared, shareddir.Dir{Source: mt.Source, Path: mt.Destination})
		case ok && plugin == emptyDirPlugin && !strings.Contains(strings.TrimPrefix(mt.Source, volumeRoot(mt.Source, podUID, plugin, vol)), "/"):
			m.emptyDirs = append(m.emptyDirs, runtime.Volume{Name: vol, Path: mt.Destination, Dir: mt.Source})
		case ok && madeByKubelet[plugin]:
		case ok:
			refused = append(refused, fmt.Sprintf("volume %q at %s (%s): ferry moves emptyDir volumes, and persistent volumes its controller found the target node shares (hostPath ones), not this one", vol, mt.Destination, strings.TrimPrefix(plugin, "kubernetes.io~")))
		case podUID != "" && strings.Contains(mt.Source, "/pods/"+podUID+"/"),
			sandboxID != "" && strings.Contains(mt.Source, sandboxID):
			// The pod's own files (/etc/hosts, the termination log) and
			// the sandbox's (hostname, resolv.conf, /dev/shm).
		default:
			refused = append(refused, fmt.Sprintf("host path %s at %s: a hostPath volume is this node's, not the pod's", mt.Source, mt.Destination))
		}
	}
	if len(refused) > 0 {
		return m, fmt.Errorf("cannot move: %s", strings.Join(refused, "; "))
	}
	return m, nil
}

// podVolume splits a kubelet volume directory,
// ROOT/pods/UID/volumes/PLUGIN/NAME, or a path below it (a CSI volume's
// NAME/mount), into plugin and name.
func podVolume(src, podUID string) (plugin, name string, ok bool) {
	if podUID == "" {
		return "", "", false
	}
	_, rest, found := strings.Cut(src, "/pods/"+podUID+"/volumes/")
	if !found {
		return "", "", false
	}
	plugin, rest, found = strings.Cut(rest, "/")
	name, _, _ = strings.Cut(rest, "/")
	if !found || name == "" {
		return "", "", false
	}
	return plugin, name, true
}

// volumeRoot is the directory of volume name of plugin in src's path.
func volumeRoot(src, podUID, plugin, name string) string {
	prefix, _, _ := strings.Cut(src, "/pods/"+podUID+"/volumes/")
	return prefix + "/pods/" + podUID + "/volumes/" + plugin + "/" + name
}

func hasOption(opts []string, o string) bool {
	for _, x := range opts {
		if x == o {
			return true
		}
	}
	return false
}

// emptyDirOf is where spec s mounts emptyDir volume vol.
func emptyDirOf(s *specs.Spec, podUID, vol string) (string, error) {
	for _, mt := range s.Mounts {
		if plugin, name, ok := podVolume(mt.Source, podUID); ok && plugin == emptyDirPlugin && name == vol {
			return mt.Source, nil
		}
	}
	return "", fmt.Errorf("the replacement pod has no emptyDir volume %q (is it the source pod's spec?)", vol)
}

// addressIn is the first global IPv4 address in the network namespace at
// nsPath.
func addressIn(nsPath string) (string, error) {
	if _, err := os.Stat(nsPath); err != nil {
		return "", err
	}
	spec, err := cnet.Describe(nsPath)
	if err != nil {
		return "", err
	}
	for _, ifc := range spec.Ifaces {
		for _, a := range ifc.Addrs {
			if ip, _, ok := strings.Cut(a, "/"); ok && strings.Count(ip, ".") == 3 {
				return ip, nil
			}
		}
	}
	return "", fmt.Errorf("no IPv4 address in %s", filepath.Base(nsPath))
}

// killPending says a SIGKILL waits for process pid (frozen, it cannot
// take it until thawed).
func killPending(pid int) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return false
	}
	const sigkill = uint64(1) << (9 - 1)
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "SigPnd" && k != "ShdPnd") {
			continue
		}
		if mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err == nil && mask&sigkill != 0 {
			return true
		}
	}
	return false
}
