package criu

import (
	"bufio"
	"fmt"
	"slices"
	"strings"
)

// Patches are the ferry patches (scripts/criu-patches) a CRIU carries, by
// number ("0001"), sorted. Patch 0016 makes `criu --version` name them; a
// CRIU without that line (a distribution's, or ferry's built before 0016)
// counts as carrying none, since ferry cannot tell.
type Patches []string

// patchesPrefix starts the line patch 0016 adds to `criu --version`.
const patchesPrefix = "ferry-patches:"

// ParsePatches reads the patch list from `criu --version`'s output; nil
// when the output has no such line.
func ParsePatches(versionOut string) Patches {
	sc := bufio.NewScanner(strings.NewReader(versionOut))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), patchesPrefix)
		if !ok {
			continue
		}
		p := Patches{}
		for id := range strings.SplitSeq(rest, ",") {
			if id = strings.TrimSpace(id); id != "" && !slices.Contains(p, id) {
				p = append(p, id)
			}
		}
		slices.Sort(p)
		return p
	}
	return nil
}

// Has says whether the patch numbered id is in p.
func (p Patches) Has(id string) bool { return slices.Contains(p, id) }

// String is the list as `criu --version` prints it, or "none".
func (p Patches) String() string {
	if len(p) == 0 {
		return "none"
	}
	return strings.Join(p, ",")
}

// Side is the end of a migration whose CRIU a patch changes.
type Side string

const (
	Source      Side = "source"
	Destination Side = "destination"
)

// Effect is what a migration suffers where a patch is missing.
type Effect int

const (
	// Slower: the migration works, with more downtime or a longer pull,
	// or with less safety.
	Slower Effect = iota
	// FailsSome: the migration fails for some containers, on some hosts;
	// not refused beforehand since ferry cannot tell them in advance.
	FailsSome
	// Fails: the migration fails or hangs; ferry refuses it before the
	// freeze.
	Fails
)

func (e Effect) String() string {
	switch e {
	case FailsSome:
		return "fails for some containers"
	case Fails:
		return "fails"
	}
	return "slower"
}

// The techniques as ferry check and the engine name them (engine.Modes);
// literals, since the engine imports this package.
var (
	allTechniques  = []string{"cold", "cold/rebuild", "precopy", "precopy/rebuild", "precopy/native", "postcopy", "hybrid"}
	lazyDumps      = []string{"cold/rebuild", "precopy/rebuild", "postcopy", "hybrid"}
	lazyFromSource = []string{"postcopy", "hybrid"}
	// ownImagesLazily: the destination completes a memory-less dump's
	// images and restores lazily from them (where its runtime restores
	// lazily).
	ownImagesLazily = []string{"cold/rebuild", "precopy/rebuild"}
)

// Patch is one of ferry's CRIU patches: where it acts and what a
// migration loses without it (each patch's header in scripts/criu-patches
// says more).
type Patch struct {
	ID    string
	Title string
	// Side is the end whose CRIU must carry it for Techniques.
	Side   Side
	Effect Effect
	// Without says what happens without it.
	Without string
	// Techniques it matters to (engine.Modes' keys: a mode, or a mode and
	// its switchover or engine).
	Techniques []string
	// ReaderNeeds: a CRIU with this patch dumps images that only a CRIU
	// with ReaderNeeds restores, so a destination lacking it cannot take
	// a container from a source that has this one.
	ReaderNeeds string
}

// KnownPatches are ferry's CRIU patches, in order. A test keeps the list
// and scripts/criu-patches in step.
var KnownPatches = []Patch{
	{ID: "0001", Title: "page-xfer: uncork before close", Side: Source, Techniques: allTechniques,
		Without: "every dump streamed to ferry's page server waits out TCP_CORK's 200 ms: 200 ms more downtime"},
	{ID: "0002", Title: "lazy dump: pages stay in the task", Side: Source, Techniques: lazyDumps,
		Without: "a lazy dump's frozen time grows with memory (~30 ms more at 1 GiB)"},
	{ID: "0003", Title: "dump: rlimits from /proc", Side: Source, Effect: FailsSome, Techniques: allTechniques,
		Without: "the dump fails (\"Can't get rlimit\") for a container whose processes changed user where the agent lacks CAP_SYS_RESOURCE"},
	{ID: "0004", Title: "lazy-pages: keep up with a local server", Side: Destination, Techniques: lazyFromSource,
		Without: "the lazy-pages daemon spins a CPU and trails the stream: the pull takes longer, faults wait longer"},
	{ID: "0005", Title: "dump: skip empty tmpfs, untracked conntrack", Side: Source, Techniques: allTechniques, ReaderNeeds: "0005",
		Without: "~10 ms more downtime at the dump and ~10 ms at the restore (tar for empty tmpfs, conntrack walk)"},
	{ID: "0006", Title: "lazy-pages: complete reads from a parent image", Side: Destination, Effect: Fails, Techniques: ownImagesLazily,
		Without: "a lazy restore from the destination's own images never fills pages kept in the parent image: the copy hangs"},
	{ID: "0007", Title: "lazy dump: copy only the iovs in use", Side: Source, Techniques: lazyDumps,
		Without: "a lazy dump's frozen time grows with memory (~31 ms at 1 GiB)"},
	{ID: "0008", Title: "lazy page server: uncork the close answer", Side: Source, Techniques: lazyFromSource,
		Without: "each post-copy pull ends 200 ms after its last page, the source's frozen copy held that long"},
	{ID: "0009", Title: "dump: anonymous memory without file lookups", Side: Source, Techniques: allTechniques,
		Without: "~16 ms more downtime per GiB (the frozen pagemap scan looks up every page)"},
	{ID: "0010", Title: "tmpfs: archive without gzip", Side: Source, Techniques: allTechniques, ReaderNeeds: "0010",
		Without: "gzip on /dev's archive: ~3-4 ms more downtime at the dump and at the restore"},
	{ID: "0011", Title: "dump: add page runs at once", Side: Source, Techniques: allTechniques,
		Without: "~4-5 ms more downtime per GiB (pages added to the page pipe one by one)"},
	{ID: "0012", Title: "tmpfs: small archives in CRIU", Side: Source, Techniques: allTechniques, ReaderNeeds: "0010",
		Without: "tar for /dev: 3-7 ms more downtime at the dump, 2.5-3 ms at the restore"},
	{ID: "0013", Title: "action scripts only at listed actions", Side: Source, Techniques: allTechniques,
		Without: "the dump gate's script runs at every action: 1-4 ms more downtime each, a lazy dump's readiness later"},
	{ID: "0014", Title: "dump: mappings from a smaps snapshot", Side: Source, Techniques: allTechniques,
		Without: "the frozen dump reads smaps: 13-20 ms more downtime per GiB"},
	{ID: "0015", Title: "compel: rescue records", Side: Source, Techniques: allTechniques,
		Without: "a CRIU killed or crashed inside the container's processes takes them with it: the agent cannot rescue them"},
	{ID: "0016", Title: "criu --version names the ferry patches", Side: Source,
		Without: "ferry cannot tell which patches this CRIU carries and takes it for a stock CRIU"},
}

// Ferrys is every known patch: what ferry's own CRIU carries.
func Ferrys() Patches {
	out := make(Patches, len(KnownPatches))
	for i, k := range KnownPatches {
		out[i] = k.ID
	}
	return out
}

// LookupPatch finds a known patch by number.
func LookupPatch(id string) (Patch, bool) {
	i := slices.IndexFunc(KnownPatches, func(p Patch) bool { return p.ID == id })
	if i < 0 {
		return Patch{}, false
	}
	return KnownPatches[i], true
}

// Matters says whether the patch matters to a technique key ("precopy",
// "precopy/rebuild") on a side.
func (p Patch) Matters(technique string, side Side) bool {
	return p.Side == side && slices.Contains(p.Techniques, technique)
}

// Missing lists the known patches have lacks, in order.
func (p Patches) Missing() []Patch {
	var out []Patch
	for _, k := range KnownPatches {
		if !p.Has(k.ID) {
			out = append(out, k)
		}
	}
	return out
}

// Job is what one migration asks of one host's CRIU, for Blocking.
type Job struct {
	// Technique is the engine's key (engine.Modes).
	Technique string
	Side      Side
	// LazyRestore: the destination's runtime restores lazily. Without it
	// a rebuild restores its own images plainly and needs no 0006.
	LazyRestore bool
}

// Blocking lists the patches whose absence from have makes job fail
// (Effect Fails): the migration must be refused before the freeze.
func Blocking(have Patches, job Job) []Patch {
	var out []Patch
	for _, k := range KnownPatches {
		if k.Effect != Fails || have.Has(k.ID) || !k.Matters(job.Technique, job.Side) {
			continue
		}
		if slices.Contains(ownImagesLazily, job.Technique) && !job.LazyRestore {
			continue
		}
		out = append(out, k)
	}
	return out
}

// Unreadable lists the patches a destination with dst lacks to restore
// what a source with src dumps (ReaderNeeds), each once.
func Unreadable(src, dst Patches) []Patch {
	var out []Patch
	for _, k := range KnownPatches {
		if k.ReaderNeeds == "" || !src.Has(k.ID) || dst.Has(k.ReaderNeeds) {
			continue
		}
		need, ok := LookupPatch(k.ReaderNeeds)
		if ok && !slices.ContainsFunc(out, func(p Patch) bool { return p.ID == need.ID }) {
			out = append(out, need)
		}
	}
	return out
}

// IDs lists the patches' numbers, for messages.
func IDs(ps []Patch) string {
	ids := make([]string, len(ps))
	for i, p := range ps {
		ids[i] = fmt.Sprintf("%s (%s)", p.ID, p.Title)
	}
	return strings.Join(ids, ", ")
}
