package fault

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// actEnv makes the test binary play an agent that carries out the faults
// it names (FAULTS, ACTION@PHASE comma-separated) at PHASE on SIDE: it
// first starts a "criu" (sleep under that name) below itself when CRIU is
// set, then calls At and reports on stdout what became of that CRIU and of
// a SIGTERM, until it is killed or 1.5 s pass.
const actEnv = "FERRY_TEST_FAULT_ACT"

func TestMain(m *testing.M) {
	if os.Getenv(actEnv) == "1" {
		playAgent()
		return
	}
	os.Exit(m.Run())
}

func playAgent() {
	set, err := ParseSet(strings.Split(os.Getenv("FAULTS"), ","))
	if err != nil {
		fmt.Println("bad faults:", err)
		os.Exit(2)
	}
	side := Source
	if os.Getenv("SIDE") == "destination" {
		side = Destination
	}
	terms := make(chan os.Signal, 1)
	signal.Notify(terms, syscall.SIGTERM)
	var criu *exec.Cmd
	if name := os.Getenv("CRIU"); name != "" {
		criu = exec.Command(name, "30")
		if err := criu.Start(); err != nil {
			fmt.Println("criu:", err)
			os.Exit(2)
		}
		defer criu.Process.Kill()
	}
	set.At(side, os.Getenv("PHASE"))
	fmt.Println("at returned")
	criuDone := make(chan error, 1)
	if criu != nil {
		go func() { criuDone <- criu.Wait() }()
	}
	select {
	case <-terms:
		fmt.Println("sigterm")
	case err := <-criuDone:
		fmt.Println("criu ended:", err)
	case <-time.After(1500 * time.Millisecond):
		fmt.Println("nothing happened")
	}
}

// act runs the playing agent and returns its lines and how it ended.
func act(t *testing.T, side, phase, faults string, withCRIU bool) ([]string, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), actEnv+"=1", "SIDE="+side, "PHASE="+phase, "FAULTS="+faults)
	if withCRIU {
		cmd.Env = append(cmd.Env, "CRIU="+criuLink(t))
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var lines []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines, cmd.Wait()
}

func killed(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// An agent asked to die at a phase dies there (SIGKILL, At never
// returns), on its own side only; asked to stop, it gets SIGTERM and goes
// on; a fault due at another phase does nothing.
func TestAgentFaults(t *testing.T) {
	lines, err := act(t, "source", Freeze, "kill-source@freeze", false)
	if !killed(err) || len(lines) != 0 {
		t.Errorf("kill-source@freeze at the source's freeze: %v, printed %q", err, lines)
	}
	lines, err = act(t, "destination", Freeze, "kill-source@freeze", false)
	if err != nil || strings.Join(lines, "|") != "at returned|nothing happened" {
		t.Errorf("kill-source@freeze at the destination: %v, %q", err, lines)
	}
	lines, err = act(t, "source", Commit, "kill-source@freeze", false)
	if err != nil || strings.Join(lines, "|") != "at returned|nothing happened" {
		t.Errorf("kill-source@freeze at the commit: %v, %q", err, lines)
	}
	lines, err = act(t, "destination", Restore, "term-destination@restore", false)
	if err != nil || strings.Join(lines, "|") != "at returned|sigterm" {
		t.Errorf("term-destination@restore: %v, %q", err, lines)
	}
}

// A CRIU kill finds this agent's CRIU below it and kills that, not the
// agent; an agent asked to die in the dump waits for its CRIU to run
// first, then dies with it running.
func TestCRIUFaults(t *testing.T) {
	lines, err := act(t, "source", Dump, "kill-source-criu@dump", true)
	if err != nil || len(lines) != 2 || lines[0] != "at returned" || !strings.Contains(lines[1], "criu ended: signal: killed") {
		t.Errorf("kill-source-criu@dump: %v, %q", err, lines)
	}
	lines, err = act(t, "destination", Dump, "kill-source-criu@dump", true)
	if err != nil || strings.Join(lines, "|") != "at returned|nothing happened" {
		t.Errorf("the source's CRIU kill at the destination: %v, %q", err, lines)
	}
	start := time.Now()
	lines, err = act(t, "source", Dump, "kill-source@dump", true)
	if !killed(err) || len(lines) != 1 || lines[0] != "at returned" {
		t.Errorf("kill-source@dump: %v, %q", err, lines)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the agent waited %v for a CRIU that was running", d)
	}
}

// criuLink is a sleep(1) named criu (procs finds CRIU by its command
// name), in a directory of the test's.
func criuLink(t *testing.T) string {
	t.Helper()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skipf("skipped: no sleep to play CRIU: %v", err)
	}
	link := filepath.Join(t.TempDir(), "criu")
	if err := os.Symlink(sleep, link); err != nil {
		t.Fatal(err)
	}
	return link
}

// runtimeRestoring plays a runtime below this process (the agent) whose
// CRIU restores: a shell starts a CRIU (sleeping secs), and with fork
// set, 300 ms later a second below the shell, as CRIU forks the first
// task it restores. It prints how the first CRIU ended, and whether the
// task still ran then.
func runtimeRestoring(t *testing.T, secs string, fork bool) *exec.Cmd {
	t.Helper()
	script := `"$0" "$1" & first=$!; `
	if fork {
		script += `sleep 0.3; "$0" 5 & task=$!; `
	}
	script += `wait $first 2>/dev/null; echo "first $?"; [ -z "$task" ] || { kill $task && echo "task alive"; }`
	return exec.Command("sh", "-c", script, criuLink(t), secs)
}

// A stranded restore: the runtime's CRIU is killed once it forked its
// first task, and that task, the runtime and the agent are not.
func TestStrandKillsTheRestoringCRIUOnceItForked(t *testing.T) {
	cmd := runtimeRestoring(t, "3", true)
	start := time.Now()
	out := make(chan []byte, 1)
	go func() { b, _ := cmd.Output(); out <- b }()
	strand(5 * time.Second)
	got := strings.TrimSpace(string(<-out))
	if got != "first 137\ntask alive" { // 128 + SIGKILL
		t.Errorf("the restoring CRIU and its task: %q, want the CRIU killed (first 137) and the task alive", got)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("killed after %v, before the fork", d)
	}
}

// A restoring CRIU that never forks is let go on, continued, when the
// time runs out; a CRIU of the agent's own is never touched.
func TestStrandLeavesOtherCRIUsRunning(t *testing.T) {
	cmd := runtimeRestoring(t, "1", false)
	out := make(chan []byte, 1)
	go func() { b, _ := cmd.Output(); out <- b }()
	strand(300 * time.Millisecond)
	select {
	case b := <-out:
		if got := strings.TrimSpace(string(b)); got != "first 0" {
			t.Errorf("a CRIU that never forked: %q, want it to end on its own (first 0)", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a CRIU that never forked was left stopped")
	}

	own := exec.Command(criuLink(t), "0.5")
	if err := own.Start(); err != nil {
		t.Fatal(err)
	}
	strand(300 * time.Millisecond)
	if err := own.Wait(); err != nil {
		t.Errorf("the agent's own CRIU: %v", err)
	}
}
