package runc

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/criu"
	"github.com/ferry-migrate/ferry/internal/runtime"
	"github.com/ferry-migrate/ferry/internal/vmas"
)

// Given a snapshot of the container's smaps taken before the freeze, the
// dump reads its mappings from there (ferry's CRIU,
// scripts/criu-patches/0014), and writes the memory map images a dump
// reading smaps writes. A snapshot that is not the frozen task's mappings
// line for line is left unread.
func TestDumpReadsTheSmapsSnapshot(t *testing.T) {
	h := newGateHosts(t)
	ctx := context.Background()
	pid := h.c.PID
	snap := filepath.Join(t.TempDir(), "smaps")
	r, err := vmas.NewReader()
	if err != nil {
		t.Skipf("no BPF task_vma iterator here: %v", err)
	}
	defer r.Close()
	s, err := criu.TakeSmapsSnapshot(snap, []int{pid}, r)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Processes() != 1 {
		t.Fatalf("the snapshot holds %d processes, want the container's init", s.Processes())
	}
	if err := h.src.Freeze(ctx, h.c); err != nil {
		t.Fatal(err)
	}
	dump := func(snapshot string) (log string, mm []byte) {
		t.Helper()
		o := dumpDirs(t, t.TempDir())
		o.SmapsSnapshot = snapshot
		d, err := h.src.Checkpoint(ctx, h.c, o)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Wait(); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(o.WorkDir, "dump.log"))
		if err != nil {
			t.Fatal(err)
		}
		return string(b), mmImages(t, o)
	}
	plainLog, plainMM := dump("")
	log, mm := dump(snap)
	if want := fmt.Sprintf("Reading the mappings of %d from the smaps snapshot", pid); !strings.Contains(log, want) {
		t.Fatalf("CRIU did not read the snapshot (is it ferry's, with patch 0014?); its log has no %q", want)
	}
	if strings.Contains(plainLog, "smaps snapshot") {
		t.Error("CRIU spoke of a snapshot in a dump that named none")
	}
	if !bytes.Equal(mm, plainMM) {
		t.Error("the memory map images from the snapshot differ from those read from smaps")
	}
	if err := s.Check(); err != nil {
		t.Errorf("the snapshot does not hold against the frozen container: %v", err)
	}

	// A mapping line that is not the task's: CRIU reads smaps.
	file := filepath.Join(snap, strconv.Itoa(pid))
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, bytes.Replace(b, []byte(" rw-p "), []byte(" r--p "), 1), 0o600); err != nil {
		t.Fatal(err)
	}
	log, mm = dump(snap)
	if want := fmt.Sprintf("The smaps snapshot of %d is out of date; reading smaps", pid); !strings.Contains(log, want) {
		t.Errorf("CRIU's log has no %q", want)
	}
	if !bytes.Equal(mm, plainMM) {
		t.Error("the memory map images differ from a plain dump's though CRIU read smaps")
	}
}

// mmImages is the dump's memory map images, one after the other.
func mmImages(t *testing.T, o runtime.CheckpointOptions) []byte {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(o.ImagesDir, "mm-*.img"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no memory map image in %s: %v", o.ImagesDir, err)
	}
	var all []byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	return all
}
