package webhooks

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// Self-managed certificates: github.com/open-policy-agent/cert-controller (Gatekeeper's) keeps
// the CA and the serving certificate in the Secret, renews them and writes the CA into the
// webhook configurations. The library expects the kubelet to mount the Secret; instead each
// replica watches the Secret and serves its key pair from memory, so a renewed certificate is
// served at once rather than after the kubelet's next sync (up to a minute or two, during which
// a new CA in the caBundle would fail every admission) and no restart is needed.

// Secret keys, as cert-controller writes them.
const (
	certKey = "tls.crt"
	keyKey  = "tls.key"
)

// The permissions this needs (the certificate Secret, the webhook configurations) are granted in
// config/certs/self-managed only, by name where the API allows it, not by markers: with
// cert-manager the controller needs none of them.

func (w *Webhooks) setupRotation(mgr manager.Manager) error {
	o := w.opts
	r := &rotator.CertRotator{
		SecretKey:      types.NamespacedName{Namespace: o.Namespace, Name: o.SecretName},
		CertDir:        o.CertDir, // the library waits for tls.crt here; servingCert writes it
		CAName:         "subflow-webhook-ca",
		CAOrganization: "subflow",
		DNSName:        o.DNSName,
		IsReady:        make(chan struct{}),
		Webhooks: []rotator.WebhookInfo{
			{Name: o.MutatingConfiguration, Type: rotator.Mutating},
			{Name: o.ValidatingConfiguration, Type: rotator.Validating},
		},
		FieldOwner:             "subflow-controller",
		RequireLeaderElection:  o.RequireLeaderElection,
		CaCertDuration:         o.Rotation.CAValidity,
		ServerCertDuration:     o.Rotation.ServingValidity,
		LookaheadInterval:      o.Rotation.RenewBefore,
		RotationCheckFrequency: o.Rotation.CheckEvery,
	}
	if err := rotator.AddRotator(mgr, r); err != nil {
		return fmt.Errorf("setting up the webhook certificate rotation: %w", err)
	}
	return mgr.Add(&secretWatcher{mgr: mgr, key: r.SecretKey, serving: w.serving})
}

// servingCert is the key pair the webhook server presents, as last read from the Secret.
type servingCert struct {
	current atomic.Pointer[tls.Certificate]
	dir     string
}

func (s *servingCert) configure(cfg *tls.Config) {
	cfg.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		if cert := s.current.Load(); cert != nil {
			return cert, nil
		}
		return nil, errors.New("no webhook serving certificate yet: the certificate Secret is still empty")
	}
}

// load takes the Secret's key pair; a Secret not yet filled, or filled badly, keeps the pair served.
func (s *servingCert) load(secret *corev1.Secret) error {
	certPEM, keyPEM := secret.Data[certKey], secret.Data[keyKey]
	if len(certPEM) == 0 && len(keyPEM) == 0 {
		return nil
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("Secret %s/%s holds no usable key pair: %w", secret.Namespace, secret.Name, err)
	}
	s.current.Store(&cert)
	if s.dir == "" {
		return nil
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return err
	}
	return errors.Join(writeAtomically(filepath.Join(s.dir, keyKey), keyPEM), writeAtomically(filepath.Join(s.dir, certKey), certPEM))
}

// writeAtomically replaces path so that a reader never sees half a file.
func writeAtomically(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename there is nothing left to remove
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// secretWatcher feeds servingCert from the certificate Secret in every replica: a cache of that
// one Secret (field selector on its name).
type secretWatcher struct {
	mgr     manager.Manager
	key     types.NamespacedName
	serving *servingCert
}

// NeedLeaderElection is false: every replica serves admissions, leader or not.
func (s *secretWatcher) NeedLeaderElection() bool { return false }

func (s *secretWatcher) Start(ctx context.Context) error {
	secrets, err := cache.New(s.mgr.GetConfig(), cache.Options{
		Scheme: s.mgr.GetScheme(), Mapper: s.mgr.GetRESTMapper(), HTTPClient: s.mgr.GetHTTPClient(),
		DefaultNamespaces: map[string]cache.Config{s.key.Namespace: {}},
		ByObject: map[client.Object]cache.ByObject{&corev1.Secret{}: {
			Field: fields.OneTermEqualSelector("metadata.name", s.key.Name)}},
	})
	if err != nil {
		return err
	}
	informer, err := secrets.GetInformer(ctx, &corev1.Secret{})
	if err != nil {
		return err
	}
	log := s.mgr.GetLogger().WithName("webhook-certs")
	onSecret := func(obj any) {
		secret, ok := obj.(*corev1.Secret)
		if !ok || secret.Name != s.key.Name {
			return
		}
		if err := s.serving.load(secret); err != nil {
			log.Error(err, "Keeping the webhook serving certificate in use")
		}
	}
	if _, err := informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: onSecret, UpdateFunc: func(_, obj any) { onSecret(obj) }}); err != nil {
		return err
	}
	return secrets.Start(ctx)
}
