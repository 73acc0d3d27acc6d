package webhooks_test

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/subflow-dev/subflow/webhooks"
)

// A namespace whose brokers and admin API are signed by a private CA names the ConfigMap holding
// the bundle (key ca.crt, as trust-manager and kube-root-ca.crt write it): the sidecar gets it
// mounted read-only and passed as --tls-ca-file. The volume is not optional: a bundle that is
// missing shows as the pod's event instead of a sidecar failing TLS. Sent again, the pod is
// unchanged.
func TestSidecarModeTrustsTheNamespaceCA(t *testing.T) {
	ns := namespace(t, k8s)
	brokerConfig(t, ns, map[string]string{webhooks.BrokerURLKey: "pulsar+ssl://pulsar:6651",
		webhooks.AdminURLKey: "https://pulsar:8443", "tlsTrustCertsConfigMap": "pulsar-ca"})
	stored := create(t, k8s, appPod(ns, inject("sidecar"), nil))
	if got := stored.Annotations[webhooks.InjectedAnnotation]; got != webhooks.ModeSidecar {
		t.Fatalf("annotation %s = %q, want sidecar (skipped: %q)", webhooks.InjectedAnnotation, got, stored.Annotations[webhooks.SkippedAnnotation])
	}
	v := volume(stored, "subflow-tls-ca")
	if v == nil || v.ConfigMap == nil || v.ConfigMap.Name != "pulsar-ca" ||
		!reflect.DeepEqual(v.ConfigMap.Items, []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}) {
		t.Fatalf("volume subflow-tls-ca = %+v, want key ca.crt of ConfigMap pulsar-ca", v)
	}
	if v.ConfigMap.Optional != nil && *v.ConfigMap.Optional {
		t.Errorf("the CA volume is optional: a missing bundle would not show on the pod")
	}
	sc := container(stored, "subflow-sidecar")
	want := corev1.VolumeMount{Name: "subflow-tls-ca", MountPath: "/var/run/subflow-tls-ca", ReadOnly: true}
	if !slices.ContainsFunc(sc.VolumeMounts, func(m corev1.VolumeMount) bool { return reflect.DeepEqual(m, want) }) {
		t.Errorf("sidecar mounts %+v, want subflow-tls-ca read-only at /var/run/subflow-tls-ca", sc.VolumeMounts)
	}
	if !slices.Contains(sc.Args, "--tls-ca-file=/var/run/subflow-tls-ca/ca.crt") {
		t.Errorf("sidecar args %q, want --tls-ca-file=/var/run/subflow-tls-ca/ca.crt", sc.Args)
	}
	if response := review(t, stored); !response.Allowed || len(response.Patch) != 0 {
		t.Errorf("second invocation: allowed %v, patch %s; want allowed with no patch", response.Allowed, response.Patch)
	}

	// Nothing speaks TLS: the bundle would serve nothing, and the sidecar refuses a CA it cannot use.
	plain := namespace(t, k8s)
	brokerConfig(t, plain, map[string]string{webhooks.BrokerURLKey: "pulsar://pulsar:6650", "tlsTrustCertsConfigMap": "pulsar-ca"})
	stored = create(t, k8s, appPod(plain, inject("sidecar"), nil))
	if v := volume(stored, "subflow-tls-ca"); v != nil || slices.ContainsFunc(stored.Spec.InitContainers[0].Args, func(a string) bool {
		return strings.HasPrefix(a, "--tls-ca-file")
	}) {
		t.Errorf("plaintext broker and no admin URL: volume %+v, args %q; want no CA", v, stored.Spec.InitContainers[0].Args)
	}
}

// The sidecar's requests and limits per pod, one annotation per entry in Kubernetes quantities
// (as Istio's sidecar.istio.io/proxyCPU and proxyMemoryLimit); what a pod does not set is the
// controller's. And the strict pause per pod.
func TestSidecarSettingsByAnnotation(t *testing.T) {
	ns := namespace(t, k8s)
	brokerConfig(t, ns, map[string]string{webhooks.BrokerURLKey: "pulsar://pulsar:6650"})
	q := resource.MustParse
	cases := []struct {
		name        string
		annotations map[string]string
		want        corev1.ResourceRequirements
		strict      bool
	}{
		{"none: the controller's", nil, webhooks.DefaultSidecarResources(), false},
		{"all four", map[string]string{"subflow.dev/sidecar-cpu-request": "50m", "subflow.dev/sidecar-memory-request": "64Mi",
			"subflow.dev/sidecar-cpu-limit": "500m", "subflow.dev/sidecar-memory-limit": "256Mi"},
			corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: q("50m"), corev1.ResourceMemory: q("64Mi")},
				Limits: corev1.ResourceList{corev1.ResourceCPU: q("500m"), corev1.ResourceMemory: q("256Mi")}}, false},
		{"a larger memory limit only, strict", map[string]string{"subflow.dev/sidecar-memory-limit": "512Mi", "subflow.dev/sidecar-strict-pause": "true"},
			corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: q("10m"), corev1.ResourceMemory: q("32Mi")},
				Limits: corev1.ResourceList{corev1.ResourceMemory: q("512Mi")}}, true},
		{"Guaranteed QoS, not strict", map[string]string{"subflow.dev/sidecar-cpu-request": "100m", "subflow.dev/sidecar-cpu-limit": "100m",
			"subflow.dev/sidecar-memory-request": "128Mi", "subflow.dev/sidecar-strict-pause": "false"},
			corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: q("100m"), corev1.ResourceMemory: q("128Mi")},
				Limits: corev1.ResourceList{corev1.ResourceCPU: q("100m"), corev1.ResourceMemory: q("128Mi")}}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			stored := create(t, k8s, appPod(ns, inject("sidecar"), tc.annotations))
			sc := container(stored, "subflow-sidecar")
			if sc == nil {
				t.Fatalf("no sidecar (skipped: %q)", stored.Annotations[webhooks.SkippedAnnotation])
			}
			if !equalResources(sc.Resources, tc.want) {
				t.Errorf("sidecar resources %v, want %v", sc.Resources, tc.want)
			}
			if got := slices.Contains(sc.Args, "--strict-pause"); got != tc.strict {
				t.Errorf("sidecar args %q: --strict-pause %v, want %v", sc.Args, got, tc.strict)
			}
		})
	}
}

func equalResources(a, b corev1.ResourceRequirements) bool {
	equal := func(x, y corev1.ResourceList) bool {
		if len(x) != len(y) {
			return false
		}
		for name, q := range x {
			if other, ok := y[name]; !ok || q.Cmp(other) != 0 {
				return false
			}
		}
		return true
	}
	return equal(a.Requests, b.Requests) && equal(a.Limits, b.Limits)
}

// A sidecar setting that cannot be applied admits the pod unwired, with the reason: the API
// server would refuse the pod itself for a request above its limit or a negative quantity.
func TestSidecarSettingsRefusedWithTheReason(t *testing.T) {
	ns := namespace(t, k8s)
	brokerConfig(t, ns, map[string]string{webhooks.BrokerURLKey: "pulsar://pulsar:6650"})
	badCA := namespace(t, k8s)
	brokerConfig(t, badCA, map[string]string{webhooks.BrokerURLKey: "pulsar+ssl://pulsar:6651", "tlsTrustCertsConfigMap": "Pulsar CA"})
	cases := []struct {
		name, ns    string
		annotations map[string]string
		want        string
	}{
		{"not a quantity", ns, map[string]string{"subflow.dev/sidecar-memory-limit": "lots"},
			`InvalidSidecarResources: annotation subflow.dev/sidecar-memory-limit="lots" is not a quantity: want a positive Kubernetes quantity such as 256Mi`},
		{"negative", ns, map[string]string{"subflow.dev/sidecar-cpu-request": "-100m"},
			`InvalidSidecarResources: annotation subflow.dev/sidecar-cpu-request="-100m" is not a quantity: want a Kubernetes quantity, 0 or more, such as 100m`},
		{"a request above the controller's limit", ns, map[string]string{"subflow.dev/sidecar-memory-request": "256Mi"},
			"InvalidSidecarResources: the sidecar's memory request 256Mi (annotation subflow.dev/sidecar-memory-request) is above its limit 128Mi (the controller's --sidecar-limits)"},
		{"a limit below the request", ns, map[string]string{"subflow.dev/sidecar-cpu-request": "1", "subflow.dev/sidecar-cpu-limit": "500m"},
			"InvalidSidecarResources: the sidecar's cpu request 1 (annotation subflow.dev/sidecar-cpu-request) is above its limit 500m (annotation subflow.dev/sidecar-cpu-limit)"},
		{"a strict pause that is no choice", ns, map[string]string{"subflow.dev/sidecar-strict-pause": "yes"},
			`InvalidStrictPause: annotation subflow.dev/sidecar-strict-pause="yes" is not a choice: want true or false`},
		{"a CA ConfigMap that is no name", badCA, nil,
			`InvalidTLSTrustCerts: ConfigMap subflow key tlsTrustCertsConfigMap="Pulsar CA" is not a ConfigMap name`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := appPod(tc.ns, inject("sidecar"), tc.annotations)
			declared := pod.Spec.DeepCopy()
			stored := create(t, k8s, pod)
			if got := stored.Annotations[webhooks.SkippedAnnotation]; !strings.HasPrefix(got, tc.want) {
				t.Errorf("annotation %s = %q, want it to start with %q", webhooks.SkippedAnnotation, got, tc.want)
			}
			checkUnchangedSpec(t, declared, stored)
		})
	}
}
