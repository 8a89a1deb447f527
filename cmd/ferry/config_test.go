package main

import (
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func testFlags() (*pflag.FlagSet, *[]string, *string, *time.Duration, *int, *bool) {
	fs := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	listen := fs.StringSlice("listen", nil, "")
	tlsDir := fs.String("tls-dir", "", "")
	outage := fs.Duration("outage-timeout", 30*time.Second, "")
	maxIn := fs.Int("max-incoming", 4, "")
	mptcp := fs.Bool("mptcp", true, "")
	fs.String("config", "", "")
	fs.String("name", "", "")
	return fs, listen, tlsDir, outage, maxIn, mptcp
}

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "agent.toml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// The file sets what the command line does not; the command line wins.
func TestApplyConfig(t *testing.T) {
	fs, listen, tlsDir, outage, maxIn, mptcp := testFlags()
	if err := fs.Parse([]string{"--max-incoming", "2"}); err != nil {
		t.Fatal(err)
	}
	p := writeConfig(t, `
listen = ["10.0.1.5:7070", "10.0.2.5:7070"]
tls-dir = "/etc/ferry/tls"
outage-timeout = "45s"
max-incoming = 8
mptcp = false
`)
	if err := applyConfig(fs, p); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(*listen, []string{"10.0.1.5:7070", "10.0.2.5:7070"}) || *tlsDir != "/etc/ferry/tls" || *outage != 45*time.Second || *mptcp {
		t.Errorf("listen %v tls-dir %q outage %v mptcp %v", *listen, *tlsDir, *outage, *mptcp)
	}
	if *maxIn != 2 {
		t.Errorf("max-incoming %d: the command line's 2 must win", *maxIn)
	}
}

// Mistakes are errors that name the file and the setting.
func TestApplyConfigErrors(t *testing.T) {
	for _, c := range []struct{ text, want string }{
		{`listn = ["a:1"]`, `unknown setting "listn"`},
		{`config = "/x"`, `unknown setting "config"`},
		{`max-incoming = "many"`, "max-incoming"},
		{`outage-timeout = [1, 2]`, "outage-timeout"},
		{`[tls]`, `unknown setting "tls"`},
		{`listen = `, "config"},
	} {
		fs, _, _, _, _, _ := testFlags()
		err := applyConfig(fs, writeConfig(t, c.text))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "agent.toml") {
			t.Errorf("%q: %v, want an error naming the file and %q", c.text, err, c.want)
		}
	}
}

// A directory (a ConfigMap's files): agent.toml for every host, then the
// host's own NAME.toml, which wins; the command line wins over both.
func TestApplyConfigDirectory(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("agent.toml", "max-incoming = 8\noutage-timeout = \"45s\"\nname = \"n1\"\n")
	write("n1.toml", "max-incoming = 3\nlisten = [\"10.0.0.1:7070\"]\ntls-dir = \"/n1\"\n")
	write("n2.toml", "max-incoming = 99\n")
	fs, listen, tlsDir, outage, maxIn, _ := testFlags()
	if err := fs.Parse([]string{"--tls-dir", "/cli"}); err != nil {
		t.Fatal(err)
	}
	if err := applyConfigPath(fs, dir); err != nil {
		t.Fatal(err)
	}
	if *maxIn != 3 || *outage != 45*time.Second || !reflect.DeepEqual(*listen, []string{"10.0.0.1:7070"}) || *tlsDir != "/cli" {
		t.Errorf("max-incoming %d (want n1's 3), outage %v (agent.toml's 45s), listen %v (n1's), tls-dir %q (the command line's)", *maxIn, *outage, *listen, *tlsDir)
	}
	// Only the host's own file, named by --name.
	own := t.TempDir()
	if err := os.WriteFile(filepath.Join(own, "n2.toml"), []byte("max-incoming = 5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fs, _, _, _, maxIn, _ = testFlags()
	if err := fs.Parse([]string{"--name", "n2"}); err != nil {
		t.Fatal(err)
	}
	if err := applyConfigPath(fs, own); err != nil || *maxIn != 5 {
		t.Errorf("n2 alone: %v, max-incoming %d", err, *maxIn)
	}
	// Neither file: an error naming both.
	fs, _, _, _, _, _ = testFlags()
	if err := fs.Parse([]string{"--name", "n3"}); err != nil {
		t.Fatal(err)
	}
	if err := applyConfigPath(fs, own); err == nil || !strings.Contains(err.Error(), "agent.toml") || !strings.Contains(err.Error(), "n3.toml") {
		t.Errorf("no file for n3: %v", err)
	}
}

// The agent refuses relative state and bundle directories before it
// starts anything.
func TestAgentRelativeDirs(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"agent", "--insecure", "--state", "state"}, "--state must be an absolute path"},
		{[]string{"agent", "--insecure", "--state", t.TempDir(), "--bundles", "bundles"}, "--bundles must be an absolute path"},
	} {
		root := newRootCmd()
		root.SetArgs(c.args)
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		if err := root.Execute(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}
