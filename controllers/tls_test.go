package controllers_test

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
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/testing/podsim"
)

// testTLS is a CA the suite's controller trusts and a certificate it signed for 127.0.0.1, with
// which simulated agents serve https.
type testTLS struct {
	client            *tls.Config
	certFile, keyFile string
}

var agentTLS *testTLS

func newTestCA() (*testTLS, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "subflow test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "agent"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "subflow-tls")
	if err != nil {
		return nil, err
	}
	out := &testTLS{certFile: filepath.Join(dir, "tls.crt"), keyFile: filepath.Join(dir, "tls.key")}
	if err := os.WriteFile(out.certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(out.keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	out.client = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return out, nil
}

func TestAgentServedOverTLSIsReachedByHTTPS(t *testing.T) {
	ns := namespace(t, true)
	topic := "tls-" + ns
	p, err := podsim.Start(podsim.Options{Name: "worker-tls", ServiceURL: broker.ServiceURL(), AdminURL: broker.AdminURL(),
		Token: testToken, Topic: topic, Subscription: "ingest", Type: pulsar.Shared, ReceiverQueueSize: 10,
		TLSCertFile: agentTLS.certFile, TLSKeyFile: agentTLS.keyFile})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	createPodWithPort(t, ns, "worker-tls", protocol.TLSPortName, p.Port)
	flow := newFlow(ns, "tls", topic, subflowv1.StatePaused)
	create(t, flow)
	waitFlow(t, flow, "Paused over https", func(f *subflowv1.SubscriptionFlow) bool { return isTrue(f, subflowv1.ConditionPaused) })
	if p.Consumer.State() != protocol.Paused {
		t.Fatalf("agent is %s", p.Consumer.State())
	}
}
