package learn

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/ferry-migrate/ferry/api"
)

// DefaultKeep is how many reports an agent keeps to learn from.
const DefaultKeep = 200

// storeFile is the history's file in its directory.
const storeFile = "reports.json"

// Store keeps the last reports of an agent's migrations in one file,
// rewritten whole (a rename, so a crash leaves the old or the new one).
type Store struct {
	dir  string
	keep int
	reps []api.Report
}

// OpenStore reads the history in dir (none yet: empty), keeping at most
// keep reports (≤ 0: DefaultKeep).
func OpenStore(dir string, keep int) (*Store, error) {
	if keep <= 0 {
		keep = DefaultKeep
	}
	s := &Store{dir: dir, keep: keep}
	b, err := os.ReadFile(filepath.Join(dir, storeFile))
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &s.reps); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, storeFile), err)
	}
	s.trim()
	return s, nil
}

// Add keeps r, dropping the oldest beyond the bound, and writes the file.
func (s *Store) Add(r api.Report) error {
	s.reps = append(s.reps, r)
	s.trim()
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(s.reps)
	if err != nil {
		return err
	}
	tmp := filepath.Join(s.dir, storeFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(s.dir, storeFile))
}

// Reports are the kept reports, oldest first (the caller must not change
// them).
func (s *Store) Reports() []api.Report { return s.reps }

func (s *Store) trim() {
	if n := len(s.reps); n > s.keep {
		s.reps = append([]api.Report(nil), s.reps[n-s.keep:]...)
	}
}
