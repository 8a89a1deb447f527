package criu

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func TestParsePatches(t *testing.T) {
	for _, c := range []struct {
		out  string
		want Patches
	}{
		{"Version: 4.2.1\n", nil},
		{"Version: 4.2.1\nGitID: v4.2.1\n", nil},
		{"Version: 4.2.1\nferry-patches: 0001,0002,0016\n", Patches{"0001", "0002", "0016"}},
		{"Version: 4.2.1\nferry-patches: 0016, 0001,0001,\n", Patches{"0001", "0016"}},
		{"Version: 4.2.1\nferry-patches:\n", Patches{}},
	} {
		got := ParsePatches(c.out)
		if !slices.Equal(got, c.want) || (got == nil) != (c.want == nil) {
			t.Errorf("ParsePatches(%q) = %#v, want %#v", c.out, got, c.want)
		}
	}
	if s := Patches(nil).String(); s != "none" {
		t.Errorf("no patches print as %q", s)
	}
}

// The table and scripts/criu-patches name the same patches, and the list
// patch 0016's header holds (each later patch adding its line) names
// them all: a new patch that forgets either fails here.
func TestKnownPatchesMatchTheScripts(t *testing.T) {
	files, err := filepath.Glob("../../scripts/criu-patches/*.patch")
	if err != nil || len(files) == 0 {
		t.Fatalf("no patches found: %v", err)
	}
	var onDisk, marked []string
	mark := regexp.MustCompile(`^\+\s*",?(\d{4})"\s*\\?$`)
	for _, f := range files {
		onDisk = append(onDisk, strings.SplitN(filepath.Base(f), "-", 2)[0])
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		inMark := false
		for line := range strings.SplitSeq(string(b), "\n") {
			if strings.HasPrefix(line, "+++ ") {
				inMark = strings.HasSuffix(line, "criu/include/ferry-patches.h")
			}
			if m := mark.FindStringSubmatch(line); inMark && m != nil {
				marked = append(marked, m[1])
			}
		}
	}
	var known []string
	for _, p := range KnownPatches {
		known = append(known, p.ID)
		if p.Title == "" || p.Without == "" {
			t.Errorf("patch %s: no title or no word of what goes without it", p.ID)
		}
	}
	slices.Sort(marked)
	if !slices.Equal(onDisk, known) {
		t.Errorf("scripts/criu-patches has %v, KnownPatches %v", onDisk, known)
	}
	if !slices.Equal(onDisk, marked) {
		t.Errorf("scripts/criu-patches has %v, the mark in criu/include/ferry-patches.h lists %v", onDisk, marked)
	}
}

func all() Patches {
	var p Patches
	for _, k := range KnownPatches {
		p = append(p, k.ID)
	}
	return p
}

func ids(ps []Patch) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.ID)
	}
	return out
}

func TestBlocking(t *testing.T) {
	for _, c := range []struct {
		have Patches
		job  Job
		want []string
	}{
		{nil, Job{Technique: "precopy/rebuild", Side: Destination, LazyRestore: true}, []string{"0006"}},
		{nil, Job{Technique: "cold/rebuild", Side: Destination, LazyRestore: true}, []string{"0006"}},
		{nil, Job{Technique: "precopy/rebuild", Side: Destination}, nil}, // restored plainly
		{nil, Job{Technique: "precopy/rebuild", Side: Source, LazyRestore: true}, nil},
		{nil, Job{Technique: "postcopy", Side: Destination, LazyRestore: true}, nil}, // only slower
		{nil, Job{Technique: "cold", Side: Source}, nil},                             // 0003 fails only some
		{all(), Job{Technique: "precopy/rebuild", Side: Destination, LazyRestore: true}, nil},
	} {
		if got := ids(Blocking(c.have, c.job)); !slices.Equal(got, c.want) {
			t.Errorf("Blocking(%v, %+v) = %v, want %v", c.have, c.job, got, c.want)
		}
	}
}

func TestUnreadable(t *testing.T) {
	for _, c := range []struct {
		src, dst Patches
		want     []string
	}{
		{nil, nil, nil},
		{all(), all(), nil},
		{nil, all(), nil}, // ferry's CRIU reads a stock CRIU's gzip
		{all(), nil, []string{"0005", "0010"}},
		{Patches{"0012"}, nil, []string{"0010"}},
		{Patches{"0012"}, Patches{"0010"}, nil},
		{Patches{"0005", "0010", "0012"}, Patches{"0010"}, []string{"0005"}},
	} {
		if got := ids(Unreadable(c.src, c.dst)); !slices.Equal(got, c.want) {
			t.Errorf("Unreadable(%v, %v) = %v, want %v", c.src, c.dst, got, c.want)
		}
	}
}

func TestBinaryPrefersFerrysCRIU(t *testing.T) {
	dir := t.TempDir()
	pkg, setup, path := filepath.Join(dir, "libexec", "criu"), filepath.Join(dir, "sbin", "criu"), filepath.Join(dir, "bin", "criu")
	for _, p := range []string{pkg, setup, path} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	old := binaryPlaces
	t.Cleanup(func() { binaryPlaces = old })
	binaryPlaces = []string{pkg, setup}
	t.Setenv("PATH", filepath.Dir(path))
	t.Setenv(BinaryEnv, "")
	want := func(w string) {
		t.Helper()
		if got, err := Binary(); got != w || (w != "" && err != nil) {
			t.Errorf("Binary() = %q, %v; want %q", got, err, w)
		}
	}
	want("")
	write := func(p string, mode os.FileMode) {
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	write(path, 0o755)
	want(path)
	write(setup, 0o644) // not executable: passed over
	want(path)
	if err := os.Chmod(setup, 0o755); err != nil {
		t.Fatal(err)
	}
	want(setup)
	write(pkg, 0o755)
	want(pkg)
	t.Setenv(BinaryEnv, path)
	want(path)
}

func TestUseBinaryPutsItFirstInPath(t *testing.T) {
	dir := t.TempDir()
	pkg := filepath.Join(dir, "libexec", "criu")
	if err := os.MkdirAll(filepath.Dir(pkg), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pkg, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	old := binaryPlaces
	t.Cleanup(func() { binaryPlaces = old })
	binaryPlaces = []string{pkg}
	t.Setenv(BinaryEnv, "")
	t.Setenv("PATH", "/usr/bin:/bin")
	if got, err := UseBinary(); got != pkg || err != nil {
		t.Fatalf("UseBinary() = %q, %v", got, err)
	}
	if p := os.Getenv("PATH"); p != filepath.Dir(pkg)+":/usr/bin:/bin" {
		t.Errorf("PATH is %q", p)
	}
	if _, err := UseBinary(); err != nil || os.Getenv("PATH") != filepath.Dir(pkg)+":/usr/bin:/bin" {
		t.Errorf("a second call changed PATH again: %q, %v", os.Getenv("PATH"), err)
	}
}
