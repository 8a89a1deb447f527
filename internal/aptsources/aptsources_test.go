package aptsources

import (
	"os"
	"path/filepath"
	"testing"
)

func TestParse(t *testing.T) {
	const deb822 = `Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://src.example/debian
Suites: bookworm

Types: deb
# http://snapshot.debian.org/archive/debian-security/20250520T000000Z
URIs: http://deb.debian.org/debian-security/
Suites: bookworm-security
Components: main
`
	m, s := pick(parseDeb822(deb822))
	if m != "http://deb.debian.org/debian" || s != "http://deb.debian.org/debian-security" {
		t.Errorf("deb822: %q %q", m, s)
	}
	const oneLine = `# deb http://commented.example/debian bookworm main
deb-src http://src.example/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://mirror.example/debian bookworm main
deb http://security.example/debian-security bookworm-security main
`
	m, s = pick(parseOneLine(oneLine))
	if m != "http://mirror.example/debian" || s != "http://security.example/debian-security" {
		t.Errorf("one-line: %q %q", m, s)
	}
	m, s = pick(parseOneLine("deb file:/srv/repo bookworm main\n"))
	if m != "" || s != "" {
		t.Errorf("a file: source counted: %q %q", m, s)
	}
	m, s = Mirrors()
	t.Logf("this machine's mirrors: %s, %s", m, s)
}

// Find reads debian.sources before other .sources files, and says so
// when no archive is named at all instead of guessing one.
func TestFind(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p := Paths{SourcesDir: dir, SourcesList: filepath.Join(dir, "sources.list")}
	if _, _, err := Find(p); err == nil {
		t.Error("Find found an archive in an empty directory")
	}
	write("aaa.sources", "Types: deb\nURIs: http://other.example/debian\nSuites: bookworm\n")
	write("debian.sources", "Types: deb\nURIs: http://own.example/debian/\nSuites: bookworm\n")
	m, s, err := Find(p)
	if err != nil || m != "http://own.example/debian" || s != "" {
		t.Errorf("Find = %q, %q, %v; want debian.sources' archive and no security archive", m, s, err)
	}
}
