// Package webhooks holds the controller manager's admission webhooks (docs/onboarding.md): the
// pod injector that wires opted-in pods for subflow, the SubscriptionFlow validator that refuses
// override annotations the controller could not apply, and the serving certificate, either
// managed by the controller itself or read from files (cert-manager).
//
// It sits next to controllers/ rather than in api/v1alpha1, where kubebuilder scaffolds a type's
// webhooks: api/v1alpha1 is imported by the plugin and must stay light, and the pod injector
// concerns no type of ours.
package webhooks

import (
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// Where the serving certificate comes from.
const (
	// CertsSelfManaged: the controller keeps a CA and the serving certificate in a Secret,
	// renews them before they expire and keeps the webhook configurations' caBundle in step.
	CertsSelfManaged = "self-managed"
	// CertsFromFiles: tls.crt and tls.key in CertDir (a mounted cert-manager Secret), reloaded
	// when they change.
	CertsFromFiles = "files"
)

// Options configure the webhooks.
type Options struct {
	// SidecarImage is the image of the sidecar that sidecar mode adds.
	SidecarImage string
	// SidecarResources are the sidecar's requests and limits; empty takes DefaultSidecarResources.
	SidecarResources corev1.ResourceRequirements
	// Certs is CertsSelfManaged or CertsFromFiles.
	Certs string
	// CertDir holds tls.crt and tls.key: read in files mode, written in self-managed mode (for
	// whoever reads them from disk; the server itself takes them from the Secret).
	CertDir string

	// The rest is for self-managed mode only.

	// Namespace and SecretName locate the Secret holding the CA and the serving certificate.
	Namespace, SecretName string
	// DNSName is the name the API server dials: the webhook Service's <name>.<namespace>.svc.
	DNSName string
	// MutatingConfiguration and ValidatingConfiguration name the webhook configurations
	// whose caBundle is kept in step with the CA.
	MutatingConfiguration, ValidatingConfiguration string
	// RequireLeaderElection lets only the leader renew; every replica serves.
	RequireLeaderElection bool
	// Rotation overrides the renewal schedule; zero values keep the defaults.
	Rotation Rotation
}

// Rotation is the self-managed certificates' schedule.
type Rotation struct {
	// CAValidity (default 10 years) and ServingValidity (default 1 year) are how long new
	// certificates are valid.
	CAValidity, ServingValidity time.Duration
	// RenewBefore (default 90 days): a certificate that expires sooner is replaced.
	RenewBefore time.Duration
	// CheckEvery (default 12 hours): how often expiry is checked besides every Secret change.
	CheckEvery time.Duration
}

// Webhooks is the set of webhooks and their certificate, set up in two steps: ServerOptions
// before the manager exists, SetupWithManager after.
type Webhooks struct {
	opts    Options
	serving *servingCert
}

// New checks the options.
func New(opts Options) (*Webhooks, error) {
	switch opts.Certs {
	case CertsFromFiles:
		return &Webhooks{opts: opts}, nil
	case CertsSelfManaged:
	default:
		return nil, fmt.Errorf("webhook certificates %q: want %s or %s", opts.Certs, CertsSelfManaged, CertsFromFiles)
	}
	var missing []error
	for what, value := range map[string]string{"namespace (POD_NAMESPACE in main.go)": opts.Namespace, "certificate Secret": opts.SecretName,
		"DNS name": opts.DNSName, "mutating webhook configuration": opts.MutatingConfiguration,
		"validating webhook configuration": opts.ValidatingConfiguration} {
		if value == "" {
			missing = append(missing, fmt.Errorf("self-managed webhook certificates need the %s", what))
		}
	}
	if err := errors.Join(missing...); err != nil {
		return nil, err
	}
	return &Webhooks{opts: opts, serving: &servingCert{dir: opts.CertDir}}, nil
}

// ServerOptions completes the webhook server's options with the certificate's source.
func (w *Webhooks) ServerOptions(base webhook.Options) webhook.Options {
	base.CertDir = w.opts.CertDir
	if w.serving != nil {
		base.TLSOpts = append(base.TLSOpts, w.serving.configure)
	}
	return base
}

// SetupWithManager registers both webhooks on the manager's webhook server and, in
// self-managed mode, the certificate's rotation.
func (w *Webhooks) SetupWithManager(mgr manager.Manager) error {
	mgr.GetWebhookServer().Register(PodPath, &webhook.Admission{Handler: &PodInjector{
		Reader: mgr.GetAPIReader(), Flows: mgr.GetClient(), SidecarImage: w.opts.SidecarImage,
		SidecarResources: w.opts.SidecarResources, Decoder: admission.NewDecoder(mgr.GetScheme())}})
	if err := ctrl.NewWebhookManagedBy(mgr, &subflowv1.SubscriptionFlow{}).WithValidator(&FlowValidator{}).Complete(); err != nil {
		return fmt.Errorf("registering the SubscriptionFlow validator: %w", err)
	}
	if w.serving == nil {
		return nil
	}
	return w.setupRotation(mgr)
}
