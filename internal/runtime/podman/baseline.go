package podman

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ferry-migrate/ferry/internal/units"
)

// BaselineTimes are the phases of one Podman migration, in milliseconds.
type BaselineTimes struct {
	CheckpointMs float64 `json:"checkpoint_ms"`
	CopyMs       float64 `json:"copy_ms"`
	RestoreMs    float64 `json:"restore_ms"`
	// DowntimeMs runs from the start of the checkpoint until the restore
	// returned: the container runs nowhere in between.
	DowntimeMs   float64 `json:"downtime_ms"`
	ArchiveBytes int64   `json:"archive_bytes"`
}

// Baseline migrates the running container name from src to dst the way
// Podman users do: checkpoint --export at src, copyArchive to move the
// archive (srcPath on src to dstPath on dst), restore --import at dst, and
// finally removing the stopped container at src. flags go to both the
// checkpoint and the restore command (--tcp-established, --file-locks).
// dst must hold the container's image with the same ID (ImportRootfs). The
// archives are deleted afterwards. If a phase fails, the container is left
// checkpointed (stopped) at src.
func Baseline(ctx context.Context, src, dst Host, name string,
	copyArchive func(ctx context.Context, srcPath, dstPath string) error, flags ...string) (BaselineTimes, error) {
	var t BaselineTimes
	srcPath := src.path("checkpoints", name+".tar")
	dstPath := dst.path("checkpoints", name+".tar")
	if err := os.MkdirAll(filepath.Dir(dstPath), 0o700); err != nil {
		return t, err
	}
	defer os.Remove(srcPath)
	defer os.Remove(dstPath)

	start := time.Now()
	if err := src.CheckpointExport(ctx, name, srcPath, flags...); err != nil {
		return t, err
	}
	checkpointed := time.Now()
	if err := copyArchive(ctx, srcPath, dstPath); err != nil {
		return t, fmt.Errorf("copy checkpoint archive: %w", err)
	}
	copied := time.Now()
	if err := dst.RestoreImport(ctx, dstPath, flags...); err != nil {
		return t, err
	}
	restored := time.Now()

	t.CheckpointMs = units.Millis(checkpointed.Sub(start))
	t.CopyMs = units.Millis(copied.Sub(checkpointed))
	t.RestoreMs = units.Millis(restored.Sub(copied))
	t.DowntimeMs = units.Millis(restored.Sub(start))
	if st, err := os.Stat(srcPath); err == nil {
		t.ArchiveBytes = st.Size()
	}
	if err := src.Remove(ctx, name); err != nil {
		return t, fmt.Errorf("remove source container: %w", err)
	}
	return t, nil
}
