package kubelab

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestStateSavedAtEachUpdate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	s := &state{path: path, Name: "kt", CgroupParent: "/kt"}
	r := route{NetNS: "/run/netns/a", Dst: "10.92.1.0/24", Via: "10.91.0.11"}
	if err := s.update(func(s *state) { s.Routes = append(s.Routes, r) }); err != nil {
		t.Fatal(err)
	}
	if err := s.update(func(s *state) { s.Processes = append(s.Processes, process{Name: "etcd", PID: 1, Start: 2}) }); err != nil {
		t.Fatal(err)
	}
	got, err := loadState(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "kt" || len(got.Routes) != 1 || got.Routes[0].Via != "10.91.0.11" || len(got.Processes) != 1 || got.Processes[0].Name != "etcd" {
		t.Errorf("loaded %+v", got)
	}
	if _, err := loadState(filepath.Join(t.TempDir(), "none.json")); !errors.Is(err, errNoState) {
		t.Errorf("missing state: %v", err)
	}
}

func TestProcessIdentity(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := process{Name: "sleep", PID: cmd.Process.Pid, Start: processStart(cmd.Process.Pid)}
	if p.Start == 0 || !p.alive() {
		t.Fatalf("a running child: start %d, alive %v", p.Start, p.alive())
	}
	// The same PID with another start time is another process.
	if other := (process{PID: p.PID, Start: p.Start + 1}); other.alive() {
		t.Error("a reused PID counts as the process Up started")
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if p.alive() {
		t.Error("a reaped process is alive")
	}
}

func TestDownWithoutState(t *testing.T) {
	if err := Down("relative/dir"); err == nil {
		t.Error("relative dir accepted")
	}
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.Mkdir(empty, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Down(empty); err != nil {
		t.Errorf("empty dir: %v", err)
	}
	if _, err := os.Stat(empty); !os.IsNotExist(err) {
		t.Error("Down left the empty directory an Up that failed early would leave")
	}
	if err := Down(empty); err != nil {
		t.Errorf("again: %v", err)
	}
	// A directory holding something else than a cluster is never removed.
	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, "precious"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Down(other); err == nil || !strings.Contains(err.Error(), "left alone") {
		t.Errorf("non-empty dir without state: %v", err)
	}
	if _, err := os.Stat(filepath.Join(other, "precious")); err != nil {
		t.Error(err)
	}
}
