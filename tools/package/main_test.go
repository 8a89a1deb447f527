package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
)

func TestDebVersion(t *testing.T) {
	cases := map[string]string{
		"v1.2.3":               "1.2.3",
		"1.2.3":                "1.2.3",
		"v1.2.3-4-gabc1234":    "1.2.3+4.gabc1234",
		"v2.0.0-rc.1":          "2.0.0~rc.1",
		"v2.0.0-rc1-dirty":     "2.0.0~rc1+dirty",
		"v2.0.0-rc1-3-gabcd":   "2.0.0~rc1+3.gabcd",
		"v1.2.3-dirty":         "1.2.3+dirty",
		"v1.2.3-4-gabcd-dirty": "1.2.3+4.gabcd.dirty",
		"v1.0.0+meta-2-gabcd":  "1.0.0+meta.2.gabcd",
		"4d6026f":              "0.0.0~git4d6026f",
		"9b084ee-dirty":        "0.0.0~git9b084ee.dirty",
		"dev":                  "0.0.0~gitdev",
		"":                     "0.0.0~gitunknown",
		"abc/def":              "0.0.0~gitabc.def",
		"v1.2_3":               "1.2.3",
		"release-5-2-gabcdef0": "0.0.0~gitrelease.5.2.gabcdef0",
	}
	for in, want := range cases {
		if got := debVersion(in); got != want {
			t.Errorf("debVersion(%q) = %q, want %q", in, got, want)
		}
	}
	if _, err := exec.LookPath("dpkg"); err != nil {
		t.Skip("needs dpkg to check the versions against dpkg's own rules")
	}
	for in := range cases {
		v := debVersion(in)
		if out, err := exec.Command("dpkg", "--validate-version", v).CombinedOutput(); err != nil {
			t.Errorf("dpkg refuses %q (from %q): %s", v, in, out)
		}
	}
	// They sort as the releases do.
	order := []string{"4d6026f", "v0.9.0", "v1.0.0-rc.1", "v1.0.0-rc.1-2-gabcdef0", "v1.0.0", "v1.0.0-1-gabcdef0", "v1.0.0-12-gabcdef0", "v1.0.1"}
	for i := 1; i < len(order); i++ {
		a, b := debVersion(order[i-1]), debVersion(order[i])
		if err := exec.Command("dpkg", "--compare-versions", a, "lt", b).Run(); err != nil {
			t.Errorf("%s (%s) does not sort before %s (%s)", a, order[i-1], b, order[i])
		}
	}
}

// repo is the repository's root, absolute (buildDeb changes directory).
func repo(t *testing.T) string {
	t.Helper()
	r, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(".") // back here when the test ends
	return r
}

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o755); err != nil {
		t.Fatal(err)
	}
}

// fakeBuild is an architecture's build as make release stages it, with
// stand-ins for the binaries.
func fakeBuild(t *testing.T) string {
	bin := t.TempDir()
	write(t, filepath.Join(bin, "ferry"), "#!/bin/sh\necho ferry\n")
	write(t, filepath.Join(bin, "ferry-controller"), "#!/bin/sh\necho controller\n")
	write(t, filepath.Join(bin, "ferry-lab"), "not to be packaged\n")
	write(t, filepath.Join(bin, "man", "ferry.1"), ".TH FERRY 1\n")
	write(t, filepath.Join(bin, "man", "ferry-migrate.1"), ".TH FERRY 1\n")
	write(t, filepath.Join(bin, "completion", "ferry.bash"), "complete\n")
	return bin
}

// fakeCriu is scripts/release-criu.sh's output, with a stand-in binary
// and the repository's patches.
func fakeCriu(t *testing.T, root string) (dir string, patches []string) {
	dir = t.TempDir()
	write(t, filepath.Join(dir, "criu"), "#!/bin/sh\necho criu\n")
	write(t, filepath.Join(dir, "README"), "ferry's CRIU\n")
	write(t, filepath.Join(dir, "COPYING"), "GPL\n")
	write(t, filepath.Join(dir, "depends"), "libbsd0 (>= 0.6.0)\nlibc6 (>= 2.34)\nlibprotobuf-c1 (>= 1.0.1)\n")
	patches, _ = filepath.Glob(filepath.Join(root, "scripts/criu-patches/*.patch"))
	if len(patches) == 0 {
		t.Fatal("no scripts/criu-patches/*.patch")
	}
	for _, p := range patches {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(dir, "patches", filepath.Base(p)), string(b))
	}
	return dir, patches
}

// debInfo is what dpkg-deb says of a .deb: its control fields and its
// files (directories left out).
func debInfo(t *testing.T, deb string) (fields string, files []string) {
	t.Helper()
	out, err := exec.Command("dpkg-deb", "--field", deb).CombinedOutput()
	if err != nil {
		t.Fatalf("dpkg-deb --field: %v\n%s", err, out)
	}
	fields = string(out)
	out, err = exec.Command("dpkg-deb", "--contents", deb).CombinedOutput()
	if err != nil {
		t.Fatalf("dpkg-deb --contents: %v\n%s", err, out)
	}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) > 0 && !strings.HasPrefix(f[0], "d") {
			files = append(files, strings.TrimPrefix(f[len(f)-1], "."))
		}
	}
	slices.Sort(files)
	return fields, files
}

func needDpkgDeb(t *testing.T) {
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Skip("needs dpkg-deb")
	}
}

// ferry's .deb, for each architecture: its files (none but ferry's own
// binary: no ferry-controller, no lab binary), its dependency on the
// ferry-criu of its own version, or a criu new enough.
func TestFerryDeb(t *testing.T) {
	needDpkgDeb(t)
	root := repo(t)
	bin := fakeBuild(t)
	t.Setenv("SOURCE_DATE_EPOCH", "1700000000")
	for _, arch := range []string{"amd64", "arm64"} {
		deb, err := buildDeb(debOptions{Root: root, Config: "packaging/nfpm.yaml", Version: "v1.2.3-4-gabc1234", Arch: arch,
			Vars: vars{"BIN": bin}, Out: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		if want := "ferry_1.2.3+4.gabc1234_" + arch + ".deb"; filepath.Base(deb) != want {
			t.Errorf("wrote %s, want %s", filepath.Base(deb), want)
		}
		fields, files := debInfo(t, deb)
		for _, want := range []string{"Package: ferry\n", "Version: 1.2.3+4.gabc1234\n", "Architecture: " + arch + "\n",
			"Depends: ferry-criu (= 1.2.3+4.gabc1234) | criu (>= 4.2.1), runc, iproute2, iptables\n"} {
			if !strings.Contains(fields, want) {
				t.Errorf("%s: control lacks %q:\n%s", arch, want, fields)
			}
		}
		if strings.Contains(fields, "must be installed separately") {
			t.Errorf("the description still says CRIU is installed separately:\n%s", fields)
		}
		want := []string{
			"/etc/ferry/agent.toml",
			"/lib/systemd/system/ferry-agent.service",
			"/lib/systemd/system/run-criu.mount",
			"/usr/bin/ferry",
			"/usr/lib/sysctl.d/50-ferry.conf",
			"/usr/lib/tmpfiles.d/ferry.conf",
			"/usr/libexec/ferry/docker-runc",
			"/usr/share/bash-completion/completions/ferry",
			"/usr/share/doc/ferry/DEPLOY.md",
			"/usr/share/doc/ferry/copyright",
			"/usr/share/man/man1/ferry-migrate.1",
			"/usr/share/man/man1/ferry.1",
		}
		if !slices.Equal(files, want) {
			t.Errorf("%s: files\n%s\nwant\n%s", arch, strings.Join(files, "\n"), strings.Join(want, "\n"))
		}
	}
}

// ferry-criu's .deb: the binary at /usr/libexec/ferry/criu and nowhere on
// PATH, the patches and their list, the libraries it links as Depends,
// and nothing that would displace Debian's criu package.
func TestCriuDeb(t *testing.T) {
	needDpkgDeb(t)
	root := repo(t)
	dir, patches := fakeCriu(t, root)
	t.Setenv("SOURCE_DATE_EPOCH", "1700000000")
	deb, err := buildDeb(debOptions{Root: root, Config: "packaging/nfpm-criu.yaml", Version: "v1.2.3", Arch: "amd64",
		Vars: vars{"CRIU": dir}, DependsFile: filepath.Join(dir, "depends"), Out: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(deb) != "ferry-criu_1.2.3_amd64.deb" {
		t.Errorf("wrote %s", filepath.Base(deb))
	}
	fields, files := debInfo(t, deb)
	for _, want := range []string{"Package: ferry-criu\n", "Version: 1.2.3\n",
		"Depends: libbsd0 (>= 0.6.0), libc6 (>= 2.34), libprotobuf-c1 (>= 1.0.1)\n", "/usr/libexec/ferry/criu"} {
		if !strings.Contains(fields, want) {
			t.Errorf("control lacks %q:\n%s", want, fields)
		}
	}
	for _, never := range []string{"Conflicts:", "Replaces:", "Provides:", "Breaks:"} {
		if strings.Contains(fields, never) {
			t.Errorf("control has %s:\n%s", never, fields)
		}
	}
	want := []string{
		"/usr/libexec/ferry/criu",
		"/usr/share/doc/ferry-criu/README",
		"/usr/share/doc/ferry-criu/copyright",
	}
	for _, p := range patches {
		want = append(want, "/usr/share/doc/ferry-criu/patches/"+filepath.Base(p))
	}
	slices.Sort(want)
	if !slices.Equal(files, want) {
		t.Errorf("files\n%s\nwant\n%s", strings.Join(files, "\n"), strings.Join(want, "\n"))
	}
}

// --compression none (what the package tests build with) changes how the
// data is stored, not what it holds.
func TestDebCompression(t *testing.T) {
	needDpkgDeb(t)
	root := repo(t)
	bin := fakeBuild(t)
	t.Setenv("SOURCE_DATE_EPOCH", "1700000000")
	var contents [2][]string
	for i, c := range []string{"", "none"} {
		deb, err := buildDeb(debOptions{Root: root, Config: "packaging/nfpm.yaml", Version: "v1.2.3", Arch: "amd64",
			Vars: vars{"BIN": bin}, Out: t.TempDir(), Compression: c})
		if err != nil {
			t.Fatalf("compression %q: %v", c, err)
		}
		out, err := exec.Command("ar", "t", deb).CombinedOutput()
		if err != nil {
			t.Fatalf("ar t: %v\n%s", err, out)
		}
		want := map[string]string{"": "data.tar.gz", "none": "data.tar"}[c]
		if !slices.Contains(strings.Fields(string(out)), want) {
			t.Errorf("compression %q: members %q, want %s", c, out, want)
		}
		_, contents[i] = debInfo(t, deb)
	}
	if !slices.Equal(contents[0], contents[1]) {
		t.Errorf("gzip and none hold different files:\n%v\n%v", contents[0], contents[1])
	}
}

// The same inputs and SOURCE_DATE_EPOCH give the same .deb.
func TestDebReproducible(t *testing.T) {
	root := repo(t)
	bin := fakeBuild(t)
	t.Setenv("SOURCE_DATE_EPOCH", "1700000000")
	var sums []string
	for range 2 {
		deb, err := buildDeb(debOptions{Root: root, Config: "packaging/nfpm.yaml", Version: "v1.2.3", Arch: "amd64", Vars: vars{"BIN": bin}, Out: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		// Another file time must not matter either.
		_ = os.Chtimes(filepath.Join(bin, "ferry"), time.Now(), time.Now())
		s, err := fileSHA256(deb)
		if err != nil {
			t.Fatal(err)
		}
		sums = append(sums, s)
	}
	if sums[0] != sums[1] {
		t.Errorf("two builds of the .deb differ: %v", sums)
	}
}

// The tarball: its files under one directory, owned by root, dated
// SOURCE_DATE_EPOCH, the same bytes twice.
func TestTarball(t *testing.T) {
	root := repo(t)
	bin := fakeBuild(t)
	mtime := time.Unix(1700000000, 0).UTC()
	var first []byte
	for i := range 2 {
		path, err := writeTarball(tarOptions{Root: root, Bin: bin, Version: "v1.2.3", Arch: "arm64", Out: t.TempDir(), MTime: mtime})
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(path) != "ferry-1.2.3-linux-arm64.tar.gz" {
			t.Errorf("wrote %s", path)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = b
			_ = os.Chtimes(filepath.Join(bin, "ferry"), time.Now(), time.Now())
			continue
		}
		if !bytes.Equal(first, b) {
			t.Error("two tarballs of the same files differ")
		}
	}
	zr, err := gzip.NewReader(bytes.NewReader(first))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var names []string
	modes := map[string]int64{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(mtime) || h.Uid != 0 || h.Gid != 0 || h.Uname != "root" {
			t.Errorf("%s: %v %d/%d %s", h.Name, h.ModTime, h.Uid, h.Gid, h.Uname)
		}
		names = append(names, h.Name)
		modes[h.Name] = h.Mode
	}
	const top = "ferry-1.2.3-linux-arm64/"
	want := []string{top, top + "DEPLOY.md", top + "LICENSE", top + "agent.toml", top + "completion/", top + "completion/ferry.bash",
		top + "docker-runc", top + "ferry", top + "ferry-controller", top + "man/", top + "man/ferry-migrate.1", top + "man/ferry.1",
		top + "sysctl.d/", top + "sysctl.d/50-ferry.conf", top + "systemd/", top + "systemd/ferry-agent.service", top + "systemd/run-criu.mount",
		top + "tmpfiles.d/", top + "tmpfiles.d/ferry.conf"}
	if !slices.Equal(names, want) {
		t.Errorf("entries\n%s\nwant\n%s", strings.Join(names, "\n"), strings.Join(want, "\n"))
	}
	if modes[top+"ferry"] != 0o755 || modes[top+"agent.toml"] != 0o644 {
		t.Errorf("modes: ferry %o, agent.toml %o", modes[top+"ferry"], modes[top+"agent.toml"])
	}
}

// An SBOM of a Go binary (this test's own) names the binary with its
// hash and every module in it, and is the same twice.
func TestSBOM(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	mtime := time.Unix(1700000000, 0)
	a, b := filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json")
	for _, out := range []string{a, b} {
		if err := writeSBOM(self, out, "package.test", "v1.2.3", "0123abcd", mtime); err != nil {
			t.Fatal(err)
		}
	}
	ja, _ := os.ReadFile(a)
	jb, _ := os.ReadFile(b)
	if !bytes.Equal(ja, jb) {
		t.Error("two SBOMs of the same binary differ")
	}
	var bom cdx.BOM
	if err := cdx.NewBOMDecoder(bytes.NewReader(ja), cdx.BOMFileFormatJSON).Decode(&bom); err != nil {
		t.Fatal(err)
	}
	sum, _ := fileSHA256(self)
	c := bom.Metadata.Component
	if c == nil || c.Name != "package.test" || c.Version != "v1.2.3" || c.Hashes == nil || (*c.Hashes)[0].Value != sum {
		t.Fatalf("metadata component: %+v", c)
	}
	if !slices.Contains(*c.Properties, cdx.Property{Name: "vcs:commit", Value: "0123abcd"}) {
		t.Errorf("no commit in %v", *c.Properties)
	}
	if bom.Metadata.Timestamp != "2023-11-14T22:13:20Z" || !strings.HasPrefix(bom.SerialNumber, "urn:uuid:") {
		t.Errorf("timestamp %q, serial %q", bom.Metadata.Timestamp, bom.SerialNumber)
	}
	found := map[string]string{}
	for _, c := range *bom.Components {
		found[c.Name] = c.PackageURL
	}
	for name, purl := range map[string]string{
		"github.com/goreleaser/nfpm/v2":     "pkg:golang/github.com/goreleaser/nfpm/v2@v2.48.0?type=module",
		"github.com/CycloneDX/cyclonedx-go": "pkg:golang/github.com/CycloneDX/cyclonedx-go@v0.12.0?type=module",
	} {
		if found[name] != purl {
			t.Errorf("component %s: purl %q, want %q", name, found[name], purl)
		}
	}
	if !strings.HasPrefix(found["std"], "pkg:golang/std@go1.") {
		t.Errorf("std: %q", found["std"])
	}
	if len(*bom.Dependencies) != 1 || len(*(*bom.Dependencies)[0].Dependencies) != len(*bom.Components) {
		t.Errorf("dependencies do not list every component")
	}
}

// SHA256SUMS is what sha256sum -c checks, over the directory's files.
func TestSums(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "b.deb"), "b")
	write(t, filepath.Join(dir, "a.tar.gz"), "a")
	write(t, filepath.Join(dir, ".hidden"), "x")
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	path, err := writeSums(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	want := "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb  a.tar.gz\n" +
		"3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73eeaed59c009d  b.deb\n"
	if string(b) != want {
		t.Errorf("SHA256SUMS:\n%s\nwant\n%s", b, want)
	}
	if _, err := exec.LookPath("sha256sum"); err == nil {
		cmd := exec.Command("sha256sum", "-c", "--quiet", "SHA256SUMS")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("sha256sum -c: %v\n%s", err, out)
		}
	}
}
