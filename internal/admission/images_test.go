package admission_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/admission"
	"github.com/ferry-migrate/ferry/internal/images"
)

// writeCore writes a core image for task pid whose capability sets are
// all caps (a bit mask).
func writeCore(t *testing.T, dir string, pid int, caps uint64) {
	t.Helper()
	b, err := images.EncodeTaskCaps(caps)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "core-"+strconv.Itoa(pid)+".img"), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// CRIU restores credentials from its images, not from the configuration:
// images whose tasks hold more than the configuration's bounding set are
// refused, and the engines' default set passes.
func TestCheckImagesCapabilities(t *testing.T) {
	spec := encode(t, ordinary())
	// CAP_CHOWN (0), CAP_KILL (5), CAP_NET_BIND_SERVICE (10): in the default set.
	const modest = 1<<0 | 1<<5 | 1<<10
	dir := t.TempDir()
	writeCore(t, dir, 1, modest)
	writeCore(t, dir, 7, modest)
	if err := (admission.Policy{}).CheckImages(dir, spec); err != nil {
		t.Fatalf("modest images refused: %v", err)
	}
	writeCore(t, dir, 9, modest|1<<21) // CAP_SYS_ADMIN
	err := (admission.Policy{}).CheckImages(dir, spec)
	if !admission.IsRefused(err) || !strings.Contains(err.Error(), "task 9 of the CRIU images holds CAP_SYS_ADMIN") {
		t.Errorf("a task with CAP_SYS_ADMIN: %v", err)
	}
	if err := (admission.Policy{Privileged: true}).CheckImages(dir, spec); err != nil {
		t.Errorf("--allow-privileged: %v", err)
	}
	if err := (admission.Policy{}).CheckImages(t.TempDir(), spec); err == nil {
		t.Error("images without a task passed")
	}
}
