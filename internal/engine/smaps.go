package engine

import (
	"os"
	"path/filepath"

	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/pages"
)

// The container's mappings and their flags are read just before the
// freeze, and the final dump's CRIU reads them instead of walking the
// frozen tasks' page tables for them (criu/smaps.go: 13-20 ms of the
// downtime per GiB). A flag changed in between would go unseen by CRIU,
// so the commit waits until the frozen tasks' flags, read again through
// a BPF iterator (microseconds), are found the snapshot's.

// smapsSnapshotDir is where the final dump's CRIU looks for the snapshot,
// "" where the runtime's dump cannot read one or no BPF iterator reads
// the flags here.
func (m *migration) smapsSnapshotDir() string {
	if !m.rt.Caps().SmapsSnapshot || m.vmas == nil || m.work == "" {
		return ""
	}
	return filepath.Join(m.work, "smaps")
}

// takeSmapsSnapshot reads the running container's smaps, the last thing
// before the freeze. Without a snapshot CRIU reads smaps itself.
func (m *migration) takeSmapsSnapshot() {
	dir := m.smapsSnapshotDir()
	if dir == "" || m.smaps != nil {
		return
	}
	pids, err := pages.ContainerPIDs(m.ctr.PID)
	if err == nil {
		m.smaps, err = criu.TakeSmapsSnapshot(dir, pids, m.vmas)
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		m.log.Info("no smaps snapshot: the dump reads smaps", "migration", m.req.ID, "why", err)
	}
}

// smapsSnapshotHeld says whether the dump took the frozen container's
// flags: an error means it must not be committed.
func (m *migration) smapsSnapshotHeld() error {
	if m.smaps == nil {
		return nil
	}
	return m.smaps.Check()
}

// dropSmapsSnapshot stops reading the container's flags.
func (m *migration) dropSmapsSnapshot() {
	if m.smaps != nil {
		m.smaps.Close()
	}
}
