package journal

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestRecordGetSetPending(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "journal")
	j, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := j.Get("abc123"); ok || err != nil {
		t.Fatalf("an empty journal has abc123: %v %v", ok, err)
	}
	src := Entry{ID: "abc123", Role: Source, Peer: "10.0.0.2:7070", Container: "web", Runtime: "runc", State: Frozen}
	dst := Entry{ID: "def456", Role: Destination, Peer: "h1", Container: "db", Runtime: "podman", State: Restoring}
	for _, e := range []Entry{src, dst} {
		if err := j.Record(e); err != nil {
			t.Fatal(err)
		}
	}
	got, ok, err := j.Get("abc123")
	if err != nil || !ok || got.Container != "web" || got.State != Frozen || got.Updated.IsZero() {
		t.Fatalf("get: %+v %v %v", got, ok, err)
	}
	// A reopened journal (an agent restarted) sees the same.
	j2, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	pend, err := j2.Pending()
	if err != nil || len(pend) != 2 {
		t.Fatalf("pending after reopen: %+v %v", pend, err)
	}
	if err := j2.Set("abc123", Removed); err != nil {
		t.Fatal(err)
	}
	if err := j2.Set("def456", Committed); err != nil {
		t.Fatal(err)
	}
	if pend, _ := j2.Pending(); len(pend) != 0 {
		t.Errorf("final states still pending: %+v", pend)
	}
	if all, _ := j2.All(); len(all) != 2 {
		t.Errorf("all: %+v", all)
	}
	if err := j2.Set("0000", Resumed); err == nil {
		t.Error("set of an unknown migration accepted")
	}
	left, _ := filepath.Glob(filepath.Join(dir, "*.tmp"))
	if len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// IDs come from peers: none may name a path outside the journal.
func TestBadIDsRefused(t *testing.T) {
	j, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"", "../x", "a/b", "ABC", "x.json", string(make([]byte, 65))} {
		if err := j.Record(Entry{ID: id, State: Frozen}); err == nil {
			t.Errorf("Record(%q) accepted", id)
		}
		if _, _, err := j.Get(id); err == nil {
			t.Errorf("Get(%q) accepted", id)
		}
	}
}

func TestCorruptEntryIsAnError(t *testing.T) {
	dir := t.TempDir()
	j, _ := Open(dir)
	if err := os.WriteFile(filepath.Join(dir, "abc.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := j.Get("abc"); err == nil {
		t.Error("a corrupt entry read without error")
	}
	if _, err := j.Pending(); err == nil {
		t.Error("Pending hid a corrupt entry")
	}
}

func TestFinal(t *testing.T) {
	for s, want := range map[string]bool{Frozen: false, CommitSent: false, InDoubt: false, Restoring: false,
		Removed: true, Resumed: true, Committed: true, Dropped: true} {
		if Final(s) != want {
			t.Errorf("Final(%s) = %v", s, !want)
		}
	}
}

// Old entries that no longer matter go; a destination's committed or
// started one stays however old, and anything recent stays.
func TestPrune(t *testing.T) {
	j, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []Entry{
		{ID: "a1", Role: Source, State: Removed},
		{ID: "a2", Role: Source, State: InDoubt},
		{ID: "a3", Role: Destination, State: Dropped},
		{ID: "a4", Role: Destination, State: Started},
		{ID: "a5", Role: Destination, State: Committed},
	} {
		if err := j.Record(e); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := j.Prune(time.Hour); err != nil || n != 0 {
		t.Fatalf("pruned %d recent entries: %v", n, err)
	}
	time.Sleep(10 * time.Millisecond)
	if n, err := j.Prune(time.Millisecond); err != nil || n != 2 {
		t.Fatalf("pruned %d, want 2: %v", n, err)
	}
	for _, id := range []string{"a2", "a4", "a5"} {
		if _, ok, _ := j.Get(id); !ok {
			t.Errorf("%s pruned", id)
		}
	}
}
