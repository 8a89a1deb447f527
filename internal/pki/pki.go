// Package pki is a small certificate authority for ferry hosts. One CA signs
// one certificate per host; agents then authenticate each other with mutual
// TLS, identifying a host by its certificate's CommonName. The same CA signs
// operator certificates: a person's, for the CLI to reach an agent over the
// network. An operator certificate is a client's only (it cannot serve as
// an agent) and is marked by OrganizationalUnit "operator", so an agent
// tells the two apart: hosts offer migrations, operators ask for them.
//
// Layout on disk (every file 0600, every directory 0700):
//
//	DIR/ca.crt, DIR/ca.key          the CA; ca.key never leaves DIR
//	DIR/NAME/NAME.crt, NAME.key     host (or operator) NAME's certificate and key
//	DIR/NAME/ca.crt                 a copy of the CA certificate
//
// DIR/NAME is self-contained: copy it to host NAME and load it from there.
package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"time"
)

// File names inside a CA or host directory.
const (
	CACertFile = "ca.crt"
	CAKeyFile  = "ca.key"
)

// CAValidity is how long a new CA is valid. Host certificates never outlive it.
const CAValidity = 10 * 365 * 24 * time.Hour

// clockSkew backdates certificates so a host whose clock is a little behind
// accepts a certificate issued a moment ago.
const clockSkew = 5 * time.Minute

const (
	dirMode  = 0o700
	fileMode = 0o600
)

// hostRE keeps host names usable as file names and as certificate names.
var hostRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// ValidHost reports whether host can name a ferry host certificate.
func ValidHost(host string) error {
	if !hostRE.MatchString(host) {
		return fmt.Errorf("host name %q: use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit", host)
	}
	return nil
}

// HostCertFile and HostKeyFile are host's file names inside its directory.
func HostCertFile(host string) string { return host + ".crt" }
func HostKeyFile(host string) string  { return host + ".key" }

// NewCA creates a CA named name in dir: ca.crt and ca.key. It refuses to
// overwrite an existing CA.
func NewCA(dir, name string) error {
	if name == "" {
		name = "ferry CA"
	}
	certPath, keyPath := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	for _, p := range []string{certPath, keyPath} {
		if _, err := os.Lstat(p); err == nil {
			return fmt.Errorf("%s already exists: refusing to overwrite a CA (every host certificate it signed depends on it)", p)
		}
	}
	if err := privateDir(dir); err != nil {
		return err
	}
	key, tmpl, err := newKeyAndTemplate(name)
	if err != nil {
		return err
	}
	tmpl.NotAfter = tmpl.NotBefore.Add(clockSkew + CAValidity)
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	tmpl.IsCA = true
	// Hosts get certificates straight from the CA, never from an intermediate.
	tmpl.MaxPathLen, tmpl.MaxPathLenZero = 0, true
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return err
	}
	return writePair(keyPath, certPath, key, der)
}

// OperatorUnit is the OrganizationalUnit that marks an operator's
// certificate.
const OperatorUnit = "operator"

// IsOperator reports whether cert is an operator's: marked so, and good
// for client authentication only.
func IsOperator(cert *x509.Certificate) bool {
	return cert != nil && slices.Contains(cert.Subject.OrganizationalUnit, OperatorUnit) &&
		!slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
}

// Issue signs a certificate for host with the CA in caDir and writes
// host.crt, host.key and a copy of ca.crt into outDir. The certificate serves
// both ends of a connection (server and client authentication); its
// CommonName is host, and ips and dnsNames (plus host itself) are its
// subject alternative names. It refuses to overwrite an existing host
// certificate.
func Issue(caDir, outDir, host string, ips []net.IP, dnsNames []string, validFor time.Duration) error {
	return issue(caDir, outDir, host, false, ips, dnsNames, validFor)
}

// IssueOperator signs an operator's certificate, name.crt and name.key in
// outDir with a copy of ca.crt: client authentication only, marked with
// OperatorUnit. Whoever holds it may ask every agent that trusts the CA to
// migrate, list and cancel.
func IssueOperator(caDir, outDir, name string, validFor time.Duration) error {
	return issue(caDir, outDir, name, true, nil, nil, validFor)
}

func issue(caDir, outDir, host string, operator bool, ips []net.IP, dnsNames []string, validFor time.Duration) error {
	if err := ValidHost(host); err != nil {
		return err
	}
	if validFor <= 0 {
		return fmt.Errorf("validity must be positive, got %s", validFor)
	}
	caCert, caKey, err := loadCA(caDir)
	if err != nil {
		return err
	}
	certPath, keyPath := filepath.Join(outDir, HostCertFile(host)), filepath.Join(outDir, HostKeyFile(host))
	for _, p := range []string{certPath, keyPath} {
		if _, err := os.Lstat(p); err == nil {
			return fmt.Errorf("%s already exists: remove %s and %s to issue a new certificate for %s", p, certPath, keyPath, host)
		}
	}
	caCopy := filepath.Join(outDir, CACertFile)
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caCert.Raw})
	if old, err := os.ReadFile(caCopy); err == nil && !bytes.Equal(old, caPEM) {
		return fmt.Errorf("%s holds another CA's certificate: use an empty directory for %s", caCopy, host)
	}

	dns := []string{host}
	for _, d := range dnsNames {
		if d == "" {
			return errors.New("empty DNS name")
		}
		if !slices.Contains(dns, d) {
			dns = append(dns, d)
		}
	}
	key, tmpl, err := newKeyAndTemplate(host)
	if err != nil {
		return err
	}
	tmpl.NotAfter = tmpl.NotBefore.Add(clockSkew + validFor)
	if tmpl.NotAfter.After(caCert.NotAfter) {
		tmpl.NotAfter = caCert.NotAfter
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	tmpl.IPAddresses, tmpl.DNSNames = ips, dns
	if operator {
		tmpl.Subject.OrganizationalUnit = []string{OperatorUnit}
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		tmpl.IPAddresses, tmpl.DNSNames = nil, nil
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, key.Public(), caKey)
	if err != nil {
		return err
	}
	if err := privateDir(outDir); err != nil {
		return err
	}
	if err := writePair(keyPath, certPath, key, der); err != nil {
		return err
	}
	if _, err := os.Lstat(caCopy); err == nil {
		return nil // the same CA certificate is already there (checked above)
	}
	if err := writeNew(caCopy, caPEM); err != nil {
		os.Remove(keyPath)
		os.Remove(certPath)
		return err
	}
	return nil
}

// Bundle is what a TLS endpoint needs: its own certificate and the CA that
// signs its peers.
type Bundle struct {
	Name   string          // the host, the certificate's CommonName
	Cert   tls.Certificate // Leaf is set
	CA     *x509.CertPool
	CACert *x509.Certificate
	Dir    string // where the files were found
}

// LoadTLS loads host's certificate, key and CA certificate from dir, or from
// dir/host when dir is the CA directory that issued it. It checks that the
// key is private to its owner, that the certificate is for host, that the
// CA signed it and it is valid now, and that it is a host's, not an
// operator's.
func LoadTLS(dir, host string) (*Bundle, error) {
	return load(dir, host, false)
}

// LoadOperator is LoadTLS for an operator's certificate (IssueOperator).
func LoadOperator(dir, name string) (*Bundle, error) {
	return load(dir, name, true)
}

func load(dir, host string, operator bool) (*Bundle, error) {
	if err := ValidHost(host); err != nil {
		return nil, err
	}
	base := dir
	if _, err := os.Stat(filepath.Join(dir, HostCertFile(host))); errors.Is(err, fs.ErrNotExist) {
		if _, err := os.Stat(filepath.Join(dir, host, HostCertFile(host))); err == nil {
			base = filepath.Join(dir, host)
		}
	}
	certPath, keyPath := filepath.Join(base, HostCertFile(host)), filepath.Join(base, HostKeyFile(host))
	caCert, err := readCACert(filepath.Join(base, CACertFile))
	if err != nil {
		return nil, err
	}
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		if operator {
			return nil, fmt.Errorf("operator certificate for %s: %w (issue one with 'ferry certs operator --name %s')", host, err, host)
		}
		return nil, fmt.Errorf("host certificate for %s: %w (issue one with 'ferry certs issue --host %s')", host, err, host)
	}
	keyPEM, err := readPrivate(keyPath)
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s with %s: %w", certPath, keyPath, err)
	}
	leaf := cert.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("%s: %w", certPath, err)
		}
		cert.Leaf = leaf
	}
	if leaf.Subject.CommonName != host {
		return nil, fmt.Errorf("%s is for host %q, not %q", certPath, leaf.Subject.CommonName, host)
	}
	if IsOperator(leaf) != operator {
		if operator {
			return nil, fmt.Errorf("%s is host %s's certificate, not an operator's (issue one with 'ferry certs operator --name NAME')", certPath, host)
		}
		return nil, fmt.Errorf("%s is an operator's certificate: an agent needs its host's ('ferry certs issue --host %s')", certPath, host)
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	usages := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	if operator {
		usages = usages[1:]
	}
	for _, usage := range usages {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			return nil, fmt.Errorf("%s does not verify against %s: %w", certPath, filepath.Join(base, CACertFile), err)
		}
	}
	return &Bundle{Name: host, Cert: cert, CA: pool, CACert: caCert, Dir: base}, nil
}

func loadCA(dir string) (*x509.Certificate, crypto.Signer, error) {
	cert, err := readCACert(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, nil, err
	}
	keyPath := filepath.Join(dir, CAKeyFile)
	keyPEM, err := readPrivate(keyPath)
	if err != nil {
		return nil, nil, err
	}
	block, _ := pem.Decode(keyPEM)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, nil, fmt.Errorf("%s: no PEM private key", keyPath)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", keyPath, err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, nil, fmt.Errorf("%s: unsupported key type %T", keyPath, k)
	}
	if !publicEqual(signer.Public(), cert.PublicKey) {
		return nil, nil, fmt.Errorf("%s does not belong to %s", keyPath, filepath.Join(dir, CACertFile))
	}
	return cert, signer, nil
}

func publicEqual(a, b crypto.PublicKey) bool {
	e, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && e.Equal(b)
}

func readCACert(path string) (*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w (create a CA with 'ferry certs init')", err)
	}
	block, rest := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" || len(bytes.TrimSpace(rest)) != 0 {
		return nil, fmt.Errorf("%s: expected exactly one PEM certificate", path)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("%s is not a CA certificate", path)
	}
	return cert, nil
}

// readPrivate reads a key file, refusing one that others may read: a key
// that leaked is no proof of identity.
func readPrivate(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%s is accessible to other users (mode %#o): run 'chmod 600 %s'", path, st.Mode().Perm(), path)
	}
	return os.ReadFile(path)
}

// privateDir creates dir if needed and makes it private to its owner.
func privateDir(dir string) error {
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return err
	}
	return os.Chmod(dir, dirMode)
}

// writePair writes a key and its certificate as new files, removing both if
// either fails.
func writePair(keyPath, certPath string, key *ecdsa.PrivateKey, certDER []byte) error {
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := writeNew(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})); err != nil {
		return err
	}
	if err := writeNew(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: certDER})); err != nil {
		os.Remove(keyPath)
		return err
	}
	return nil
}

// writeNew creates path with mode 0600; it fails if path exists.
func writeNew(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fileMode)
	if err != nil {
		return err
	}
	// The umask may only clear bits; Chmod makes the mode exact.
	err = f.Chmod(fileMode)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}

// newKeyAndTemplate makes a P-256 key and the template fields every ferry
// certificate shares: a random serial, cn in the ferry organisation, valid
// from a little before now (clock skew between hosts).
func newKeyAndTemplate(cn string) (*ecdsa.PrivateKey, *x509.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, nil, err
	}
	return key, &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: cn, Organization: []string{"ferry"}},
		NotBefore:             time.Now().Add(-clockSkew),
		BasicConstraintsValid: true,
	}, nil
}

// newSerial returns a random positive 127-bit serial number.
func newSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	return n.Add(n, big.NewInt(1)), nil
}
