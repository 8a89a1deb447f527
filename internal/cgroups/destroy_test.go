package cgroups

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/testroot"
)

// A cgroup in every hierarchy holding a frozen process and a child
// cgroup: Destroy thaws and kills the process and removes every level.
func TestDestroy(t *testing.T) {
	testroot.Require(t, "needs root to make cgroups")
	hs := Hierarchies(Root)
	if len(hs) == 0 {
		t.Skip("no cgroup hierarchy mounted at " + Root)
	}
	rel := fmt.Sprintf("/ferry-destroy-test-%d", os.Getpid())
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep(1): %v", err)
	}
	var made []string
	exited := make(chan error, 1)
	t.Cleanup(func() {
		// Thawed first: a frozen process does not die.
		for _, d := range made {
			_ = os.WriteFile(filepath.Join(d, "freezer.state"), []byte("THAWED"), 0)
		}
		_ = cmd.Process.Kill()
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			t.Errorf("sleep %d would not die", cmd.Process.Pid)
		}
		for i := len(made) - 1; i >= 0; i-- {
			_ = os.Remove(made[i])
		}
	})
	go func() { exited <- cmd.Wait() }()
	var freezer string
	for _, h := range hs {
		d := filepath.Join(h, rel)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatalf("make %s: %v", d, err)
		}
		made = append(made, d, filepath.Join(d, "child"))
		if err := os.Mkdir(filepath.Join(d, "child"), 0o755); err != nil {
			t.Fatal(err)
		}
		// cpuset needs its cpus and mems before it takes a process.
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if b, err := os.ReadFile(filepath.Join(h, f)); err == nil {
				_ = os.WriteFile(filepath.Join(d, f), b, 0)
				_ = os.WriteFile(filepath.Join(d, "child", f), b, 0)
			}
		}
		if err := os.WriteFile(filepath.Join(d, "child", "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
			t.Fatalf("move the sleeper into %s: %v", d, err)
		}
		if _, err := os.Stat(filepath.Join(d, "child", "freezer.state")); err == nil {
			freezer = filepath.Join(d, "child", "freezer.state")
		}
	}
	if freezer != "" {
		if err := os.WriteFile(freezer, []byte("FROZEN"), 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := Destroy(Root, rel); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err // for the cleanup
	case <-time.After(5 * time.Second):
		t.Fatal("the process in the cgroup still runs")
	}
	for _, d := range made {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s is still there (%v)", d, err)
		}
	}
	if err := Destroy(Root, rel); err != nil {
		t.Errorf("a second Destroy: %v", err)
	}
	for _, bad := range []string{"", "/", "/.."} {
		if err := Destroy(Root, bad); err == nil {
			t.Errorf("Destroy(%q) went ahead", bad)
		}
	}
}
