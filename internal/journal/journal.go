// Package journal records each migration's state on one host durably: a
// state is written and synced before the agent acts on it, so an agent
// restarted after a crash or a reboot knows what it was doing and can
// finish or roll back (see agent/recover.go). One small file per
// migration, replaced atomically at each transition.
package journal

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"time"

	"github.com/google/renameio/v2"
)

// Roles.
const (
	Source      = "source"
	Destination = "destination"
)

// States. A source goes frozen -> commit-sent -> removed, or -> resumed,
// or stays in-doubt until its destination says what became of its copy;
// it is lost when its copy's processes died before it could resume
// (before any commit, or with the destination's copy dropped). A
// destination goes prepared -> restoring -> committed -> started, or ->
// dropped from either of the first two; a lazy (post-copy) one restoring ->
// pulling -> started, or -> dropped.
const (
	// Source states.
	// Copying: the container runs here, pre-copy's rounds under way, and
	// the migration changed it (auto-converge's CPU throttle): recorded so
	// that an agent that dies puts it back.
	Copying    = "copying"
	Frozen     = "frozen"      // the container is (about to be) frozen here
	CommitSent = "commit-sent" // the destination may own the container now
	InDoubt    = "in-doubt"    // frozen; the outcome is the destination's to say
	Removed    = "removed"     // final: the destination owns it
	Resumed    = "resumed"     // final: it runs here again
	Lost       = "lost"        // final: its processes died here and no copy runs
	// Diverged is final: the destination committed while the frozen copy
	// here had been resumed by hand; both ran, and neither was removed.
	Diverged = "diverged"
	// Destination states.
	Prepared  = "prepared"  // the runtime holds a container made for it; none runs
	Restoring = "restoring" // a copy may run here, not yet committed
	Committed = "committed" // final: this host owns the container
	Pulling   = "pulling"   // runs here, its memory still coming from the source
	Started   = "started"   // final: and runs it (after a stopped restore)
	Dropped   = "dropped"   // final: this host's copy is gone
)

// Final reports whether nothing is left to do for a migration in state s.
func Final(s string) bool {
	switch s {
	case Removed, Resumed, Lost, Diverged, Committed, Started, Dropped:
		return true
	}
	return false
}

// Entry is one migration as this host knows it.
type Entry struct {
	ID   string `json:"id"`
	Role string `json:"role"`
	// Peer is the other host: for a source the destination's address, for
	// a destination the source's host name (as its certificate says).
	Peer      string `json:"peer"`
	Container string `json:"container"`
	Runtime   string `json:"runtime"`
	// Options are the request's options for the runtime (its
	// RuntimeOptions for this kind), for whoever settles the migration.
	Options map[string]string `json:"options,omitempty"`
	// Root is a runc root given with the request, as agents before
	// Options recorded it (read only).
	Root string `json:"root,omitempty"`
	// Volumes name the volumes that move with the container: the source
	// removes them with its copy after the commit, the destination with
	// a copy it drops.
	Volumes []string  `json:"volumes,omitempty"`
	State   string    `json:"state"`
	Updated time.Time `json:"updated"`
	// Pull is a pulling copy's page traffic, which outlives the agent.
	Pull *Pull `json:"pull,omitempty"`
	// Throttled: auto-converge throttled the source copy's CPU; whoever
	// resumes it puts the limit back.
	Throttled bool `json:"throttled,omitempty"`
	// NetNS is the network namespace ferry made for the container on this
	// host (cnet): a source resuming its copy turns it back on, a
	// destination dropping its copy deletes it.
	NetNS string `json:"netns,omitempty"`
	// Links is the namespace of a container its runtime put on a shared
	// segment, whose links the source took down at the freeze: whoever
	// resumes the copy brings them back.
	Links string `json:"links,omitempty"`
	// LinkBridges are the bridges the peers of its veths left (interface
	// name to bridge), to be put back on.
	LinkBridges map[string]string `json:"link_bridges,omitempty"`
}

// Pull is where a lazily restored copy's memory comes through at the
// destination while no agent serves it: the lazy-pages daemon, and the
// work directory where it and its relay (whose socket is found there)
// work. A local pull has no relay: its daemon reads the images in Dir
// (pre-copy's restore), and only has to be let finish.
type Pull struct {
	Daemon int    `json:"daemon"` // criu lazy-pages
	Dir    string `json:"dir"`
	Local  bool   `json:"local,omitempty"`
}

// Journal is one host's records, in a directory.
type Journal struct{ dir string }

// Open opens (creating) the journal in dir.
func Open(dir string) (*Journal, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return &Journal{dir: dir}, nil
}

// validID keeps a peer-supplied ID a plain file name.
var validID = regexp.MustCompile(`^[0-9a-f]{1,64}$`)

func (j *Journal) path(id string) (string, error) {
	if !validID.MatchString(id) {
		return "", fmt.Errorf("journal: bad migration ID %q", id)
	}
	return filepath.Join(j.dir, id+".json"), nil
}

// Record writes e (stamped now) and syncs it to disk before returning.
func (j *Journal) Record(e Entry) error {
	p, err := j.path(e.ID)
	if err != nil {
		return err
	}
	e.Updated = time.Now().UTC()
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	// Written and synced under another name, then renamed over: a crash
	// leaves the old entry or the new one, never half of either.
	if err := renameio.WriteFile(p, b, 0o600); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	// The rename is durable only once the directory is.
	d, err := os.Open(j.dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Set records a new state for a known migration.
func (j *Journal) Set(id, state string) error {
	e, ok, err := j.Get(id)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("journal: no migration %s", id)
	}
	e.State = state
	return j.Record(e)
}

// Get returns the entry of a migration, if recorded.
func (j *Journal) Get(id string) (Entry, bool, error) {
	p, err := j.path(id)
	if err != nil {
		return Entry{}, false, err
	}
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return Entry{}, false, nil
	}
	if err != nil {
		return Entry{}, false, err
	}
	var e Entry
	if err := json.Unmarshal(b, &e); err != nil {
		return Entry{}, false, fmt.Errorf("journal: %s: %w", p, err)
	}
	return e, true, nil
}

// Pending lists the migrations not in a final state, oldest first.
func (j *Journal) Pending() ([]Entry, error) {
	all, err := j.All()
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, e := range all {
		if !Final(e.State) {
			out = append(out, e)
		}
	}
	return out, nil
}

// All lists every recorded migration, oldest first.
func (j *Journal) All() ([]Entry, error) {
	names, err := filepath.Glob(filepath.Join(j.dir, "*.json"))
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, n := range names {
		id := filepath.Base(n)
		id = id[:len(id)-len(".json")]
		e, ok, err := j.Get(id)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, e)
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Updated.Before(out[b].Updated) })
	return out, nil
}

// Prune removes the entries that can no longer matter, once older than
// maxAge: a source's final ones, and a destination's dropped ones (its
// answer for a migration it has no entry of, "unknown", means the same to
// a source: resume). A destination's committed or started entry stays:
// a source left in doubt may ask about it however late, and without it
// would hear "unknown" and resume a container that runs here.
func (j *Journal) Prune(maxAge time.Duration) (int, error) {
	all, err := j.All()
	if err != nil {
		return 0, err
	}
	n := 0
	cutoff := time.Now().Add(-maxAge)
	for _, e := range all {
		old := e.Updated.Before(cutoff)
		gone := (e.Role == Source && Final(e.State)) || (e.Role == Destination && e.State == Dropped)
		if !old || !gone {
			continue
		}
		p, err := j.path(e.ID)
		if err != nil {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return n, err
		}
		n++
	}
	return n, nil
}

// RuntimeOptions are the options the migration's runtime was given, by
// kind (api.Request's RuntimeOptions); an older entry's Root is runc's
// root option.
func (e Entry) RuntimeOptions() map[string]map[string]string {
	o := e.Options
	if len(o) == 0 && e.Root != "" && e.Runtime == "runc" {
		o = map[string]string{"root": e.Root}
	}
	if len(o) == 0 {
		return nil
	}
	return map[string]map[string]string{e.Runtime: o}
}
