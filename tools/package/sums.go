package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// writeSums writes dir/SHA256SUMS, in sha256sum's format (sha256sum -c
// SHA256SUMS checks it), over dir's regular files but itself and hidden
// ones, sorted by name.
func writeSums(dir string) (string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	var names []string
	for _, e := range ents {
		if e.Type().IsRegular() && e.Name() != "SHA256SUMS" && !strings.HasPrefix(e.Name(), ".") {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		sum, err := fileSHA256(filepath.Join(dir, n))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "%s  %s\n", sum, n)
	}
	out := filepath.Join(dir, "SHA256SUMS")
	return out, os.WriteFile(out, []byte(b.String()), 0o644)
}
