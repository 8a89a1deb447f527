package criu

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/stats"
)

// DumpStats is what CRIU records about one dump (or pre-dump) in the
// stats-dump file of its images directory.
type DumpStats struct {
	FreezingTime time.Duration // time to freeze the tree
	FrozenTime   time.Duration // time the tree stayed frozen
	MemdumpTime  time.Duration // time to drain memory into pipes
	MemwriteTime time.Duration // time to write the pages out

	PagesScanned       uint64
	PagesWritten       uint64
	PagesSkippedParent uint64 // unchanged since the parent (pre-)dump
	PagesLazy          uint64 // left for the lazy page server
}

// RestoreStats is what CRIU records about a restore in stats-restore.
type RestoreStats struct {
	ForkingTime time.Duration
	RestoreTime time.Duration

	PagesCompared   uint64
	PagesSkippedCow uint64
	PagesRestored   uint64
}

// CRIU stores its timings in microseconds.
func usec(v uint32) time.Duration { return time.Duration(v) * time.Microsecond }

// ReadDumpStats reads imagesDir/stats-dump.
func ReadDumpStats(imagesDir string) (DumpStats, error) {
	dir, err := openStats(imagesDir, stats.StatsDump)
	if err != nil {
		return DumpStats{}, err
	}
	defer dir.Close()
	e, err := stats.CriuGetDumpStats(dir)
	if err != nil {
		return DumpStats{}, fmt.Errorf("criu: %s: %w", stats.StatsDump, err)
	}
	if e == nil {
		return DumpStats{}, fmt.Errorf("criu: %s holds no dump entry", stats.StatsDump)
	}
	return DumpStats{
		FreezingTime:       usec(e.GetFreezingTime()),
		FrozenTime:         usec(e.GetFrozenTime()),
		MemdumpTime:        usec(e.GetMemdumpTime()),
		MemwriteTime:       usec(e.GetMemwriteTime()),
		PagesScanned:       e.GetPagesScanned(),
		PagesWritten:       e.GetPagesWritten(),
		PagesSkippedParent: e.GetPagesSkippedParent(),
		PagesLazy:          e.GetPagesLazy(),
	}, nil
}

// ReadRestoreStats reads imagesDir/stats-restore.
func ReadRestoreStats(imagesDir string) (RestoreStats, error) {
	dir, err := openStats(imagesDir, stats.StatsRestore)
	if err != nil {
		return RestoreStats{}, err
	}
	defer dir.Close()
	e, err := stats.CriuGetRestoreStats(dir)
	if err != nil {
		return RestoreStats{}, fmt.Errorf("criu: %s: %w", stats.StatsRestore, err)
	}
	if e == nil {
		return RestoreStats{}, fmt.Errorf("criu: %s holds no restore entry", stats.StatsRestore)
	}
	return RestoreStats{
		ForkingTime:     usec(e.GetForkingTime()),
		RestoreTime:     usec(e.GetRestoreTime()),
		PagesCompared:   e.GetPagesCompared(),
		PagesSkippedCow: e.GetPagesSkippedCow(),
		PagesRestored:   e.GetPagesRestored(),
	}, nil
}

// openStats opens the images directory for go-criu after checking that the
// stats file is long enough for the size it declares: go-criu slices the
// file without bounds checks and would panic on a truncated one.
func openStats(imagesDir, name string) (*os.File, error) {
	b, err := os.ReadFile(filepath.Join(imagesDir, name))
	if err != nil {
		return nil, fmt.Errorf("criu: %w", err)
	}
	if len(b) < stats.PayloadOffset ||
		uint64(len(b)) < stats.PayloadOffset+uint64(binary.LittleEndian.Uint32(b[stats.SizeOffset:stats.PayloadOffset])) {
		return nil, fmt.Errorf("criu: %s is truncated (%d bytes)", name, len(b))
	}
	return os.Open(imagesDir)
}
