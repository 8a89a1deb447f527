package rootfs

import (
	"cmp"
	"slices"
)

// Delta is what turns one tree into another.
type Delta struct {
	// Changed holds entries to create or update, parents before children.
	Changed []Entry
	// Removed holds paths to delete, children before parents.
	Removed []string
}

// Empty reports whether the delta changes nothing.
func (d Delta) Empty() bool { return len(d.Changed) == 0 && len(d.Removed) == 0 }

// Diff returns what to send to turn have into want. An entry is sent when it
// is new or differs in type, mode, owner, mtime, size, symlink target or
// device number; regular files are compared by size and mtime only, like
// rsync's quick check.
func Diff(have, want Manifest) Delta {
	var d Delta
	for p, w := range want {
		if h, ok := have[p]; !ok || !sameEntry(h, w) {
			w.Path = p
			d.Changed = append(d.Changed, w)
		}
	}
	for p := range have {
		if _, ok := want[p]; !ok {
			d.Removed = append(d.Removed, p)
		}
	}
	d.sort()
	return d
}

// sort puts parents before children in Changed, children before parents
// in Removed.
func (d *Delta) sort() {
	slices.SortFunc(d.Changed, func(a, b Entry) int { return comparePaths(a.Path, b.Path) })
	slices.SortFunc(d.Removed, func(a, b string) int { return comparePaths(b, a) })
}

func sameEntry(a, b Entry) bool {
	return a.Mode == b.Mode && a.Size == b.Size && a.MtimeNs == b.MtimeNs &&
		a.UID == b.UID && a.GID == b.GID && a.Link == b.Link && a.Dev == b.Dev
}

// comparePaths orders slash paths so that a directory comes right before
// everything beneath it ('/' sorts before any other byte), which keeps a
// directory's entries together in a stream.
func comparePaths(a, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		ca, cb := a[i], b[i]
		if ca == cb {
			continue
		}
		if ca == '/' {
			return -1
		}
		if cb == '/' {
			return 1
		}
		return cmp.Compare(ca, cb)
	}
	return cmp.Compare(len(a), len(b))
}
