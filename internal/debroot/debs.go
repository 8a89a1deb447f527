package debroot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/ferry-migrate/ferry/internal/tail"
)

// Module is ferry's module path, which FindRepo looks for in go.mod.
const Module = "github.com/ferry-migrate/ferry"

// DebsOptions say where BuildDebs builds.
type DebsOptions struct {
	// Repo is the working tree; "" finds it above the current directory.
	Repo string
	// Bin is make's BIN: where ferry, its man pages and ferry-criu's
	// staging go. A Bin holding an up-to-date ferry (make build's bin,
	// the directory of make test's $FERRY_BIN) is reused: no link.
	Bin string
	// Dist receives the two .debs (make's DIST).
	Dist string
	// Log receives make's output; nil discards it (an error quotes its end).
	Log io.Writer
}

// Debs are the two packages of one version.
type Debs struct {
	Ferry, CRIU string
	Took        time.Duration
}

// Files are both .debs, for Install.
func (d Debs) Files() []string { return []string{d.Ferry, d.CRIU} }

// BuildDebs builds ferry's and ferry-criu's .debs for this machine from
// the working tree with `make debs` (the Makefile's package and
// package-criu: the same as make release makes, uncompressed: a second
// instead of ten). ferry-criu's CRIU comes from scripts/release-criu.sh's
// cache (a minute when its patches or setup.sh changed since it was last
// built; make setup builds it).
func BuildDebs(ctx context.Context, o DebsOptions) (Debs, error) {
	var d Debs
	repo := o.Repo
	if repo == "" {
		var err error
		if repo, err = FindRepo(); err != nil {
			return d, err
		}
	}
	if o.Bin == "" || o.Dist == "" {
		return d, errors.New("BuildDebs needs Bin and Dist")
	}
	bin, err := filepath.Abs(o.Bin)
	if err != nil {
		return d, err
	}
	dist, err := filepath.Abs(o.Dist)
	if err != nil {
		return d, err
	}
	// Only this build's packages are in Dist afterwards.
	for _, pattern := range []string{"ferry_*.deb", "ferry-criu_*.deb"} {
		old, _ := filepath.Glob(filepath.Join(dist, pattern))
		for _, f := range old {
			if err := os.Remove(f); err != nil {
				return d, err
			}
		}
	}
	start := time.Now()
	var buf bytes.Buffer
	w := io.Writer(&buf)
	if o.Log != nil {
		w = io.MultiWriter(&buf, o.Log)
	}
	cmd := exec.CommandContext(ctx, "make", "-C", repo, "--no-print-directory", "debs",
		"BIN="+bin, "DIST="+dist, "DEB_COMPRESSION=none")
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Run(); err != nil {
		return d, fmt.Errorf("make debs in %s: %w:\n%s", repo, err, tail.Lines(buf.String(), 20))
	}
	d.Took = time.Since(start)
	for _, x := range []struct {
		pattern string
		dst     *string
	}{{"ferry_*.deb", &d.Ferry}, {"ferry-criu_*.deb", &d.CRIU}} {
		found, _ := filepath.Glob(filepath.Join(dist, x.pattern))
		if len(found) != 1 {
			return d, fmt.Errorf("make debs wrote %d files %s in %s, want one:\n%s", len(found), x.pattern, dist, tail.Lines(buf.String(), 20))
		}
		*x.dst = found[0]
	}
	return d, nil
}

// FindRepo is the working tree holding the current directory: the first
// directory above it whose go.mod is ferry's module.
func FindRepo() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if first, _, _ := strings.Cut(string(b), "\n"); err == nil && strings.TrimSpace(first) == "module "+Module {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", fmt.Errorf("no go.mod of %s above the current directory", Module)
		}
		dir = up
	}
}
