package lab

import (
	"net"
	"strings"

	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"github.com/ferry-migrate/ferry/internal/cnet"
	"github.com/ferry-migrate/ferry/internal/mounts"

	"github.com/ferry-migrate/ferry/internal/runc"
)

// containerIDRe is what runc accepts as a container ID.
var containerIDRe = regexp.MustCompile(`^[A-Za-z0-9_+.-]+$`)

// Run starts a container on a lab host: a fresh busybox bundle whose
// process runs args, in the host's network namespace and cgroup parent.
func (l *Lab) Run(ctx context.Context, hostName, container string, args []string) error {
	return l.run(ctx, hostName, container, RunOptions{}, args)
}

// RunOnSegment starts a container in a network namespace of its own, with
// ip (an address of SegmentSubnet) on the service segment: the address it
// keeps wherever it migrates. hostPrograms are programs of this machine
// (e.g. /usr/bin/redis-server) copied into the container's root filesystem
// with the shared libraries they load.
func (l *Lab) RunOnSegment(ctx context.Context, hostName, container, ip string, hostPrograms []string, args []string) error {
	return l.RunWith(ctx, hostName, container, RunOptions{IP: ip, HostPrograms: hostPrograms}, args)
}

// RunOptions are a lab container's choices beyond its program.
type RunOptions struct {
	// IP, when set, gives the container a network namespace of its own
	// on the service segment with this address (see RunOnSegment).
	IP string
	// HostPrograms are copied in with their libraries (see RunOnSegment).
	HostPrograms []string
	// Rootfs is RootfsBusybox (the default when empty) or RootfsDebian.
	Rootfs string
	// Packages, with RootfsDebian, replace DebianPackages: a root
	// filesystem with only what one service needs (built and cached once
	// per package list).
	Packages []string
	// CopyImage, with RootfsDebian, copies the whole tree into the bundle
	// (all of it moves) instead of an overlay over the shared image (only
	// the container's own layer moves).
	CopyImage bool
}

// RunWith starts a container on a lab host like Run and RunOnSegment, with
// the root filesystem o.Rootfs.
func (l *Lab) RunWith(ctx context.Context, hostName, container string, o RunOptions, args []string) error {
	if o.IP != "" {
		addr := net.ParseIP(o.IP).To4()
		if addr == nil || !strings.HasPrefix(o.IP, SegmentSubnet) || addr[3] == 0 || addr[3] >= 200 {
			return fmt.Errorf("container address %q: pick one of %s1 to %s199", o.IP, SegmentSubnet, SegmentSubnet)
		}
	}
	switch o.Rootfs {
	case "", RootfsBusybox, RootfsDebian:
	default:
		return fmt.Errorf("unknown root filesystem %q: want %s or %s", o.Rootfs, RootfsBusybox, RootfsDebian)
	}
	if (len(o.Packages) > 0 || o.CopyImage) && o.Rootfs != RootfsDebian {
		return fmt.Errorf("packages need the %s root filesystem, and so does copying its image", RootfsDebian)
	}
	return l.run(ctx, hostName, container, o, args)
}

func (l *Lab) run(ctx context.Context, hostName, container string, o RunOptions, args []string) error {
	ip := o.IP
	h, err := l.Host(hostName)
	if err != nil {
		return err
	}
	if !containerIDRe.MatchString(container) || container == "." || container == ".." {
		return fmt.Errorf("bad container name %q: use letters, digits, '_', '+', '-' and '.'", container)
	}
	if len(args) == 0 {
		return errors.New("no program to run in the container")
	}
	rc := h.Runc()
	if err := os.MkdirAll(h.RuncRoot(), 0o700); err != nil {
		return err
	}
	if st, err := rc.State(ctx, container); err == nil {
		return fmt.Errorf("container %q already exists on %s (%s); pick another name or delete it", container, h.Name, st.Status)
	} else if !errors.Is(err, runc.ErrNotFound) {
		return err
	}
	bundle := h.BundleDir(container)
	if _, err := os.Lstat(bundle); err == nil {
		return fmt.Errorf("container name %q is taken on %s: bundle %s exists", container, h.Name, bundle)
	}
	bin, err := l.ferryBin()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return err
	}
	nsName := ""
	err = func() error {
		if err := layRootfs(ctx, o, bundle, filepath.Dir(bin)); err != nil {
			return err
		}
		for _, p := range o.HostPrograms {
			if err := InstallHostProgram(filepath.Join(bundle, "rootfs"), p); err != nil {
				return err
			}
		}
		netNS := h.NetNS
		if ip != "" {
			a := net.ParseIP(ip).To4()
			spec := cnet.Spec{Ifaces: []cnet.Iface{{Name: "eth0", MTU: 1500,
				MAC:   fmt.Sprintf("02:fe:%02x:%02x:%02x:%02x", a[0], a[1], a[2], a[3]),
				Addrs: []string{fmt.Sprintf("%s/%d", ip, segmentPrefixLen)}}}}
			nsName = cnet.Name(h.Name, container)
			if netNS, err = cnet.Create(nsName, h.NetNS, SegmentBridge, spec); err != nil {
				return err
			}
			if err := cnet.SetCarrier(nsName, h.NetNS, spec, true); err != nil {
				return err
			}
		}
		spec := runc.NewSpec(runc.SpecOptions{
			Args:        args,
			Hostname:    container,
			CgroupsPath: h.CgroupsPath(container),
			NetNS:       netNS,
		})
		if err := runc.WriteSpec(bundle, spec); err != nil {
			return err
		}
		return rc.Run(ctx, container, bundle, h.LogPath(container))
	}()
	if err != nil {
		// Leave the name free for another try; the log stays.
		_ = rc.Delete(context.WithoutCancel(ctx), container)
		_ = mounts.RemoveAll(bundle)
		if nsName != "" {
			_ = cnet.Delete(nsName)
		}
		return fmt.Errorf("run %s on %s: %w", container, h.Name, err)
	}
	return nil
}

// Containers lists the containers on the host.
func (h *Host) Containers(ctx context.Context) ([]runc.State, error) {
	if _, err := os.Stat(h.RuncRoot()); err != nil {
		return nil, nil
	}
	return h.Runc().List(ctx)
}
