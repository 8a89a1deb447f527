package kubelab

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/ferry-migrate/ferry/internal/procs"
)

// state is what Up made outside plain files under Dir, recorded in
// DIR/state.json before (or, for a process, right after) it is made, so
// that Down finds everything even when Up's caller crashed midway.
type state struct {
	// Name and CgroupParent: every cgroup of the cluster is below
	// CgroupParent, in every hierarchy.
	Name         string `json:"name"`
	CgroupParent string `json:"cgroupParent"`
	// NodeCgroupRoots are the kubelets' cgroup roots (pods live there).
	NodeCgroupRoots []string `json:"nodeCgroupRoots"`
	// Processes in start order.
	Processes []process `json:"processes"`
	// Routes Up added, and the CNI bridges its network configs make.
	Routes  []route  `json:"routes"`
	Bridges []bridge `json:"bridges"`
	// KubeletNetNS are the namespaces kubelets ran in, where they leave
	// iptables chains.
	KubeletNetNS []string `json:"kubeletNetNS"`
	// CNINetworks name the entries containerd's CNI library caches in the
	// machine-wide /var/lib/cni/results.
	CNINetworks []string `json:"cniNetworks"`
	// MadeMachineDirs are the directories of machineDirs that did not
	// exist before Up: the kubelets made them, and Down removes them.
	MadeMachineDirs []string `json:"madeMachineDirs"`

	mu   sync.Mutex
	path string
}

// process is one daemon Up started. Start (the process's start time, in
// clock ticks after boot) tells it from a later process given the same
// PID.
type process struct {
	Name  string `json:"name"`
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
	Log   string `json:"log"`
}

type route struct {
	NetNS string `json:"netns"`
	Dst   string `json:"dst"`
	Via   string `json:"via"`
}

type bridge struct {
	NetNS string `json:"netns"`
	Name  string `json:"name"`
}

// errNoState: Dir holds no cluster.
var errNoState = errors.New("no kubelab state")

func loadState(path string) (*state, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errNoState
	}
	if err != nil {
		return nil, err
	}
	s := &state{path: path}
	if err := json.Unmarshal(b, s); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// update changes the state under its lock and saves it at once.
func (s *state) update(change func(*state)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	change(s)
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp := s.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, s.path)
}

// processStart is pid's start time from /proc/PID/stat (field 22), 0 when
// pid is gone.
func processStart(pid int) uint64 {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	// The command (field 2) may hold spaces and parentheses: count fields
	// after its closing parenthesis.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	fields := strings.Fields(string(b[i+1:]))
	// fields[0] is field 3 (state), so field 22 is fields[19].
	if len(fields) < 20 {
		return 0
	}
	v, _ := strconv.ParseUint(fields[19], 10, 64)
	return v
}

// alive reports whether p is still the process Up started.
func (p process) alive() bool {
	return p.PID > 0 && p.Start != 0 && procs.Alive(p.PID) && processStart(p.PID) == p.Start
}
