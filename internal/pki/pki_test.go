package pki

import (
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestCAAndHostFiles(t *testing.T) {
	// A umask that would leave files readable must not matter.
	old := syscall.Umask(0o022)
	t.Cleanup(func() { syscall.Umask(old) })

	dir := filepath.Join(t.TempDir(), "ca")
	if err := NewCA(dir, "test CA"); err != nil {
		t.Fatal(err)
	}
	hostDir := filepath.Join(dir, "h1")
	ips := []net.IP{net.ParseIP("10.77.0.1")}
	if err := Issue(dir, hostDir, "h1", ips, []string{"h1.lab"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	modes := map[string]os.FileMode{
		dir:                                0o700 | os.ModeDir,
		filepath.Join(dir, CACertFile):     0o600,
		filepath.Join(dir, CAKeyFile):      0o600,
		hostDir:                            0o700 | os.ModeDir,
		filepath.Join(hostDir, "h1.crt"):   0o600,
		filepath.Join(hostDir, "h1.key"):   0o600,
		filepath.Join(hostDir, CACertFile): 0o600,
	}
	for p, want := range modes {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode() != want {
			t.Errorf("%s: mode %v, want %v", p, st.Mode(), want)
		}
	}
	if _, err := os.Stat(filepath.Join(hostDir, CAKeyFile)); err == nil {
		t.Error("the CA key was copied into the host directory")
	}

	// Loading works from the host directory and from the CA directory.
	for _, d := range []string{hostDir, dir} {
		b, err := LoadTLS(d, "h1")
		if err != nil {
			t.Fatalf("LoadTLS(%s): %v", d, err)
		}
		leaf := b.Cert.Leaf
		if leaf.Subject.CommonName != "h1" || b.Name != "h1" {
			t.Errorf("CN %q", leaf.Subject.CommonName)
		}
		if !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageServerAuth) || !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
			t.Errorf("ext key usage %v", leaf.ExtKeyUsage)
		}
		if len(leaf.IPAddresses) != 1 || !leaf.IPAddresses[0].Equal(ips[0]) {
			t.Errorf("IPs %v", leaf.IPAddresses)
		}
		if !slices.Equal(leaf.DNSNames, []string{"h1", "h1.lab"}) {
			t.Errorf("DNS names %v", leaf.DNSNames)
		}
		if leaf.IsCA {
			t.Error("host certificate is a CA")
		}
		if b.Dir != hostDir {
			t.Errorf("found in %s, want %s", b.Dir, hostDir)
		}
	}
}

func TestRefusesOverwrite(t *testing.T) {
	dir := t.TempDir()
	if err := NewCA(dir, ""); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if err := NewCA(dir, ""); err == nil || !strings.Contains(err.Error(), "refusing to overwrite") {
		t.Fatalf("second NewCA: %v", err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if string(before) != string(after) {
		t.Fatal("CA key changed")
	}
	out := filepath.Join(dir, "h1")
	if err := Issue(dir, out, "h1", nil, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := Issue(dir, out, "h1", nil, nil, time.Hour); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("second Issue: %v", err)
	}
	// A second host may share the directory: same CA certificate.
	if err := Issue(dir, out, "h2", nil, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	// But not with another CA's certificate there.
	other := t.TempDir()
	if err := NewCA(other, ""); err != nil {
		t.Fatal(err)
	}
	if err := Issue(other, out, "h3", nil, nil, time.Hour); err == nil || !strings.Contains(err.Error(), "another CA") {
		t.Fatalf("Issue over another CA's directory: %v", err)
	}
}

func TestLoadChecks(t *testing.T) {
	dir := t.TempDir()
	if err := NewCA(dir, ""); err != nil {
		t.Fatal(err)
	}
	if err := Issue(dir, filepath.Join(dir, "h1"), "h1", nil, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadTLS(dir, "h2"); err == nil {
		t.Error("loaded a host that has no certificate")
	}

	// A key others can read is refused.
	key := filepath.Join(dir, "h1", "h1.key")
	os.Chmod(key, 0o644)
	if _, err := LoadTLS(dir, "h1"); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("readable key: %v", err)
	}
	os.Chmod(key, 0o600)

	// A certificate signed by another CA is refused.
	other := t.TempDir()
	if err := NewCA(other, ""); err != nil {
		t.Fatal(err)
	}
	otherCA, _ := os.ReadFile(filepath.Join(other, CACertFile))
	caCopy := filepath.Join(dir, "h1", CACertFile)
	good, _ := os.ReadFile(caCopy)
	os.WriteFile(caCopy, otherCA, 0o600)
	if _, err := LoadTLS(dir, "h1"); err == nil || !strings.Contains(err.Error(), "does not verify") {
		t.Errorf("foreign CA: %v", err)
	}
	os.WriteFile(caCopy, good, 0o600)

	// A certificate renamed to another host is refused.
	h := filepath.Join(dir, "h1")
	os.Rename(filepath.Join(h, "h1.crt"), filepath.Join(h, "hx.crt"))
	os.Rename(filepath.Join(h, "h1.key"), filepath.Join(h, "hx.key"))
	if _, err := LoadTLS(h, "hx"); err == nil || !strings.Contains(err.Error(), `is for host "h1"`) {
		t.Errorf("renamed certificate: %v", err)
	}
}

func TestValidity(t *testing.T) {
	dir := t.TempDir()
	if err := NewCA(dir, ""); err != nil {
		t.Fatal(err)
	}
	if err := Issue(dir, dir, "zero", nil, nil, 0); err == nil {
		t.Error("zero validity accepted")
	}
	// A host certificate never outlives its CA.
	if err := Issue(dir, dir, "long", nil, nil, 100*365*24*time.Hour); err != nil {
		t.Fatal(err)
	}
	b, err := LoadTLS(dir, "long")
	if err != nil {
		t.Fatal(err)
	}
	if !b.Cert.Leaf.NotAfter.Equal(b.CACert.NotAfter) {
		t.Errorf("host valid until %v, CA until %v", b.Cert.Leaf.NotAfter, b.CACert.NotAfter)
	}
}

func TestValidHost(t *testing.T) {
	for _, h := range []string{"h1", "node-3.example.com", "a_b"} {
		if err := ValidHost(h); err != nil {
			t.Errorf("%q: %v", h, err)
		}
	}
	for _, h := range []string{"", "../etc", ".hidden", "a/b", "a b", strings.Repeat("x", 64)} {
		if err := ValidHost(h); err == nil {
			t.Errorf("%q accepted", h)
		}
	}
}

func TestOperatorCertificate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ca")
	if err := NewCA(dir, "test CA"); err != nil {
		t.Fatal(err)
	}
	if err := Issue(dir, filepath.Join(dir, "h1"), "h1", nil, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := IssueOperator(dir, filepath.Join(dir, "alice"), "alice", time.Hour); err != nil {
		t.Fatal(err)
	}
	op, err := LoadOperator(dir, "alice")
	if err != nil {
		t.Fatal(err)
	}
	leaf := op.Cert.Leaf
	if !IsOperator(leaf) || leaf.Subject.CommonName != "alice" {
		t.Errorf("operator certificate: OU %v, CN %q, usages %v", leaf.Subject.OrganizationalUnit, leaf.Subject.CommonName, leaf.ExtKeyUsage)
	}
	// It can never serve as an agent: no server usage.
	pool := x509.NewCertPool()
	pool.AddCert(op.CACert)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Error("an operator certificate verifies for server authentication")
	}
	// Each loader takes only its own kind.
	if _, err := LoadTLS(dir, "alice"); err == nil || !strings.Contains(err.Error(), "operator's certificate") {
		t.Errorf("LoadTLS of an operator: %v", err)
	}
	if _, err := LoadOperator(dir, "h1"); err == nil || !strings.Contains(err.Error(), "not an operator's") {
		t.Errorf("LoadOperator of a host: %v", err)
	}
	if _, err := LoadOperator(dir, "bob"); err == nil || !strings.Contains(err.Error(), "ferry certs operator --name bob") {
		t.Errorf("LoadOperator of a missing one: %v", err)
	}
	host, err := LoadTLS(dir, "h1")
	if err != nil {
		t.Fatal(err)
	}
	if IsOperator(host.Cert.Leaf) {
		t.Error("a host certificate reads as an operator's")
	}
}
