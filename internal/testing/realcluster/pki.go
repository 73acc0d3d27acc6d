package realcluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// identity is one client or server certificate the cluster needs.
type identity struct {
	file   string // base name of the .crt and .key files
	cn     string
	groups []string
	server bool // a serving certificate for the node's addresses and the API server's names
}

// identities are a real cluster's separate identities: every component authenticates as itself,
// so RBAC and the Node authorizer judge them as they judge a user's cluster.
func identities(node string) []identity {
	return []identity{
		{file: "apiserver", cn: "kube-apiserver", server: true},
		{file: "apiserver-kubelet-client", cn: "kube-apiserver-kubelet-client", groups: []string{"system:masters"}},
		{file: "admin", cn: "subflow-e2e-admin", groups: []string{"system:masters"}},
		{file: "controller-manager", cn: "system:kube-controller-manager"},
		{file: "scheduler", cn: "system:kube-scheduler"},
		{file: "kube-proxy", cn: "system:kube-proxy"},
		{file: "kubelet-client", cn: "system:node:" + node, groups: []string{"system:nodes"}},
		{file: "kubelet", cn: node, server: true},
	}
}

// writePKI writes a CA, every identity's key pair signed by it, and the service-account key, all
// under dir. Keys are ECDSA P-256: quick to make, accepted by every component.
func writePKI(dir, node string, ips []net.IP) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "subflow-e2e-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	if err := writePair(dir, "ca", caDER, caKey); err != nil {
		return err
	}
	for i, id := range identities(node) {
		if err := writeSigned(dir, id, int64(i+2), ca, caKey, node, ips); err != nil {
			return fmt.Errorf("%s: %w", id.file, err)
		}
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	return writePair(dir, "sa", nil, saKey)
}

func writeSigned(dir string, id identity, serial int64, ca *x509.Certificate, caKey *ecdsa.PrivateKey, node string, ips []net.IP) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: id.cn, Organization: id.groups},
		NotBefore:    ca.NotBefore,
		NotAfter:     ca.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if id.server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames = []string{node, "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local"}
		tmpl.IPAddresses = append([]net.IP{net.ParseIP("127.0.0.1")}, ips...)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	return writePair(dir, id.file, der, key)
}

// writePair writes name.crt (when der is set), name.key and, for a key without certificate,
// name.pub.
func writePair(dir, name string, der []byte, key *ecdsa.PrivateKey) error {
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	files := map[string]*pem.Block{name + ".key": {Type: "EC PRIVATE KEY", Bytes: keyDER}}
	if der != nil {
		files[name+".crt"] = &pem.Block{Type: "CERTIFICATE", Bytes: der}
	} else {
		pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
		if err != nil {
			return err
		}
		files[name+".pub"] = &pem.Block{Type: "PUBLIC KEY", Bytes: pub}
	}
	for file, block := range files {
		if err := os.WriteFile(filepath.Join(dir, file), pem.EncodeToMemory(block), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// kubeconfig is a kubeconfig for identity file at server, with the certificates inlined by path.
func kubeconfig(pki, file, server string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster: {server: %q, certificate-authority: %q}
users:
- name: %s
  user: {client-certificate: %q, client-key: %q}
contexts:
- name: e2e
  context: {cluster: e2e, user: %s}
current-context: e2e
`, server, filepath.Join(pki, "ca.crt"), file, filepath.Join(pki, file+".crt"), filepath.Join(pki, file+".key"), file)
}
