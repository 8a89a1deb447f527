package main

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"strings"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb"
)

// debOptions say which .deb to build.
type debOptions struct {
	Root, Config  string
	Version, Arch string
	// Vars fill ${KEY} in the configuration, besides VERSION and ARCH
	// (BIN for ferry's, CRIU for ferry-criu's); a path is made absolute.
	Vars        vars
	DependsFile string
	Out         string
	// Compression overrides the configuration's (nfpm's deb.compression).
	Compression string
}

// buildDeb writes the .deb into o.Out and returns its path. Its files'
// times are SOURCE_DATE_EPOCH's when that is set (nfpm reads it).
func buildDeb(o debOptions) (string, error) {
	if o.Arch == "" || o.Version == "" {
		return "", errors.New("deb needs --arch and --version")
	}
	out, err := filepath.Abs(o.Out)
	if err != nil {
		return "", err
	}
	mapping := map[string]string{"VERSION": debVersion(o.Version), "ARCH": o.Arch}
	for k, v := range o.Vars {
		if v, err = filepath.Abs(v); err != nil {
			return "", err
		}
		mapping[k] = v
	}
	var depends []string
	if o.DependsFile != "" {
		if depends, err = readLines(o.DependsFile); err != nil {
			return "", err
		}
	}
	// nfpm reads every content source relative to the working directory.
	if err := os.Chdir(o.Root); err != nil {
		return "", err
	}
	cfg, err := nfpm.ParseFileWithEnvMapping(o.Config, func(k string) string { return mapping[k] })
	if err != nil {
		return "", err
	}
	info, err := cfg.Get("deb")
	if err != nil {
		return "", err
	}
	info.Depends = append(info.Depends, depends...)
	if o.Compression != "" {
		info.Deb.Compression = o.Compression
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

// readLines are a file's non-empty lines.
func readLines(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			lines = append(lines, l)
		}
	}
	return lines, sc.Err()
}
