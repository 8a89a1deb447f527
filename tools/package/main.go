// Command package builds ferry's .deb from packaging/nfpm.yaml with nfpm's
// deb packager (`make package` runs it after building the binary, its man
// pages and its shell completion). It is a module of its own so that the
// packaging library never enters ferry's binary or its go.mod.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"strings"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb"
)

func main() {
	root := flag.String("root", ".", "the repository, which packaging/nfpm.yaml's paths are relative to")
	config := flag.String("config", "packaging/nfpm.yaml", "nfpm configuration, relative to --root")
	version := flag.String("version", "", "the version (git describe); one that does not start with a digit becomes 0.0.0~git<version>")
	bin := flag.String("bin", "bin", "the build's output directory (ferry, man/, completion/)")
	out := flag.String("out", "dist", "directory the .deb is written to")
	flag.Parse()
	path, err := build(*root, *config, *version, *bin, *out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "package:", err)
		os.Exit(1)
	}
	fmt.Println(path)
}

// build writes the .deb into out and returns its path.
func build(root, config, version, bin, out string) (string, error) {
	out, err := filepath.Abs(out)
	if err != nil {
		return "", err
	}
	if bin, err = filepath.Abs(bin); err != nil {
		return "", err
	}
	// nfpm reads every content source relative to the working directory.
	if err := os.Chdir(root); err != nil {
		return "", err
	}
	vars := map[string]string{"VERSION": debVersion(version), "ARCH": goruntime.GOARCH, "BIN": bin}
	cfg, err := nfpm.ParseFileWithEnvMapping(config, func(k string) string { return vars[k] })
	if err != nil {
		return "", err
	}
	info, err := cfg.Get("deb")
	if err != nil {
		return "", err
	}
	info = nfpm.WithDefaults(info)
	if err := nfpm.Validate(info); err != nil {
		return "", err
	}
	deb, err := nfpm.Get("deb")
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(out, deb.ConventionalFileName(info))
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	if err := deb.Package(info, f); err != nil {
		f.Close()
		os.Remove(path)
		return "", err
	}
	return path, f.Close()
}

// versionLike is a release as git describe names it (v1.2, 1.2.3-4-gabc):
// digits and a dot first, unlike a bare commit.
var versionLike = regexp.MustCompile(`^v?[0-9]+\.[0-9][A-Za-z0-9.+~-]*$`)

// notInVersion is what a Debian version may not hold after a ~.
var notInVersion = regexp.MustCompile(`[^A-Za-z0-9.+~]`)

// debVersion turns git describe's output into a Debian version: v1.2.3
// and 1.2.3-4-gabc stay (without the v); a bare commit (a clone without
// tags) or "dev" sorts below any release as 0.0.0~git<it>.
func debVersion(v string) string {
	if versionLike.MatchString(v) {
		return strings.TrimPrefix(v, "v")
	}
	clean := notInVersion.ReplaceAllString(v, ".")
	if clean == "" {
		clean = "unknown"
	}
	return "0.0.0~git" + clean
}
