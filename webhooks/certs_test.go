package webhooks_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/subflow-dev/subflow/webhooks"
)

// renewBefore is cert-controller's default lead: a certificate expiring sooner is replaced.
const renewBefore = 90 * 24 * time.Hour

// The rotation tests stand in for time passing by writing, into the Secret, certificates that
// expire within the renewal lead, as if they had been issued long ago; the rotation sees them at
// once (it watches the Secret), as it would at its next periodic check.

// TestServingCertificateRenewedWithoutFailedAdmission: a serving certificate close to expiry is
// replaced under the same CA; the new one is served with no restart, the caBundle stays, and
// every pod created meanwhile is wired.
func TestServingCertificateRenewedWithoutFailedAdmission(t *testing.T) {
	ctx := context.Background()
	caBefore, err := servedCA(ctx)
	if err != nil {
		t.Fatal(err)
	}
	secret := certificateSecret(t)
	caCert, caKey := parsePair(t, secret.Data["ca.crt"], secret.Data["ca.key"])
	expiring, expiringKey := issue(t, servingTemplate(time.Hour), caCert, caKey)
	secret.Data["tls.crt"], secret.Data["tls.key"] = expiring, expiringKey
	if err := k8s.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}

	ns := namespace(t, k8s)
	admissions := 0
	eventually(t, func() error {
		admissions++
		if pod := create(t, k8s, appPod(ns, inject("agent"), nil)); pod.Annotations[webhooks.InjectedAnnotation] != webhooks.ModeAgent {
			t.Fatalf("admission %d during the renewal was not wired: %v", admissions, pod.Annotations)
		}
		return renewedAndServed(ctx, caBefore, expiring)
	})
	if _, err := servedCA(ctx); err != nil {
		t.Fatalf("after the renewal: %v", err)
	}
	if pod := create(t, k8s, appPod(ns, inject("agent"), nil)); pod.Annotations[webhooks.InjectedAnnotation] != webhooks.ModeAgent {
		t.Fatalf("a pod created after the renewal was not wired: %v", pod.Annotations)
	}
	t.Logf("%d admissions during the renewal, all wired", admissions)
}

// renewedAndServed: the Secret holds a certificate other than old, valid beyond the renewal
// lead, the webhook server presents it and both configurations still trust ca.
func renewedAndServed(ctx context.Context, ca, old []byte) error {
	var secret corev1.Secret
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: controllerNamespace, Name: certSecret}, &secret); err != nil {
		return err
	}
	current := secret.Data["tls.crt"]
	if bytes.Equal(current, old) {
		return errors.New("the expiring serving certificate is still in the Secret")
	}
	if !bytes.Equal(secret.Data["ca.crt"], ca) {
		return errors.New("the CA changed, want only the serving certificate renewed")
	}
	bundles, err := caBundles(ctx)
	if err != nil {
		return err
	}
	for name, bundle := range bundles {
		if !bytes.Equal(bundle, ca) {
			return fmt.Errorf("%s's caBundle changed", name)
		}
	}
	served, err := handshake(ca)
	if err != nil {
		return err
	}
	block, _ := pem.Decode(current)
	if block == nil || !bytes.Equal(served.Raw, block.Bytes) {
		return errors.New("the webhook server does not present the renewed certificate yet")
	}
	if !served.NotAfter.After(time.Now().Add(renewBefore)) {
		return fmt.Errorf("the renewed certificate expires %s, within the renewal lead", served.NotAfter)
	}
	return nil
}

// TestCARenewedAndCABundleFollows: a CA close to expiry is replaced, both webhook
// configurations' caBundle follow and the webhook server presents a certificate the new CA
// signed. Admissions between the caBundle's change and the new pair's arrival may fail open
// (docs/onboarding.md); afterwards pods are wired again.
func TestCARenewedAndCABundleFollows(t *testing.T) {
	ctx := context.Background()
	caBefore, err := servedCA(ctx)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "subflow-webhook-ca", Organization: []string{"subflow"}},
		DNSNames: []string{"subflow-webhook-ca"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment | x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	expiringCA, expiringCAKey := issue(t, caTmpl, nil, nil)
	caCert, caKey := parsePair(t, expiringCA, expiringCAKey)
	servingCert, servingKey := issue(t, servingTemplate(time.Hour), caCert, caKey)
	secret := certificateSecret(t)
	secret.Data = map[string][]byte{"ca.crt": expiringCA, "ca.key": expiringCAKey, "tls.crt": servingCert, "tls.key": servingKey}
	if err := k8s.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}

	var caAfter []byte
	eventually(t, func() error {
		ca, err := servedCA(ctx) // the Secret's CA in both caBundles, and a handshake verified with it
		if err != nil {
			return err
		}
		if bytes.Equal(ca, caBefore) || bytes.Equal(ca, expiringCA) {
			return errors.New("the CA has not been renewed yet")
		}
		caAfter = ca
		return nil
	})
	served, err := handshake(caAfter)
	if err != nil {
		t.Fatal(err)
	}
	if !served.NotAfter.After(time.Now().Add(renewBefore)) {
		t.Errorf("the served certificate expires %s, within the renewal lead", served.NotAfter)
	}
	ns := namespace(t, k8s)
	eventually(t, func() error {
		if pod := create(t, k8s, appPod(ns, inject("agent"), nil)); pod.Annotations[webhooks.InjectedAnnotation] != webhooks.ModeAgent {
			return fmt.Errorf("a pod created after the CA renewal was not wired: %v", pod.Annotations)
		}
		return nil
	})
}

func certificateSecret(t *testing.T) *corev1.Secret {
	t.Helper()
	secret := &corev1.Secret{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: controllerNamespace, Name: certSecret}, secret); err != nil {
		t.Fatal(err)
	}
	return secret
}

func servingTemplate(validFor time.Duration) *x509.Certificate {
	return &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: servingName},
		DNSNames: []string{servingName}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(validFor),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true}
}

// issue signs tmpl with parent (itself when parent is nil) and returns PEM certificate and key,
// the key PKCS #1 as cert-controller writes and reads it.
func issue(t *testing.T, tmpl, parent *x509.Certificate, parentKey *rsa.PrivateKey) ([]byte, []byte) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
}

func parsePair(t *testing.T, certPEM, keyPEM []byte) (*x509.Certificate, *rsa.PrivateKey) {
	t.Helper()
	certBlock, _ := pem.Decode(certPEM)
	keyBlock, _ := pem.Decode(keyPEM)
	if certBlock == nil || keyBlock == nil {
		t.Fatal("the Secret holds no PEM CA")
	}
	cert, err := x509.ParseCertificate(certBlock.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.ParsePKCS1PrivateKey(keyBlock.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// TestBrokenSecretIsRepaired: a certificate Secret someone overwrote with garbage keeps the
// served pair in use until the rotation has written a good one again; no admission fails.
func TestBrokenSecretIsRepaired(t *testing.T) {
	ctx := context.Background()
	ca, err := servedCA(ctx)
	if err != nil {
		t.Fatal(err)
	}
	secret := certificateSecret(t)
	secret.Data["tls.crt"], secret.Data["tls.key"] = []byte("not a certificate"), []byte("not a key")
	if err := k8s.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	ns := namespace(t, k8s)
	eventually(t, func() error {
		if pod := create(t, k8s, appPod(ns, inject("agent"), nil)); pod.Annotations[webhooks.InjectedAnnotation] != webhooks.ModeAgent {
			t.Fatalf("a pod created while the Secret was broken was not wired: %v", pod.Annotations)
		}
		return renewedAndServed(ctx, ca, []byte("not a certificate"))
	})
}

// TestCABundleRestored: a re-apply of the manifests (which carry no caBundle) is undone.
func TestCABundleRestored(t *testing.T) {
	ctx := context.Background()
	if _, err := servedCA(ctx); err != nil {
		t.Fatal(err)
	}
	var m admissionregv1.MutatingWebhookConfiguration
	if err := k8s.Get(ctx, client.ObjectKey{Name: mutatingConfig}, &m); err != nil {
		t.Fatal(err)
	}
	m.Webhooks[0].ClientConfig.CABundle = nil
	if err := k8s.Update(ctx, &m); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() error { _, err := servedCA(ctx); return err })
}
