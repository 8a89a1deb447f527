package admission

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/moby/sys/capability"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/ferry-migrate/ferry/internal/images"
)

// CheckImages checks the CRIU images in dir against the OCI config.json
// that passed CheckSpec: CRIU restores each task's credentials from its
// core image, not from the configuration, so a peer that sends a modest
// config.json with images whose tasks hold CAP_SYS_ADMIN would have them
// restored here with it. Every task's permitted, effective, inheritable
// and bounding sets must lie within the configuration's bounding set. A
// configuration that is not an OCI one (LXC's) names no set: its images
// are not checked here.
func (p Policy) CheckImages(dir string, spec []byte) error {
	if p.Privileged {
		return nil
	}
	var s specs.Spec
	if err := json.Unmarshal(spec, &s); err != nil || s.Process == nil {
		return nil
	}
	var allowed uint64
	if c := s.Process.Capabilities; c != nil {
		for _, name := range c.Bounding {
			if bit, ok := capBits[name]; ok {
				allowed |= 1 << bit
			}
		}
	}
	tasks, err := images.TaskCaps(dir)
	if err != nil {
		return fmt.Errorf("the CRIU images: %w", err)
	}
	if len(tasks) == 0 {
		return fmt.Errorf("the CRIU images hold no task (no core-*.img)")
	}
	var why []string
	for pid, caps := range tasks {
		if extra := caps &^ allowed; extra != 0 {
			why = append(why, fmt.Sprintf("task %d of the CRIU images holds %s, beyond the configuration's bounding set", pid, capNames(extra)))
		}
	}
	slices.Sort(why)
	return refused(why)
}

// capBits maps "CAP_SYS_ADMIN" to its bit, capName the bit to its name.
var capBits, capName = func() (map[string]int, map[int]string) {
	bits, names := map[string]int{}, map[int]string{}
	for _, c := range capability.ListKnown() {
		name := "CAP_" + strings.ToUpper(c.String())
		bits[name], names[int(c)] = int(c), name
	}
	return bits, names
}()

// capNames names the capabilities of a mask, sorted; a bit this library
// has no name for by its number.
func capNames(mask uint64) string {
	var names []string
	for bit := 0; bit < 64; bit++ {
		if mask&(1<<bit) == 0 {
			continue
		}
		name, ok := capName[bit]
		if !ok {
			name = fmt.Sprintf("capability %d", bit)
		}
		names = append(names, name)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}
