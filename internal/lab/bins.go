package lab

import (
	"fmt"
	"os"
	"path/filepath"
)

// The lab runs two binaries: the production ferry for its agents (whose
// directory also holds the workloads, memhog and ferry-workload-*), and
// ferry-lab for the helpers it starts in its hosts (lab-tool: probes,
// clients, link measurements, delay lines). make build puts both in bin/.
const (
	// FerryBinEnv names the ferry binary the agents run.
	FerryBinEnv = "FERRY_BIN"
	// FerryLabBinEnv names the ferry-lab binary whose lab-tool the lab
	// runs; unset, it is the ferry-lab next to the ferry binary.
	FerryLabBinEnv = "FERRY_LAB_BIN"
)

// FerryBin is the production ferry binary for the lab's agents: $FERRY_BIN,
// else this executable if it is ferry, else the ferry next to it (ferry-lab
// in bin/ finds bin/ferry).
func FerryBin() (string, error) {
	if b := os.Getenv(FerryBinEnv); b != "" {
		return filepath.Abs(b)
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find the ferry binary: %w", err)
	}
	if filepath.Base(exe) == "ferry" {
		return exe, nil
	}
	sib := filepath.Join(filepath.Dir(exe), "ferry")
	if _, err := os.Stat(sib); err != nil {
		return "", fmt.Errorf("no ferry binary next to %s (make build puts both in bin/), nor $%s", exe, FerryBinEnv)
	}
	return sib, nil
}

// ToolBin is the ferry-lab binary whose lab-tool the lab runs, given the
// ferry binary its agents run: $FERRY_LAB_BIN, else the ferry-lab beside
// ferry. The agents' binary has no lab-tool: production ferry links no lab.
func ToolBin(ferry string) string {
	if b := os.Getenv(FerryLabBinEnv); b != "" {
		if abs, err := filepath.Abs(b); err == nil {
			return abs
		}
		return b
	}
	return filepath.Join(filepath.Dir(ferry), "ferry-lab")
}
