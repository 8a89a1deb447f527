package podman

// What a Podman container is attached to beside its own layer: named
// volumes, whose data moves with it (the engine syncs each as it syncs the
// root filesystem), and bridge networks (Podman's default "podman" and
// users' own), which each host's Podman gives anew. A bridge ends at its
// host, behind its NAT: established connections are dumped to be restored
// closed (CRIU's tcp-close) and published ports are published again by the
// destination's Podman.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/shareddir"
)

// attachments is the part of `podman inspect` that says what the
// container is attached to.
type attachments struct {
	Mounts []struct {
		Type        string `json:"Type"`
		Name        string `json:"Name"`
		Source      string `json:"Source"`
		Destination string `json:"Destination"`
		Driver      string `json:"Driver"`
		RW          bool   `json:"RW"`
	} `json:"Mounts"`
	NetworkSettings struct {
		Networks map[string]struct {
			IPAddress string `json:"IPAddress"`
		} `json:"Networks"`
	} `json:"NetworkSettings"`
	HostConfig struct {
		NetworkMode  string `json:"NetworkMode"`
		PortBindings map[string][]struct {
			HostIP   string `json:"HostIp"`
			HostPort string `json:"HostPort"`
		} `json:"PortBindings"`
	} `json:"HostConfig"`
}

// sharedOf lists the container's writable bind mounts of host
// directories: data, remounted where the destination has the same
// storage, never copied (runtime.Container.Shared). Read-only ones are
// the host's own files, mounted again from the destination's.
func sharedOf(d *inspectData) []shareddir.Dir {
	var out []shareddir.Dir
	for _, m := range d.Mounts {
		if m.Type == "bind" && m.RW {
			out = append(out, shareddir.Dir{Source: m.Source, Path: m.Destination})
		}
	}
	return out
}

// volumesOf lists the container's named volumes, each of the local
// driver, mounted by no other container, on this host's disk.
func (r *Runtime) volumesOf(ctx context.Context, d *inspectData) ([]runtime.Volume, error) {
	var out []runtime.Volume
	for _, m := range d.Mounts {
		if m.Type != "volume" {
			continue
		}
		if m.Driver != "" && m.Driver != "local" {
			return nil, fmt.Errorf("podman volume %q (at %s) has driver %q: ferry moves volumes of the local driver only", m.Name, m.Destination, m.Driver)
		}
		js, err := r.Host.podman(ctx, "volume", "inspect", "--format", "json", m.Name)
		if err != nil {
			return nil, err
		}
		var vs []struct {
			Options map[string]string `json:"Options"`
		}
		if err := json.Unmarshal([]byte(js), &vs); err != nil || len(vs) != 1 {
			return nil, fmt.Errorf("podman volume inspect %s: %v", m.Name, err)
		}
		if len(vs[0].Options) > 0 {
			return nil, fmt.Errorf("podman volume %q mounts %s (options %v): ferry copies only volumes kept on this host's disk", m.Name, vs[0].Options["device"], vs[0].Options)
		}
		users, err := r.Host.podman(ctx, "ps", "--all", "--filter", "volume="+m.Name, "--format", "{{.ID}} {{.Names}}", "--no-trunc")
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(strings.TrimSpace(users), "\n") {
			if id, name, _ := strings.Cut(line, " "); id != "" && id != d.ID {
				return nil, fmt.Errorf("podman volume %q is also mounted by container %s: ferry moves a volume only with the one container that uses it", m.Name, name)
			}
		}
		out = append(out, runtime.Volume{Name: m.Name, Path: m.Destination, Dir: m.Source})
	}
	return out, nil
}

// networksOf lists the Podman networks the container is on: bridges,
// which end at the host. The host's network is none of Podman's here;
// other drivers are refused.
func (r *Runtime) networksOf(ctx context.Context, d *inspectData) ([]runtime.Network, error) {
	var out []runtime.Network
	for _, name := range slices.Sorted(maps.Keys(d.NetworkSettings.Networks)) {
		driver, err := r.Host.podman(ctx, "network", "inspect", "--format", "{{.Driver}}", name)
		if err != nil {
			return nil, err
		}
		if driver = strings.TrimSpace(driver); driver != "bridge" {
			return nil, fmt.Errorf("podman container %q is on network %q of driver %s: ferry moves Podman containers on bridge networks or the host's network", d.Name, name, driver)
		}
		out = append(out, runtime.Network{Name: name, Driver: driver, Address: d.NetworkSettings.Networks[name].IPAddress,
			Ports: d.publishedPorts(), HostLocal: true})
	}
	return out, nil
}

// publishedPorts are the container's port bindings as HOSTPORT->PORT/PROTO.
func (d *inspectData) publishedPorts() []string {
	var out []string
	for p, bs := range d.HostConfig.PortBindings {
		for _, b := range bs {
			out = append(out, runtime.PublishedPort(b.HostIP, b.HostPort, p))
		}
	}
	sort.Strings(out)
	return out
}

// attachHere checks, before anything is made, that this host's Podman has
// each of the container's networks, and none of the volumes: ferry does
// not overwrite a volume it did not make.
func (r *Runtime) attachHere(ctx context.Context, c *runtime.Container) error {
	for _, n := range c.Networks {
		if _, err := r.Host.podman(ctx, "network", "exists", n.Name); err != nil {
			return fmt.Errorf("podman (%s) has no network %q, which the container is on at the source: create it here first (podman network create %s)", r.Host.Dir, n.Name, n.Name)
		}
	}
	for _, v := range c.Volumes {
		if _, err := r.Host.podman(ctx, "volume", "exists", v.Name); err == nil {
			return fmt.Errorf("podman (%s) already has a volume named %q: ferry does not overwrite it; remove it (podman volume rm %s) or move the container elsewhere", r.Host.Dir, v.Name, v.Name)
		}
	}
	return nil
}

// placeVolumes points the spec's mounts of the container's volumes at
// where this host's Podman keeps volumes of those names (the spec names
// the source's), and returns it with those directories.
func (r *Runtime) placeVolumes(ctx context.Context, spec []byte, vols []runtime.Volume) ([]byte, []string, error) {
	if len(vols) == 0 {
		return spec, nil, nil
	}
	out, err := r.Host.podman(ctx, "info", "--format", "{{.Store.VolumePath}}")
	if err != nil {
		return nil, nil, err
	}
	root := strings.TrimSpace(out)
	var s map[string]json.RawMessage
	if err := json.Unmarshal(spec, &s); err != nil {
		return nil, nil, fmt.Errorf("podman: bad spec.dump: %w", err)
	}
	var mounts []map[string]any
	if err := json.Unmarshal(s["mounts"], &mounts); err != nil {
		return nil, nil, fmt.Errorf("podman: bad spec.dump mounts: %w", err)
	}
	var dirs []string
	for _, v := range vols {
		if strings.Contains(v.Name, "/") || v.Name == "" || v.Name == "." || v.Name == ".." {
			return nil, nil, fmt.Errorf("podman: bad volume name %q", v.Name)
		}
		dir := filepath.Join(root, v.Name, "_data")
		found := false
		for _, m := range mounts {
			if m["destination"] == v.Path {
				m["source"], found = dir, true
			}
		}
		if !found {
			return nil, nil, fmt.Errorf("podman: the container's spec mounts nothing at %s, where volume %s goes", v.Path, v.Name)
		}
		dirs = append(dirs, dir)
	}
	b, err := json.Marshal(mounts)
	if err != nil {
		return nil, nil, err
	}
	s["mounts"] = b
	spec, err = json.Marshal(s)
	return spec, dirs, err
}

// removeVolumes deletes the named volumes; one already gone counts as
// removed.
func (r *Runtime) removeVolumes(ctx context.Context, vols []runtime.Volume) error {
	var errs []string
	for _, v := range vols {
		if _, err := r.Host.podman(ctx, "volume", "rm", "--force", v.Name); err != nil && !strings.Contains(err.Error(), "no such volume") {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("podman: removing volumes: %s", strings.Join(errs, "; "))
	}
	return nil
}

// VolumeDir is where Podman keeps the named volume Prepare made.
func (t *target) VolumeDir(name string) (string, error) {
	out, err := t.r.Host.podman(context.Background(), "volume", "inspect", "--format", "{{.Mountpoint}}", name)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(out), nil
}

var _ runtime.VolumeTarget = (*target)(nil)
