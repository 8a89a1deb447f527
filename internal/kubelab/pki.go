package kubelab

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// The cluster's certificates, all from one CA made for the cluster alone:
// it lives as long as the cluster's Dir.
const (
	certValidity = 2 * 365 * 24 * time.Hour
	// clockSkew backdates certificates, so that one is valid at once.
	clockSkew = 5 * time.Minute
)

// Identities the apiserver's authenticators and authorizers (Node, RBAC)
// recognise by name.
const (
	adminUser             = "kubelab-admin"
	mastersGroup          = "system:masters"
	controllerManagerUser = "system:kube-controller-manager"
	schedulerUser         = "system:kube-scheduler"
	nodesGroup            = "system:nodes"
	apiserverKubeletUser  = "kube-apiserver-kubelet-client"
	// frontProxyUser is who the apiserver is when it proxies to an
	// aggregated API server (and so to whom the request-header CA's
	// certificates are allowed).
	frontProxyUser = "front-proxy-client"
)

// NodeUser is the name a node's kubelet authenticates as: the Node
// authorizer grants it what that node's pods need, and no more.
func NodeUser(node string) string { return "system:node:" + node }

// authority is a CA that signs the cluster's certificates.
type authority struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte
}

// leaf is what one issued certificate says.
type leaf struct {
	commonName string
	orgs       []string
	dnsNames   []string
	ips        []net.IP
	server     bool // for TLS serving
	client     bool // for TLS client authentication
}

// keyPair is an issued certificate and its key, PEM-encoded.
type keyPair struct{ certPEM, keyPEM []byte }

func newKey() (crypto.Signer, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

func newAuthority(name string, now time.Time) (*authority, error) {
	key, _, err := newKey()
	if err != nil {
		return nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &authority{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// keyPEM is the CA's own key, for kube-controller-manager's CSR signer.
func (a *authority) keyPEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(a.key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func (a *authority) issue(l leaf, now time.Time) (keyPair, error) {
	if !l.server && !l.client {
		return keyPair{}, errors.New("a certificate must serve, authenticate a client, or both")
	}
	key, keyPEM, err := newKey()
	if err != nil {
		return keyPair{}, err
	}
	sn, err := serial()
	if err != nil {
		return keyPair{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: l.commonName, Organization: l.orgs},
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     now.Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		DNSNames:     l.dnsNames,
		IPAddresses:  l.ips,
	}
	if l.server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if l.client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, key.Public(), a.key)
	if err != nil {
		return keyPair{}, err
	}
	return keyPair{certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM: keyPEM}, nil
}

// firstServiceIP is the kubernetes Service's address, the first of the
// service range, which the apiserver's certificate must name.
func firstServiceIP(cidr string) (net.IP, error) {
	_, n, err := net.ParseCIDR(cidr)
	if err != nil {
		return nil, err
	}
	ip := n.IP.To4()
	if ip == nil {
		return nil, fmt.Errorf("service CIDR %s is not IPv4", cidr)
	}
	first := make(net.IP, 4)
	copy(first, ip)
	first[3]++
	return first, nil
}

// clusterPKI is every credential of a cluster, in memory.
type clusterPKI struct {
	ca *authority
	// frontProxyCA signs only frontProxy: the apiserver's identity when it
	// forwards a request to an aggregated API server, which then trusts
	// the user it names in request headers. A CA of its own, so that no
	// other client certificate can name users that way.
	frontProxyCA *authority
	frontProxy   keyPair
	// apiserver serves the API; apiserverKubelet is how it authenticates to
	// kubelets (logs, exec).
	apiserver, apiserverKubelet keyPair
	admin, controllerManager    keyPair
	scheduler                   keyPair
	// nodeClient is each kubelet's identity, nodeServing its serving
	// certificate, by node name.
	nodeClient, nodeServing map[string]keyPair
	// serviceAccountKey signs service-account tokens; the apiserver checks
	// them with serviceAccountPub.
	serviceAccountKey, serviceAccountPub []byte
}

// newClusterPKI issues every certificate the cluster needs.
func newClusterPKI(c Config, now time.Time) (*clusterPKI, error) {
	ca, err := newAuthority("kubelab CA "+c.Name, now)
	if err != nil {
		return nil, err
	}
	frontProxyCA, err := newAuthority("kubelab front-proxy CA "+c.Name, now)
	if err != nil {
		return nil, err
	}
	p := &clusterPKI{ca: ca, frontProxyCA: frontProxyCA, nodeClient: map[string]keyPair{}, nodeServing: map[string]keyPair{}}
	if p.frontProxy, err = frontProxyCA.issue(leaf{commonName: frontProxyUser, client: true}, now); err != nil {
		return nil, err
	}
	svcIP, err := firstServiceIP(c.ServiceCIDR)
	if err != nil {
		return nil, err
	}
	issue := func(dst *keyPair, l leaf) {
		if err == nil {
			*dst, err = ca.issue(l, now)
		}
	}
	issue(&p.apiserver, leaf{
		commonName: "kube-apiserver",
		dnsNames:   []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"},
		ips:        []net.IP{net.ParseIP(c.ControlIP), net.IPv4(127, 0, 0, 1), svcIP},
		server:     true,
	})
	issue(&p.apiserverKubelet, leaf{commonName: apiserverKubeletUser, orgs: []string{mastersGroup}, client: true})
	issue(&p.admin, leaf{commonName: adminUser, orgs: []string{mastersGroup}, client: true})
	issue(&p.controllerManager, leaf{commonName: controllerManagerUser, client: true})
	issue(&p.scheduler, leaf{commonName: schedulerUser, client: true})
	for _, n := range c.Nodes {
		var client, serving keyPair
		issue(&client, leaf{commonName: NodeUser(n.Name), orgs: []string{nodesGroup}, client: true})
		issue(&serving, leaf{commonName: NodeUser(n.Name), dnsNames: []string{n.Name}, ips: []net.IP{net.ParseIP(n.IP)}, server: true})
		p.nodeClient[n.Name], p.nodeServing[n.Name] = client, serving
	}
	if err != nil {
		return nil, err
	}
	saKey, saKeyPEM, err := newKey()
	if err != nil {
		return nil, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return nil, err
	}
	p.serviceAccountKey = saKeyPEM
	p.serviceAccountPub = pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	return p, nil
}

// pkiFiles are the files write puts in DIR/pki.
func (p *clusterPKI) files() (map[string][]byte, error) {
	caKey, err := p.ca.keyPEM()
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{
		"ca.crt": p.ca.certPEM, "ca.key": caKey,
		"front-proxy-ca.crt": p.frontProxyCA.certPEM,
		"sa.key":             p.serviceAccountKey, "sa.pub": p.serviceAccountPub,
	}
	pair := func(name string, kp keyPair) { files[name+".crt"], files[name+".key"] = kp.certPEM, kp.keyPEM }
	pair("apiserver", p.apiserver)
	pair("apiserver-kubelet-client", p.apiserverKubelet)
	pair("admin", p.admin)
	pair("controller-manager", p.controllerManager)
	pair("scheduler", p.scheduler)
	pair("front-proxy-client", p.frontProxy)
	for n, kp := range p.nodeClient {
		pair("node-"+n, kp)
	}
	for n, kp := range p.nodeServing {
		pair("kubelet-serving-"+n, kp)
	}
	return files, nil
}

// write puts the credentials in l's pki directory, readable by root alone.
func (p *clusterPKI) write(l layout) error {
	files, err := p.files()
	if err != nil {
		return err
	}
	dir := filepath.Dir(l.pki("x"))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return err
		}
	}
	return nil
}
