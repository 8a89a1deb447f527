package runc

import (
	"os"
	"path/filepath"
	"testing"
)

// CRIU reads the file line by line as long options without their dashes;
// an empty one (ClearCRIUConfig) asks for nothing.
func TestCRIUConfig(t *testing.T) {
	for _, c := range []struct {
		conf CRIUConfig
		want string
	}{
		{CRIUConfig{}, ""},
		{CRIUConfig{LeaveStopped: true}, "leave-stopped\n"},
		{CRIUConfig{LeaveStopped: true, TCPEstablished: true, LazyPages: true, WorkDir: "/w/d"}, "leave-stopped\ntcp-established\nlazy-pages\nwork-dir /w/d\n"},
		{CRIUConfig{LazyPages: true}, "lazy-pages\n"},
		{CRIUConfig{LeaveStopped: true, CgroupYard: "/w/d/cgroup-yard"}, "leave-stopped\ncgroup-yard /w/d/cgroup-yard\n"},
		{CRIUConfig{NoNetworkLock: true, CgroupYard: "/w/cgroup-yard"}, "network-lock skip\ncgroup-yard /w/cgroup-yard\n"},
	} {
		if got := c.conf.String(); got != c.want {
			t.Errorf("%+v: %q, want %q", c.conf, got, c.want)
		}
	}
	path := filepath.Join(t.TempDir(), "criu.conf")
	for _, bad := range []string{"/w d", "/w#d", `/w"d`, "/w\nd"} {
		if err := (CRIUConfig{LazyPages: true, WorkDir: bad}).Write(path); err == nil {
			t.Errorf("work directory %q written", bad)
		}
	}
	if err := LeaveStopped(path); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "leave-stopped\n" {
		t.Fatalf("LeaveStopped wrote %q, %v", b, err)
	}
	if err := ClearCRIUConfig(path); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Size() != 0 || st.Mode().Perm() != 0o600 {
		t.Fatalf("cleared: %v, %v", st, err)
	}
}

// WithYard makes the yard in the directory it is given and names it; a
// directory CRIU's file cannot name, or none, gives no yard.
func TestWithYard(t *testing.T) {
	dir := t.TempDir()
	c := CRIUConfig{LeaveStopped: true}.WithYard(dir)
	if c.CgroupYard != filepath.Join(dir, "cgroup-yard") {
		t.Fatalf("yard %q, want in %s", c.CgroupYard, dir)
	}
	if ents, err := os.ReadDir(c.CgroupYard); err != nil || len(ents) == 0 {
		t.Errorf("the yard holds %d links: %v", len(ents), err)
	}
	for _, bad := range []string{"", filepath.Join(dir, "a b")} {
		if y := (CRIUConfig{}).WithYard(bad).CgroupYard; y != "" {
			t.Errorf("WithYard(%q) = %q, want none", bad, y)
		}
	}
}
