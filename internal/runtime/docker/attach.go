package docker

// What a Docker container is attached to beside its own layer: named
// volumes, whose data moves with it (the engine syncs each as it syncs the
// root filesystem), and networks, which each host's Docker gives anew
// under the same name. A bridge ends at its host, behind its NAT: the
// container gets an address there (the same on a user-defined network
// where it is free), established connections are dumped to be restored
// closed (CRIU's tcp-close) and published ports are published again by
// the destination's Docker. A macvlan or ipvlan network is a segment both
// hosts share: the container keeps its address there, and its
// connections (the engine takes the source's links down at the freeze).

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"
	"github.com/docker/go-connections/nat"

	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/shareddir"
)

// volumesOf lists the container's named volumes, each of the local
// driver, mounted by no other container, on this host's disk. What cannot
// move is refused before anything is frozen.
func volumesOf(ctx context.Context, cl *client.Client, j container.InspectResponse) ([]runtime.Volume, error) {
	var out []runtime.Volume
	for _, mp := range j.Mounts {
		if mp.Type != mount.TypeVolume {
			continue
		}
		if mp.Driver != "" && mp.Driver != "local" {
			return nil, fmt.Errorf("docker volume %q (at %s) has driver %q: ferry moves volumes of the local driver only", mp.Name, mp.Destination, mp.Driver)
		}
		v, err := cl.VolumeInspect(ctx, mp.Name)
		if err != nil {
			return nil, fmt.Errorf("docker volume %q: %w", mp.Name, err)
		}
		if len(v.Options) > 0 {
			return nil, fmt.Errorf("docker volume %q mounts %s (options %s): ferry copies only volumes kept on this host's disk", mp.Name, v.Options["device"], optionList(v.Options))
		}
		users, err := cl.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("volume", mp.Name))})
		if err != nil {
			return nil, err
		}
		for _, u := range users {
			if u.ID != j.ID {
				return nil, fmt.Errorf("docker volume %q is also mounted by container %s: ferry moves a volume only with the one container that uses it", mp.Name, strings.TrimPrefix(firstName(u.Names), "/"))
			}
		}
		out = append(out, runtime.Volume{Name: mp.Name, Path: mp.Destination, Dir: mp.Source})
	}
	return out, nil
}

// sharedOf lists the container's writable bind mounts of host paths:
// data, remounted where the destination has the same storage, never
// copied (runtime.Container.Shared). Read-only ones (/etc/localtime) are
// the host's own files, mounted again from the destination's.
func sharedOf(j container.InspectResponse) []shareddir.Dir {
	var out []shareddir.Dir
	for _, mp := range j.Mounts {
		if mp.Type == mount.TypeBind && mp.RW {
			out = append(out, shareddir.Dir{Source: mp.Source, Path: mp.Destination})
		}
	}
	return out
}

func optionList(o map[string]string) string {
	var kv []string
	for k, v := range o {
		kv = append(kv, k+"="+v)
	}
	sort.Strings(kv)
	return strings.Join(kv, ",")
}

func firstName(names []string) string {
	if len(names) == 0 {
		return "?"
	}
	return names[0]
}

// networksOf lists the Docker networks the container is on: bridges (the
// default one and users' own), which end at the host. The host network and
// none are no network of Docker's here; other drivers are refused.
func networksOf(ctx context.Context, cl *client.Client, j container.InspectResponse) ([]runtime.Network, error) {
	if j.NetworkSettings == nil {
		return nil, nil
	}
	mode := j.HostConfig.NetworkMode
	if mode.IsContainer() {
		return nil, fmt.Errorf("docker container %q shares the network of another container (%s): ferry does not move it apart from that one", strings.TrimPrefix(j.Name, "/"), mode)
	}
	var out []runtime.Network
	for _, name := range slices.Sorted(maps.Keys(j.NetworkSettings.Networks)) {
		if name == "host" || name == "none" {
			continue
		}
		n, err := cl.NetworkInspect(ctx, name, network.InspectOptions{})
		if err != nil {
			return nil, fmt.Errorf("docker network %q: %w", name, err)
		}
		if !slices.Contains([]string{"bridge", "macvlan", "ipvlan"}, n.Driver) {
			return nil, fmt.Errorf("docker container %q is on network %q of driver %s: ferry moves Docker containers on bridge, macvlan and ipvlan networks, the host's network or none", strings.TrimPrefix(j.Name, "/"), name, n.Driver)
		}
		ep := j.NetworkSettings.Networks[name]
		rn := runtime.Network{Name: name, Driver: n.Driver, Address: ep.IPAddress, HostLocal: n.Driver == "bridge"}
		if ep.IPAddress != "" {
			rn.Subnet = fmt.Sprintf("%s/%d", ep.IPAddress, ep.IPPrefixLen)
			if p, err := netip.ParsePrefix(rn.Subnet); err == nil {
				rn.Subnet = p.Masked().String()
			}
		}
		if name == primaryNetwork(mode) {
			rn.Ports = publishedPorts(j.HostConfig.PortBindings)
		}
		out = append(out, rn)
	}
	return out, nil
}

// primaryNetwork is the network a container is created on.
func primaryNetwork(mode container.NetworkMode) string {
	if mode.IsDefault() {
		return "bridge"
	}
	return string(mode)
}

// publishedPorts are a container's port bindings as HOSTPORT->PORT/PROTO.
func publishedPorts(b nat.PortMap) []string {
	var out []string
	for p, bs := range b {
		for _, hb := range bs {
			out = append(out, runtime.PublishedPort(hb.HostIP, hb.HostPort, string(p)))
		}
	}
	sort.Strings(out)
	return out
}

// attachHere checks, before anything is made, that this host's Docker has
// each of the container's networks, as bridges, and that no container of
// its own publishes one of its host ports. It returns the endpoint
// settings to create the container with, per network: on a user-defined
// network the source's address, where the subnet holds it and no
// container here has it.
func (r *Runtime) attachHere(ctx context.Context, cl *client.Client, c *runtime.Container, hc *container.HostConfig) (map[string]*network.EndpointSettings, error) {
	eps := map[string]*network.EndpointSettings{}
	for _, want := range c.Networks {
		n, err := cl.NetworkInspect(ctx, want.Name, network.InspectOptions{})
		if errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("docker (%s) has no network %q, which the container is on at the source: create it here first (docker network create --driver %s %s)", r.host(), want.Name, want.Driver, want.Name)
		} else if err != nil {
			return nil, err
		}
		if n.Driver != want.Driver {
			return nil, fmt.Errorf("docker (%s): network %q has driver %s here and %s at the source", r.host(), want.Name, n.Driver, want.Driver)
		}
		ep := &network.EndpointSettings{}
		free := addressFree(n, want.Address)
		if !want.HostLocal && !free {
			// On a segment both hosts share the address and connections
			// move with the container, or nothing does.
			return nil, fmt.Errorf("docker (%s): network %q cannot give the container its address %s here (not in its subnets %s, or taken): a container on a %s network keeps its address or does not move",
				r.host(), want.Name, want.Address, subnets(n), want.Driver)
		}
		if want.Name != "bridge" && free {
			// Docker lets a container choose its address on users'
			// networks only.
			ep.IPAMConfig = &network.EndpointIPAMConfig{IPv4Address: want.Address}
		}
		eps[want.Name] = ep
	}
	if len(hc.PortBindings) == 0 {
		return eps, nil
	}
	running, err := cl.ContainerList(ctx, container.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, other := range running {
		for _, p := range other.Ports {
			if p.PublicPort == 0 {
				continue
			}
			for port, bs := range hc.PortBindings {
				if port.Proto() != p.Type {
					continue
				}
				for _, b := range bs {
					if b.HostPort == fmt.Sprint(p.PublicPort) {
						return nil, fmt.Errorf("docker (%s): container %s publishes port %d/%s already, which the container publishes at the source: free it here first", r.host(), strings.TrimPrefix(firstName(other.Names), "/"), p.PublicPort, p.Type)
					}
				}
			}
		}
	}
	return eps, nil
}

// addressFree says whether addr lies in one of n's subnets and no
// endpoint on n has it.
func addressFree(n network.Inspect, addr string) bool {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return false
	}
	in := slices.ContainsFunc(n.IPAM.Config, func(c network.IPAMConfig) bool {
		p, err := netip.ParsePrefix(c.Subnet)
		return err == nil && p.Contains(a) && c.Gateway != addr
	})
	if !in {
		return false
	}
	for _, e := range n.Containers {
		if p, err := netip.ParsePrefix(e.IPv4Address); err == nil && p.Addr() == a {
			return false
		}
	}
	return true
}

// subnets lists n's subnets.
func subnets(n network.Inspect) string {
	var out []string
	for _, c := range n.IPAM.Config {
		out = append(out, c.Subnet)
	}
	return strings.Join(out, ", ")
}

// volumesHere refuses volumes this host's Docker has already: ferry does
// not overwrite a volume it did not make.
func (r *Runtime) volumesHere(ctx context.Context, cl *client.Client, vols []runtime.Volume) error {
	for _, v := range vols {
		_, err := cl.VolumeInspect(ctx, v.Name)
		if err == nil {
			return fmt.Errorf("docker (%s) already has a volume named %q: ferry does not overwrite it; remove it (docker volume rm %s) or move the container elsewhere", r.host(), v.Name, v.Name)
		}
		if !errdefs.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// removeVolumes deletes the named volumes, once no container uses them.
func removeVolumes(ctx context.Context, cl *client.Client, vols []runtime.Volume) error {
	var errs []string
	for _, v := range vols {
		if err := cl.VolumeRemove(ctx, v.Name, false); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("docker: removing volumes: %s", strings.Join(errs, "; "))
	}
	return nil
}
