package control

import (
	"crypto/tls"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// keyPair serves the TLS certificate from its files and loads it again when they change, as
// the bearer token is re-read: the kubelet rewrites a mounted Secret in place (cert-manager
// renews before expiry), and a renewed certificate must be served without a restart. The
// files are looked at, not read, on each handshake (an agent sees a handshake per connection,
// and connections are kept alive); a pair that does not load keeps the last good one served.
type keyPair struct {
	certFile, keyFile string
	log               logr.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	version [2]fileVersion
}

// fileVersion tells a file's content has changed: the kubelet swaps a symlink to a new
// directory, so the file followed has a new modification time (or size).
type fileVersion struct {
	modTime time.Time
	size    int64
}

func newKeyPair(certFile, keyFile string, log logr.Logger) (*keyPair, error) {
	k := &keyPair{certFile: certFile, keyFile: keyFile, log: log}
	if _, err := k.get(); err != nil {
		return nil, err
	}
	return k, nil
}

// GetCertificate is tls.Config.GetCertificate.
func (k *keyPair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) { return k.get() }

func (k *keyPair) get() (*tls.Certificate, error) {
	version, err := k.stat()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.cert != nil && (err != nil || version == k.version) {
		return k.cert, nil // unchanged, or gone for a moment while the kubelet swaps it
	}
	cert, loadErr := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	switch {
	case loadErr == nil:
		if k.cert != nil {
			k.log.Info("TLS certificate reloaded", "file", k.certFile)
		}
		k.cert, k.version = &cert, version
	case k.cert == nil:
		return nil, fmt.Errorf("control: loading the TLS key pair: %w", loadErr)
	default:
		// Half written (the certificate renewed, the key not yet): try again next time.
		k.log.Error(loadErr, "TLS key pair changed but does not load; serving the previous one", "file", k.certFile)
	}
	return k.cert, nil
}

func (k *keyPair) stat() ([2]fileVersion, error) {
	var v [2]fileVersion
	for i, name := range []string{k.certFile, k.keyFile} {
		fi, err := os.Stat(name)
		if err != nil {
			return v, err
		}
		v[i] = fileVersion{modTime: fi.ModTime(), size: fi.Size()}
	}
	return v, nil
}
