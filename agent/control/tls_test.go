package control_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/subflow-dev/subflow/agent/control"
	"github.com/subflow-dev/subflow/agent/protocol"
)

// selfSigned writes a certificate for 127.0.0.1 and its key, and returns their files and a pool
// that trusts it.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	return certFile, keyFile, writeSelfSigned(t, certFile, keyFile, "agent")
}

// writeSelfSigned writes a certificate for 127.0.0.1 named cn and its key to the files, and
// returns a pool that trusts it.
func writeSelfSigned(t *testing.T, certFile, keyFile, cn string) *x509.CertPool {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	return pool
}

func TestServeTLS(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t)
	addr := serveOnLoopback(t, control.Options{Token: token, TLSCertFile: certFile, TLSKeyFile: keyFile})
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	do := func(bearer string) int {
		req, _ := http.NewRequest(http.MethodPut, "https://"+addr+protocol.PathPrefix+"/flows/ns/f",
			strings.NewReader(flowBody(1, protocol.Paused, "")))
		req.Header.Set("Content-Type", "application/json")
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	if code := do(token); code != http.StatusOK {
		t.Fatalf("push over TLS: %d", code)
	}
	if code := do("wrong"); code != http.StatusUnauthorized {
		t.Fatalf("wrong token over TLS: %d, want 401", code)
	}
	if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatalf("a TLS agent served plain HTTP")
		}
	}
}

// A renewed certificate (the kubelet swapping a mounted Secret's files) is served to the next
// connection without a restart; a pair that is half written meanwhile (the certificate new,
// the key not yet) keeps the previous one served instead of failing handshakes.
func TestRenewedCertificateIsServedWithoutARestart(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	first := writeSelfSigned(t, certFile, keyFile, "first")
	addr := serveOnLoopback(t, control.Options{Token: token, TLSCertFile: certFile, TLSKeyFile: keyFile})
	served := func(pool *x509.CertPool) (string, error) {
		conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool})
		if err != nil {
			return "", err
		}
		defer func() { _ = conn.Close() }()
		return conn.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
	}
	if cn, err := served(first); err != nil || cn != "first" {
		t.Fatalf("first certificate: %q, %v", cn, err)
	}

	// Half written: a new certificate with the old key does not load; the first stays served.
	staging := t.TempDir()
	second := writeSelfSigned(t, filepath.Join(staging, "tls.crt"), filepath.Join(staging, "tls.key"), "second")
	newCert, _ := os.ReadFile(filepath.Join(staging, "tls.crt"))
	if err := os.WriteFile(certFile, newCert, 0o600); err != nil {
		t.Fatal(err)
	}
	if cn, err := served(first); err != nil || cn != "first" {
		t.Fatalf("while half written: %q, %v", cn, err)
	}
	newKey, _ := os.ReadFile(filepath.Join(staging, "tls.key"))
	if err := os.WriteFile(keyFile, newKey, 0o600); err != nil {
		t.Fatal(err)
	}
	if cn, err := served(second); err != nil || cn != "second" {
		t.Fatalf("renewed certificate: %q, %v (want second, without a restart)", cn, err)
	}
}
