package lab

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/ferry-migrate/ferry/internal/cnet"
	"github.com/ferry-migrate/ferry/internal/runtime/containerd"
)

// Each lab host has a CNI bridge network for its containerd containers,
// CNINetwork: a bridge of its own in the host's namespace, the same subnet
// on every host (as containerd's and Docker's defaults are), addresses
// from host-local, kept per host.

// CNINetwork is the lab hosts' CNI network, CNISubnet its subnet.
const (
	CNINetwork = "ferry-lab-bridge"
	CNISubnet  = "10.88.0.0/24"
	cniBridge  = "ferrycni0"
)

// CNI is the host's CNI setup, as its agent is given it.
func (h *Host) CNI() containerd.CNI {
	return containerd.CNI{ConfDir: filepath.Join(h.StateDir, "cni", "net.d"), BinDirs: containerd.DefaultCNI.BinDirs,
		CacheDir: filepath.Join(h.StateDir, "cni", "cache")}
}

// writeCNIConfig writes the host's CNINetwork configuration list (at lab
// up).
func (h *Host) writeCNIConfig() error {
	c := h.CNI()
	if err := os.MkdirAll(c.ConfDir, 0o755); err != nil {
		return err
	}
	conf := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": %q,
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "firewall"}
  ]
}
`, CNINetwork, cniBridge, CNISubnet, filepath.Join(h.StateDir, "cni", "ipam"))
	return os.WriteFile(filepath.Join(c.ConfDir, "10-"+CNINetwork+".conflist"), []byte(conf), 0o644)
}

// attachCNI gives containerd container id on h a network namespace on
// the host's CNINetwork, pinned where the host's agent removes it with the
// container, and returns its path and address (want where it is free),
// with ports published on the host's address. The plugins run in the
// host's namespace: the bridge is the host's.
func (h *Host) attachCNI(ctx context.Context, id string, want netip.Addr, ports []containerd.PortMapping) (string, netip.Prefix, error) {
	r := h.ContainerdRuntime()
	path := filepath.Join(r.NetNSDir(), "default-"+id)
	if err := containerd.NewNetNS(path); err != nil {
		return "", netip.Prefix{}, err
	}
	var addr netip.Prefix
	err := cnet.Do(h.NetNS, func() (err error) {
		addr, err = h.CNI().Attach(ctx, CNINetwork, id, path, want, ports)
		return err
	})
	if err != nil {
		_ = containerd.RemoveNetNS(path)
		return "", netip.Prefix{}, err
	}
	return path, addr, nil
}
