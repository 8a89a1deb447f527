package runc

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ferry-migrate/ferry/internal/cgroups"
)

// CRIUConfigAnnotation is the OCI annotation naming the CRIU configuration
// file runc hands CRIU for a container (without it runc names
// /etc/criu/runc.conf).
const CRIUConfigAnnotation = "org.criu.config"

// CRIUConfig is what a dump or a restore asks of CRIU through a
// configuration file, for runtimes that pass CRIU no such option themselves (runc reads the
// file the container's CRIUConfigAnnotation names; ferry-runc, Docker's,
// the one a checkpoint carries). A file runc names overrides what runc
// asks over RPC, work directory included.
type CRIUConfig struct {
	// NoNetworkLock (a dump's) leaves the network as it is: the caller
	// keeps it quiet; the restore takes the lock method from the images.
	NoNetworkLock bool
	// LeaveStopped leaves the processes a restore brings back stopped
	// (SIGSTOP), so that a copy that is never committed never runs;
	// ContinueAll lets them run. The runtime reports such a container
	// running.
	LeaveStopped bool
	// TCPEstablished restores established TCP connections; TCPClose
	// dumps them without their state and restores them closed (their
	// peers cannot reach the copy: the address stayed behind).
	TCPEstablished, TCPClose bool
	// LazyPages restores with the memory left to a lazy-pages daemon,
	// whose socket is in WorkDir (CRIU connects to it relative to its
	// work directory).
	LazyPages bool
	WorkDir   string
	// ImagesDir, where set, is the images directory CRIU reads, instead
	// of the one runc names (a gated restore's: restoregate.go).
	ImagesDir string
	// ActionScript is a script CRIU runs at each of its actions.
	ActionScript string
	// CgroupYard is a cgroup yard (cgroups.Yard): CRIU opens the
	// hierarchies there instead of mounting each anew (WithYard).
	CgroupYard string
	// IrmapScanPaths are where a dump looks for the path of an inode
	// whose handle it cannot open (an inotify watch on an overlay root's
	// file). Paths a configuration file cannot hold are left out.
	IrmapScanPaths []string
}

// WithYard gives c a cgroup yard in dir, or none where one cannot be made
// there: CRIU then mounts the hierarchies itself, only slower.
func (c CRIUConfig) WithYard(dir string) CRIUConfig {
	c.CgroupYard = ""
	if y := filepath.Join(dir, "cgroup-yard"); dir != "" && ConfigSafe(y) && cgroups.Yard(y) == nil {
		c.CgroupYard = y
	}
	return c
}

// String is the file's contents.
func (c CRIUConfig) String() string {
	var b strings.Builder
	for _, o := range []struct {
		on   bool
		line string
	}{{c.NoNetworkLock, "network-lock skip"}, {c.LeaveStopped, "leave-stopped"}, {c.TCPEstablished, "tcp-established"}, {c.TCPClose, "tcp-close"}, {c.LazyPages, "lazy-pages"}, {c.WorkDir != "", "work-dir " + c.WorkDir}, {c.ImagesDir != "", "images-dir " + c.ImagesDir}, {c.ActionScript != "", "action-script " + c.ActionScript}, {c.CgroupYard != "", "cgroup-yard " + c.CgroupYard}} {
		if o.on {
			b.WriteString(o.line + "\n")
		}
	}
	for _, p := range c.IrmapScanPaths {
		if ConfigSafe(p) && p != "" {
			b.WriteString("irmap-scan-path " + p + "\n")
		}
	}
	return b.String()
}

// Write writes the file at path. After the restore, call
// ClearCRIUConfig: runc hands the same file to later dumps, which must
// not leave the container stopped.
func (c CRIUConfig) Write(path string) error {
	for _, dir := range []string{c.WorkDir, c.ImagesDir, c.ActionScript} {
		if !ConfigSafe(dir) {
			return fmt.Errorf("CRIU's configuration file cannot name the directory %q: choose a scratch directory without spaces, quotes or #", dir)
		}
	}
	return replaceFile(path, []byte(c.String()))
}

// replaceFile writes a new file at path by renaming one over it: what was
// there may be a restore's gate, a FIFO that writing would block on or
// feed (restoregate.go).
func replaceFile(path string, b []byte) error {
	tmp := path + ".new"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

// ConfigSafe says a path can go in a CRIU configuration file as it is:
// CRIU splits a line at white space and reads quotes and # itself.
func ConfigSafe(path string) bool { return !strings.ContainsAny(path, " \t\n\"#\\") }

// LeaveStopped writes a CRIU configuration file at path that leaves the
// restored processes stopped (CRIUConfig.LeaveStopped).
func LeaveStopped(path string) error { return CRIUConfig{LeaveStopped: true}.Write(path) }

// ClearCRIUConfig empties the file LeaveStopped wrote, keeping it: the
// container's annotation still names it.
func ClearCRIUConfig(path string) error { return replaceFile(path, nil) }

// AnnotateCRIUConfig sets a bundle's config.json to name conf as its CRIU
// configuration file, keeping every other field as it is.
func AnnotateCRIUConfig(configJSON, conf string) error {
	b, err := os.ReadFile(configJSON)
	if err != nil {
		return err
	}
	var spec map[string]json.RawMessage
	if err := json.Unmarshal(b, &spec); err != nil {
		return fmt.Errorf("%s: %w", configJSON, err)
	}
	ann := map[string]string{}
	if raw, ok := spec["annotations"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &ann); err != nil {
			return fmt.Errorf("%s: annotations: %w", configJSON, err)
		}
	}
	ann[CRIUConfigAnnotation] = conf
	if spec["annotations"], err = json.Marshal(ann); err != nil {
		return err
	}
	if b, err = json.MarshalIndent(spec, "", "  "); err != nil {
		return err
	}
	st, err := os.Stat(configJSON)
	if err != nil {
		return err
	}
	return os.WriteFile(configJSON, b, st.Mode().Perm())
}
