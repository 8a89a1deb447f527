package procs

import (
	"time"

	"github.com/prometheus/procfs"
)

// CPUTime is the CPU time (user and system) the processes pids have used
// so far; a process gone meanwhile counts for nothing.
func CPUTime(pids []int) time.Duration {
	var s float64
	for _, pid := range pids {
		p, err := procfs.NewProc(pid)
		if err != nil {
			continue
		}
		st, err := p.Stat()
		if err != nil {
			continue
		}
		s += st.CPUTime()
	}
	return time.Duration(s * float64(time.Second))
}
