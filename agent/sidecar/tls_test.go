package sidecar

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
)

// testCA is a certificate authority for one test, and a serving certificate it signed.
type testCA struct {
	file string // PEM of the CA
	leaf tls.Certificate
}

func newTestCA(t *testing.T, dnsNames ...string) testCA {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sidecar test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: dnsNames[0]}, DNSNames: dnsNames,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return testCA{file: file, leaf: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}}
}

// tlsFront terminates TLS in front of a plaintext broker, as a broker's TLS port does.
func tlsFront(t *testing.T, ln net.Listener, cert tls.Certificate, backend string) {
	t.Helper()
	tl := tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	t.Cleanup(func() { _ = tl.Close() })
	go func() {
		for {
			front, err := tl.Accept()
			if err != nil {
				return
			}
			back, err := net.Dial("tcp", backend)
			if err != nil {
				_ = front.Close()
				continue
			}
			go func() { _, _ = io.Copy(back, front); _ = back.Close() }()
			go func() { _, _ = io.Copy(front, back); _ = front.Close() }()
		}
	}()
}

// With a pulsar+ssl broker URL every broker connection is TLS, verified against the CA file
// and the broker's host name; the application still talks plaintext to the sidecar.
func TestTLSToTheBroker(t *testing.T) {
	ca := newTestCA(t, "localhost")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	b := pulsartest.Start(t, pulsartest.Options{AdvertisedURL: "pulsar://localhost:" + port})
	tlsFront(t, ln, ca.leaf, b.ServiceURL()[len("pulsar://"):])

	_, url := startSidecar(t, Options{BrokerURL: "pulsar+ssl://localhost:" + port, TLSCAFile: ca.file})
	topic := uniqueTopic(t)
	client := newClient(t, url)
	cons := subscribe(t, client, pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s", Name: "c1"})
	sent := produce(t, client, topic, "m", 0, 20)
	if m := missing(sent, receiveN(t, cons, len(sent))); len(m) > 0 {
		t.Fatalf("missing %v", m)
	}

	t.Run("another CA is refused", func(t *testing.T) {
		other := newTestCA(t, "localhost")
		s, err := New(Options{BrokerURL: "pulsar+ssl://localhost:" + port, TLSCAFile: other.file})
		if err != nil {
			t.Fatal(err)
		}
		expectUnverified(t, s, "localhost:"+port)
	})
	t.Run("another host name is refused", func(t *testing.T) {
		s, err := New(Options{BrokerURL: "pulsar+ssl://127.0.0.1:" + port, TLSCAFile: ca.file})
		if err != nil {
			t.Fatal(err)
		}
		expectUnverified(t, s, "127.0.0.1:"+port)
	})
	t.Run("a CA file without TLS is refused", func(t *testing.T) {
		if _, err := New(Options{BrokerURL: "pulsar://localhost:" + port, TLSCAFile: ca.file}); err == nil {
			t.Fatal("New accepted a CA file for a plaintext broker URL")
		}
	})
}

func expectUnverified(t *testing.T, s *Sidecar, addr string) {
	t.Helper()
	nc, err := s.dial(addr)
	if err == nil {
		_ = nc.Close()
		t.Fatal("the broker's certificate was accepted")
	}
	var unknownCA x509.UnknownAuthorityError
	var badHost x509.HostnameError
	if !errors.As(err, &unknownCA) && !errors.As(err, &badHost) {
		t.Fatalf("dial failed, but not on verification: %v", err)
	}
}
