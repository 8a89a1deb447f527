// Command package makes ferry's release artifacts once the binaries are
// built (`make package` and `make release` run it): the .debs from
// packaging/*.yaml with nfpm's deb packager, the tarball, an SBOM per
// binary from the module information Go embeds in it, and SHA256SUMS. It
// is a module of its own so that the packaging libraries never enter
// ferry's binary or its go.mod.
//
//	package version DESCRIBE                       the Debian version of git describe's output
//	package deb --arch A --version V --var K=V ...   one .deb (--compression none for tests)
//	package tarball --arch A --version V --bin DIR   the tarball
//	package sbom --name N --version V --commit C BINARY OUT   a CycloneDX SBOM of a Go binary
//	package sums DIR                                 DIR/SHA256SUMS over DIR's files
//
// Everything it writes depends only on its inputs: times come from
// SOURCE_DATE_EPOCH (make release sets it to the commit's time), file
// owners are root, entries are sorted.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var (
		out string
		err error
	)
	args := os.Args[2:]
	switch os.Args[1] {
	case "version":
		if len(args) != 1 {
			usage()
		}
		out = debVersion(args[0])
	case "deb":
		out, err = debCmd(args)
	case "tarball":
		out, err = tarballCmd(args)
	case "sbom":
		out, err = sbomCmd(args)
	case "sums":
		if len(args) != 1 {
			usage()
		}
		out, err = writeSums(args[0])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "package:", err)
		os.Exit(1)
	}
	fmt.Println(out)
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: package version|deb|tarball|sbom|sums ... (see the package's doc comment)")
	os.Exit(2)
}

// vars is a repeatable --var KEY=VALUE flag.
type vars map[string]string

func (v vars) String() string { return fmt.Sprint(map[string]string(v)) }

func (v vars) Set(s string) error {
	k, val, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q is not KEY=VALUE", s)
	}
	v[k] = val
	return nil
}

func debCmd(args []string) (string, error) {
	fs := flag.NewFlagSet("deb", flag.ExitOnError)
	o := debOptions{Vars: vars{}}
	fs.StringVar(&o.Root, "root", ".", "the repository, which the configuration's paths are relative to")
	fs.StringVar(&o.Config, "config", "packaging/nfpm.yaml", "nfpm configuration, relative to --root")
	fs.StringVar(&o.Version, "version", "", "the version, as git describe gives it")
	fs.StringVar(&o.Arch, "arch", "", "Debian architecture (amd64, arm64)")
	fs.Var(o.Vars, "var", "KEY=VALUE for ${KEY} in the configuration (repeatable)")
	fs.StringVar(&o.DependsFile, "depends", "", "a file of further Depends, one a line")
	fs.StringVar(&o.Out, "out", "dist", "directory the .deb is written to")
	fs.StringVar(&o.Compression, "compression", "", "the data's compression (gzip, xz, zstd, none); empty: the configuration's (gzip). Tests take none: the same files, written in a second instead of ten")
	_ = fs.Parse(args)
	return buildDeb(o)
}

func tarballCmd(args []string) (string, error) {
	fs := flag.NewFlagSet("tarball", flag.ExitOnError)
	var o tarOptions
	fs.StringVar(&o.Root, "root", ".", "the repository")
	fs.StringVar(&o.Version, "version", "", "the version, as git describe gives it")
	fs.StringVar(&o.Arch, "arch", "", "architecture (amd64, arm64)")
	fs.StringVar(&o.Bin, "bin", "", "the architecture's build: ferry, ferry-controller, man/, completion/")
	fs.StringVar(&o.Out, "out", "dist", "directory the tarball is written to")
	_ = fs.Parse(args)
	mtime, err := sourceDate()
	if err != nil {
		return "", err
	}
	o.MTime = mtime
	return writeTarball(o)
}

func sbomCmd(args []string) (string, error) {
	fs := flag.NewFlagSet("sbom", flag.ExitOnError)
	name := fs.String("name", "", "the binary's name (ferry, ferry-controller)")
	version := fs.String("version", "", "its version, as git describe gives it")
	commit := fs.String("commit", "", "the commit it was built from")
	_ = fs.Parse(args)
	if fs.NArg() != 2 || *name == "" {
		return "", errors.New("usage: package sbom --name N --version V [--commit C] BINARY OUT")
	}
	mtime, err := sourceDate()
	if err != nil {
		return "", err
	}
	return fs.Arg(1), writeSBOM(fs.Arg(0), fs.Arg(1), *name, *version, *commit, mtime)
}

// sourceDate is SOURCE_DATE_EPOCH, which a release must set: without it,
// two builds would differ by their dates.
func sourceDate() (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		return time.Time{}, errors.New("SOURCE_DATE_EPOCH is not set (make release sets it to the commit's time)")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: %v", s, err)
	}
	return time.Unix(n, 0).UTC(), nil
}
