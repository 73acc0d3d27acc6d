package webhooks

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// The namespace's configuration for sidecar mode: a ConfigMap the team owns next to its pods.
const (
	ConfigMapName = "subflow"
	// BrokerURLKey holds the broker the sidecar connects to (pulsar:// or pulsar+ssl://).
	BrokerURLKey = "brokerServiceURL"
	// AdminURLKey optionally holds the Pulsar admin REST root (http:// or https://) the sidecar
	// reads backlogs from; without it the sidecar reports them unknown.
	AdminURLKey = "adminServiceURL"
	// AdminSecretKey optionally names the Secret with the admin-API credentials (key credentials).
	AdminSecretKey = "adminCredentialsSecret"
	// TLSTrustCertsKey optionally names a ConfigMap of the namespace whose key ca.crt holds the
	// PEM bundle of the CAs that sign the brokers' (pulsar+ssl) and the admin API's (https)
	// certificates, as trust-manager writes a Bundle's target and kube-root-ca.crt is laid out.
	// Without it the sidecar trusts the system's roots.
	TLSTrustCertsKey = "tlsTrustCertsConfigMap"
	// DefaultAdminSecret is the Secret the sidecar's admin credentials come from by default.
	DefaultAdminSecret = "subflow-admin-credentials"
)

// PodPath is where the API server sends pods to be wired.
const PodPath = "/mutate--v1-pod"

// Pods are sent only when they carry the label (objectSelector Exists, so that a wrong value is
// recorded rather than ignored), only on create (a pod's containers cannot change later). A pod
// is never refused: failurePolicy Ignore and every problem admitted with its reason.
// +kubebuilder:webhook:path=/mutate--v1-pod,mutating=true,failurePolicy=ignore,sideEffects=None,groups="",resources=pods,verbs=create,versions=v1,name=inject.subflow.dev,admissionReviewVersions=v1,reinvocationPolicy=IfNeeded,timeoutSeconds=5,patch=`{"objectSelector":{"matchExpressions":[{"key":"subflow.dev/inject","operator":"Exists"}]}}`
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get,resourceNames=subflow

// PodInjector wires opted-in pods for subflow.
type PodInjector struct {
	// Reader reads the namespace's ConfigMap uncached: caching would need list and watch on
	// every ConfigMap in the cluster.
	Reader client.Reader
	// Flows reads the namespace's SubscriptionFlows (the manager's cache), to start a pod that a
	// flow selects gated; nil starts every pod ungated unless its annotation asks.
	Flows client.Reader
	// SidecarImage is the sidecar's image; empty refuses sidecar mode with its reason.
	SidecarImage string
	// SidecarResources are the sidecar's requests and limits; empty takes DefaultSidecarResources.
	SidecarResources corev1.ResourceRequirements
	Decoder          admission.Decoder
}

// Handle answers with the patch that wires the pod, or records why it was not wired.
func (p *PodInjector) Handle(ctx context.Context, req admission.Request) admission.Response {
	pod := &corev1.Pod{}
	if err := p.Decoder.Decode(req, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	wired := pod.DeepCopy()
	mode, err := p.wire(ctx, req.Namespace, wired)
	if err != nil {
		wired = pod.DeepCopy() // admitted as it came, with the reason
		setAnnotation(wired, SkippedAnnotation, err.Error())
	} else {
		setAnnotation(wired, InjectedAnnotation, mode)
		delete(wired.Annotations, SkippedAnnotation) // an earlier invocation's reason may be gone
	}
	// Both sides serialised the same way, so an unchanged pod gives an empty patch.
	before, errBefore := json.Marshal(pod)
	after, errAfter := json.Marshal(wired)
	if errBefore != nil || errAfter != nil {
		return admission.Errored(http.StatusInternalServerError, errors.Join(errBefore, errAfter))
	}
	return admission.PatchResponseFromRaw(before, after)
}

func (p *PodInjector) wire(ctx context.Context, namespace string, pod *corev1.Pod) (string, *skip) {
	mode, err := modeOf(pod)
	if err != nil {
		return "", err
	}
	w := wiring{mode: mode, sidecarImage: p.SidecarImage, resources: p.SidecarResources}
	if len(w.resources.Requests) == 0 && len(w.resources.Limits) == 0 {
		w.resources = DefaultSidecarResources()
	}
	if w.port, err = portOf(pod); err != nil {
		return "", err
	}
	if w.start, err = startOf(ctx, p.Flows, pod, namespace); err != nil {
		return "", err
	}
	if mode == ModeSidecar {
		if err := sidecarSettings(pod, &w); err != nil {
			return "", err
		}
		if err := p.sidecarConfig(ctx, namespace, &w); err != nil {
			return "", err
		}
	}
	return mode, wire(pod, w)
}

// sidecarConfig reads the broker and admin URLs, the admin Secret's name and the CA bundle's
// ConfigMap from the namespace's ConfigMap.
func (p *PodInjector) sidecarConfig(ctx context.Context, namespace string, w *wiring) *skip {
	if w.sidecarImage == "" {
		return skipped(ReasonNoSidecarImage, "sidecar mode needs an image: the controller runs without --sidecar-image")
	}
	var cm corev1.ConfigMap
	err := p.Reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: ConfigMapName}, &cm)
	if apierrors.IsNotFound(err) {
		return skipped(ReasonNoBrokerURL, "sidecar mode needs the broker URL: there is no ConfigMap %s in namespace %s (key %s)", ConfigMapName, namespace, BrokerURLKey)
	}
	if err != nil {
		return skipped(ReasonNamespaceConfig, "reading ConfigMap %s in namespace %s: %v", ConfigMapName, namespace, err)
	}
	w.brokerURL = cm.Data[BrokerURLKey]
	if w.brokerURL == "" {
		return skipped(ReasonNoBrokerURL, "sidecar mode needs the broker URL: ConfigMap %s in namespace %s has no key %s", ConfigMapName, namespace, BrokerURLKey)
	}
	if u, err := url.Parse(w.brokerURL); err != nil || (u.Scheme != "pulsar" && u.Scheme != "pulsar+ssl") || u.Host == "" {
		return skipped(ReasonInvalidBrokerURL, "ConfigMap %s key %s=%q is not a broker URL: want pulsar://host:6650 or pulsar+ssl://host:6651", ConfigMapName, BrokerURLKey, w.brokerURL)
	}
	w.adminURL = cm.Data[AdminURLKey]
	if u, err := url.Parse(w.adminURL); w.adminURL != "" && (err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "") {
		return skipped(ReasonInvalidAdminURL, "ConfigMap %s key %s=%q is not an admin URL: want http://host:8080 or https://host:8443", ConfigMapName, AdminURLKey, w.adminURL)
	}
	w.adminSecret = cm.Data[AdminSecretKey]
	if w.adminSecret == "" {
		w.adminSecret = DefaultAdminSecret
	}
	// The API server would refuse a pod naming an impossible Secret: never block its creation.
	if problems := validation.IsDNS1123Subdomain(w.adminSecret); len(problems) > 0 {
		return skipped(ReasonInvalidAdminSecret, "ConfigMap %s key %s=%q is not a Secret name: %s", ConfigMapName, AdminSecretKey, w.adminSecret, problems[0])
	}
	return trustCerts(cm.Data[TLSTrustCertsKey], w)
}

// trustCerts mounts the namespace's CA bundle for whichever of the broker and the admin API speak
// TLS; with neither it would serve nothing (and the sidecar refuses a CA nothing uses). Whether
// the ConfigMap exists is not checked (the webhook may read only ConfigMap subflow): its volume is
// not optional, so a missing bundle holds the pod with an event naming it, where a sidecar
// without it would fail every TLS handshake.
func trustCerts(name string, w *wiring) *skip {
	if name == "" {
		return nil
	}
	if problems := validation.IsDNS1123Subdomain(name); len(problems) > 0 {
		return skipped(ReasonInvalidTLSTrustCerts, "ConfigMap %s key %s=%q is not a ConfigMap name: %s", ConfigMapName, TLSTrustCertsKey, name, problems[0])
	}
	if scheme(w.brokerURL) == "pulsar+ssl" || scheme(w.adminURL) == "https" {
		w.trustCerts = name
	}
	return nil
}

func scheme(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Scheme // lower case
}

func setAnnotation(pod *corev1.Pod, key, value string) {
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[key] = value
}
