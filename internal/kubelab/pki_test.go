package kubelab

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func parseCert(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode(certPEM)
	if b == nil || b.Type != "CERTIFICATE" {
		t.Fatalf("not a PEM certificate: %q", certPEM)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func parseKey(t *testing.T, keyPEM []byte) crypto.Signer {
	t.Helper()
	b, _ := pem.Decode(keyPEM)
	if b == nil {
		t.Fatalf("not PEM: %q", keyPEM)
	}
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return k.(crypto.Signer)
}

// verify checks that kp chains to the CA for usage, and that its key is
// the certificate's.
func verify(t *testing.T, p *clusterPKI, kp keyPair, usage x509.ExtKeyUsage) *x509.Certificate {
	t.Helper()
	cert := parseCert(t, kp.certPEM)
	roots := x509.NewCertPool()
	roots.AddCert(p.ca.cert)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		t.Fatalf("%s: %v", cert.Subject.CommonName, err)
	}
	if !parseKey(t, kp.keyPEM).Public().(*ecdsa.PublicKey).Equal(cert.PublicKey) {
		t.Fatalf("%s: key does not match the certificate", cert.Subject.CommonName)
	}
	return cert
}

func TestClusterPKI(t *testing.T) {
	c, err := testConfig().withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	p, err := newClusterPKI(c, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if !p.ca.cert.IsCA {
		t.Fatal("CA certificate is not a CA")
	}

	api := verify(t, p, p.apiserver, x509.ExtKeyUsageServerAuth)
	for _, ip := range []string{"10.91.0.1", "127.0.0.1", "10.96.0.1"} {
		if !slices.ContainsFunc(api.IPAddresses, func(a net.IP) bool { return a.Equal(net.ParseIP(ip)) }) {
			t.Errorf("apiserver certificate lacks IP %s: %v", ip, api.IPAddresses)
		}
	}
	if err := api.VerifyHostname("kubernetes.default.svc"); err != nil {
		t.Error(err)
	}
	if _, err := api.Verify(x509.VerifyOptions{Roots: x509.NewCertPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("apiserver certificate verifies without its CA")
	}

	for _, n := range c.Nodes {
		cl := verify(t, p, p.nodeClient[n.Name], x509.ExtKeyUsageClientAuth)
		if cl.Subject.CommonName != "system:node:"+n.Name || !slices.Equal(cl.Subject.Organization, []string{"system:nodes"}) {
			t.Errorf("node %s client: subject %v", n.Name, cl.Subject)
		}
		if slices.Contains(cl.ExtKeyUsage, x509.ExtKeyUsageServerAuth) {
			t.Errorf("node %s client certificate can serve", n.Name)
		}
		srv := verify(t, p, p.nodeServing[n.Name], x509.ExtKeyUsageServerAuth)
		if err := srv.VerifyHostname(n.IP); err != nil {
			t.Errorf("node %s serving: %v", n.Name, err)
		}
	}
	admin := verify(t, p, p.admin, x509.ExtKeyUsageClientAuth)
	if !slices.Equal(admin.Subject.Organization, []string{"system:masters"}) {
		t.Errorf("admin subject %v", admin.Subject)
	}
	for kp, cn := range map[*keyPair]string{&p.controllerManager: "system:kube-controller-manager", &p.scheduler: "system:kube-scheduler"} {
		if got := verify(t, p, *kp, x509.ExtKeyUsageClientAuth).Subject.CommonName; got != cn {
			t.Errorf("CN %q, want %q", got, cn)
		}
	}

	fp := parseCert(t, p.frontProxy.certPEM)
	fpRoots := x509.NewCertPool()
	fpRoots.AddCert(p.frontProxyCA.cert)
	if _, err := fp.Verify(x509.VerifyOptions{Roots: fpRoots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil || fp.Subject.CommonName != "front-proxy-client" {
		t.Errorf("front-proxy client: %v, subject %v", err, fp.Subject)
	}
	roots := x509.NewCertPool()
	roots.AddCert(p.ca.cert)
	if _, err := fp.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("the cluster CA vouches for the front-proxy client: any client certificate could name users")
	}

	// Service-account tokens signed with sa.key must verify with sa.pub.
	saKey := parseKey(t, p.serviceAccountKey)
	b, _ := pem.Decode(p.serviceAccountPub)
	pub, err := x509.ParsePKIXPublicKey(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	digest := sha256.Sum256([]byte("token"))
	sig, err := saKey.Sign(rand.Reader, digest[:], crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	if !ecdsa.VerifyASN1(pub.(*ecdsa.PublicKey), digest[:], sig) {
		t.Error("sa.pub does not verify what sa.key signs")
	}

	l := layout(t.TempDir())
	if err := p.write(l); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"ca.crt", "ca.key", "apiserver.crt", "apiserver.key", "sa.key", "sa.pub",
		"node-n1.crt", "node-n2.key", "kubelet-serving-n1.crt", "apiserver-kubelet-client.key", "admin.crt",
		"front-proxy-ca.crt", "front-proxy-client.crt", "front-proxy-client.key"} {
		fi, err := os.Stat(l.pki(f))
		if err != nil {
			t.Error(err)
		} else if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v", f, fi.Mode())
		}
	}
	if fi, err := os.Stat(filepath.Dir(l.pki("x"))); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("pki directory: %v %v", fi, err)
	}
}

func TestFirstServiceIP(t *testing.T) {
	ip, err := firstServiceIP("10.96.0.0/24")
	if err != nil || !ip.Equal(net.ParseIP("10.96.0.1")) {
		t.Fatalf("%v %v", ip, err)
	}
	if _, err := firstServiceIP("fd00::/64"); err == nil {
		t.Fatal("IPv6 range accepted")
	}
}
