package engine

import (
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// A failed migration's logs (CRIU's dump, restore and lazy-pages logs,
// the runtime's) would go with its scratch directory, and with them the
// reason CRIU failed whenever the report's quoted lines are not enough.
// They are kept under the host's LogsDir, bounded.
const (
	keptLogFile = 256 << 10 // of a longer log, its tail
	keptLogAll  = 1 << 20   // per migration
	keptLogDirs = 20        // migrations whose logs are kept, newest
)

// keepLogs copies every *.log under work into dir/id and removes the
// oldest kept migrations beyond keptLogDirs. It returns the directory, or
// "" when work held no log.
func keepLogs(work, dir, id string) (string, error) {
	var logs []string
	_ = filepath.WalkDir(work, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && strings.HasSuffix(d.Name(), ".log") {
			logs = append(logs, p)
		}
		return nil
	})
	if len(logs) == 0 {
		return "", nil
	}
	out := filepath.Join(dir, id)
	if err := os.MkdirAll(out, 0o700); err != nil {
		return "", err
	}
	budget := int64(keptLogAll)
	for _, p := range logs {
		if budget <= 0 {
			break
		}
		rel, _ := filepath.Rel(work, p)
		n, err := copyTail(p, filepath.Join(out, strings.ReplaceAll(rel, string(filepath.Separator), "_")), min(keptLogFile, budget))
		if err != nil {
			return out, err
		}
		budget -= n
	}
	return out, pruneKept(dir, keptLogDirs)
}

// copyTail copies at most the last limit bytes of src to dst.
func copyTail(src, dst string, limit int64) (int64, error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return 0, err
	}
	if st.Size() > limit {
		if _, err := in.Seek(st.Size()-limit, io.SeekStart); err != nil {
			return 0, err
		}
	}
	o, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(o, io.LimitReader(in, limit))
	if cerr := o.Close(); err == nil {
		err = cerr
	}
	return n, err
}

// pruneKept removes the oldest directories in dir beyond keep.
func pruneKept(dir string, keep int) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	type kept struct {
		name string
		mod  int64
	}
	var all []kept
	for _, e := range ents {
		if info, err := e.Info(); err == nil && e.IsDir() {
			all = append(all, kept{e.Name(), info.ModTime().UnixNano()})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].mod > all[j].mod })
	for _, k := range all[min(keep, len(all)):] {
		if err := os.RemoveAll(filepath.Join(dir, k.name)); err != nil {
			return err
		}
	}
	return nil
}
