package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-migrate/ferry/internal/lab"
)

// TestKeepStacksHelper is the "agent" TestKeepStacks quits: this test
// binary, asleep, with an agent's command line.
func TestKeepStacksHelper(t *testing.T) {
	if os.Getenv("FERRY_STACKS_HELPER") == "" {
		t.Skip("run by TestKeepStacks")
	}
	time.Sleep(time.Minute)
}

// TestKeepStacks: a hung case's agent quits with every goroutine's stack
// in its log, and the log is kept after the lab's directory goes.
func TestKeepStacks(t *testing.T) {
	dir := t.TempDir()
	h := &lab.Host{ControlSock: filepath.Join(dir, "ctl.sock")}
	h.Name, h.StateDir = "hx", dir
	log, err := os.Create(filepath.Join(dir, "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKeepStacksHelper$", "agent", "--control", h.ControlSock)
	cmd.Env = append(os.Environ(), "FERRY_STACKS_HELPER=1")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	h.AgentPID = cmd.Process.Pid
	time.Sleep(300 * time.Millisecond) // its runtime up, asleep
	if !h.AgentAlive() {
		t.Fatal("the helper does not pass for the host's agent")
	}
	note := keepStacks(h)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("the agent still runs after keepStacks")
	}
	path := note[strings.LastIndex(note, " ")+1:]
	t.Cleanup(func() { _ = os.Remove(path) })
	kept, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%s: %v", note, err)
	}
	if !strings.Contains(string(kept), "goroutine ") || !strings.Contains(string(kept), "SIGQUIT") {
		t.Errorf("kept log has no stacks:\n%s", kept)
	}
}
