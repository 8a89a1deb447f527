package procs

import (
	"os"
	"testing"
	"time"
)

func TestCPUTime(t *testing.T) {
	me := []int{os.Getpid()}
	before := CPUTime(me)
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
	}
	if got := CPUTime(me) - before; got < 20*time.Millisecond {
		t.Errorf("50 ms of spinning counted as %v", got)
	}
	if got := CPUTime([]int{1 << 30}); got != 0 {
		t.Errorf("a PID that does not exist: %v", got)
	}
}
