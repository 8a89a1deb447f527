// Package criutest has test helpers that stand in for CRIU processes.
package criutest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// FakeCRIU returns the path of a copy of bash named criu: the kernel names
// a process after its file, so what it runs looks like a CRIU process to
// whoever checks a process's name. It skips the test without root (what
// such tests check reads other processes' descriptors) or without bash.
func FakeCRIU(t testing.TB) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: reads other processes' descriptors")
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("needs bash (it plays CRIU)")
	}
	b, err := os.ReadFile(bash)
	if err != nil {
		t.Fatal(err)
	}
	fake := filepath.Join(t.TempDir(), "criu")
	if err := os.WriteFile(fake, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return fake
}
