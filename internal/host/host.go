// Package host describes one ferry host: where its agent keeps state, which
// runc root, cgroup parent and network namespace its containers use. The lab
// and the agent derive every path from this one place, so a lab host and its
// agent always agree.
package host

import (
	"path/filepath"
)

// Config is one host's settings.
type Config struct {
	// Name identifies the host in reports and logs (e.g. "h1").
	Name string `json:"name"`
	// StateDir holds the journal and, unless the fields below say
	// otherwise, the bundles, the migrations' work directories and the
	// runc root.
	StateDir string `json:"state_dir"`
	// BundlesDir holds the OCI bundles (config.json, rootfs) of the runc
	// containers this host runs and restores ("": StateDir/bundles).
	BundlesDir string `json:"bundles_dir,omitempty"`
	// RuncRootDir is the runc root whose containers this host moves and
	// restores ("": StateDir/runc, as the lab's hosts use).
	RuncRootDir string `json:"runc_root,omitempty"`
	// CgroupParent is the cgroup under which this host's containers live;
	// two emulated hosts on one machine must not share it.
	CgroupParent string `json:"cgroup_parent"`
	// NetNS is the network namespace path containers join, empty for a
	// private one.
	NetNS string `json:"netns,omitempty"`
	// ScratchDir holds each migration's CRIU images while it runs; empty
	// means StateDir/work. A tmpfs is best: a restore that reads freshly
	// written images from a disk's page cache ran about 3x slower here.
	ScratchDir string `json:"scratch_dir,omitempty"`
}

// RuncRoot is runc's --root for this host.
func (c Config) RuncRoot() string {
	if c.RuncRootDir != "" {
		return c.RuncRootDir
	}
	return filepath.Join(c.StateDir, "runc")
}

// BundleRoot holds the bundles, one directory per container.
func (c Config) BundleRoot() string {
	if c.BundlesDir != "" {
		return c.BundlesDir
	}
	return filepath.Join(c.StateDir, "bundles")
}

// BundleDir is where a container's OCI bundle (config.json, rootfs) lives.
func (c Config) BundleDir(container string) string {
	return filepath.Join(c.BundleRoot(), container)
}

// LogPath is where runc's messages about a container go (its stdio is
// /dev/null: see package runc's Host.Run).
func (c Config) LogPath(container string) string {
	return filepath.Join(c.BundleRoot(), container+".log")
}

// WorkDir is a migration's scratch directory (images, CRIU logs).
func (c Config) WorkDir(migrationID string) string {
	return filepath.Join(c.WorkRoot(), migrationID)
}

// WorkRoot holds the migrations' scratch directories.
func (c Config) WorkRoot() string {
	if c.ScratchDir != "" {
		return c.ScratchDir
	}
	return filepath.Join(c.StateDir, "work")
}

// RescueDir is where CRIU keeps, while its code runs inside a process it
// dumps, what that process needs to be put back if CRIU dies (criu.Rescue;
// ferry's CRIU, patch 0015). Not named like a migration: a restarted
// agent's scratch cleanup leaves it.
func (c Config) RescueDir() string { return filepath.Join(c.WorkRoot(), "criu-rescue") }

// LogsDir keeps the CRIU and runtime logs of failed migrations, one
// directory per migration ID, after their scratch directories are gone.
func (c Config) LogsDir() string { return filepath.Join(c.StateDir, "logs") }

// CgroupsPath is the OCI cgroupsPath for a container on this host.
func (c Config) CgroupsPath(container string) string {
	return "/" + c.CgroupParent + "/" + container
}
