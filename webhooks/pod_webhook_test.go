package webhooks_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/subflow-dev/subflow/webhooks"
)

func appPod(ns string, labels, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "app-", Labels: labels, Annotations: annotations},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app:1"}}},
	}
}

func inject(mode string) map[string]string { return map[string]string{webhooks.InjectLabel: mode} }

// create creates the pod and returns it as the API server stored it.
func create(t *testing.T, c client.Client, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	if err := c.Create(context.Background(), pod); err != nil {
		t.Fatalf("creating the pod: %v", err)
	}
	stored := &corev1.Pod{}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(pod), stored); err != nil {
		t.Fatal(err)
	}
	return stored
}

func brokerConfig(t *testing.T, ns string, data map[string]string) {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: webhooks.ConfigMapName}, Data: data}
	if err := k8s.Create(context.Background(), cm); err != nil {
		t.Fatal(err)
	}
}

func container(pod *corev1.Pod, name string) *corev1.Container {
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i]
		}
	}
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == name {
			return &pod.Spec.InitContainers[i]
		}
	}
	return nil
}

func volume(pod *corev1.Pod, name string) *corev1.Volume {
	for i := range pod.Spec.Volumes {
		if pod.Spec.Volumes[i].Name == name {
			return &pod.Spec.Volumes[i]
		}
	}
	return nil
}

func env(c *corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

func port(c *corev1.Container, name string) *corev1.ContainerPort {
	for i := range c.Ports {
		if c.Ports[i].Name == name {
			return &c.Ports[i]
		}
	}
	return nil
}

// checkAgentWiring checks what README's hand wiring declares, on the application container.
func checkAgentWiring(t *testing.T, pod *corev1.Pod, app string, wantPort int32) {
	t.Helper()
	if got := pod.Annotations[webhooks.InjectedAnnotation]; got != webhooks.ModeAgent {
		t.Errorf("annotation %s = %q, want agent (skipped: %q)", webhooks.InjectedAnnotation, got, pod.Annotations[webhooks.SkippedAnnotation])
	}
	v := volume(pod, "subflow-token")
	if v == nil || v.Secret == nil || v.Secret.SecretName != "subflow-agent-token" {
		t.Errorf("volume subflow-token = %+v, want the Secret subflow-agent-token", v)
	}
	c := container(pod, app)
	if len(c.VolumeMounts) == 0 || !reflect.DeepEqual(c.VolumeMounts[len(c.VolumeMounts)-1], corev1.VolumeMount{Name: "subflow-token", MountPath: "/var/run/subflow", ReadOnly: true}) {
		t.Errorf("container %s mounts %+v, want subflow-token read-only at /var/run/subflow", app, c.VolumeMounts)
	}
	if e := env(c, "POD_NAME"); e == nil || e.ValueFrom == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("container %s POD_NAME = %+v, want the pod's metadata.name", app, e)
	}
	if p := port(c, "subflow"); p == nil || p.ContainerPort != wantPort {
		t.Errorf("container %s port subflow = %+v, want %d", app, p, wantPort)
	}
}

func TestAgentModeWiresThePod(t *testing.T) {
	ns := namespace(t, k8s)
	pod := create(t, k8s, appPod(ns, inject("agent"), nil))
	checkAgentWiring(t, pod, "app", 9470)
	// Optional: a pod created before the first flow of its namespace (and so its token) starts.
	if v := volume(pod, "subflow-token"); v.Secret.Optional == nil || !*v.Secret.Optional {
		t.Errorf("the token volume is not optional: %+v", v.Secret)
	}
	if _, ok := pod.Annotations[webhooks.SkippedAnnotation]; ok {
		t.Errorf("a wired pod carries %s", webhooks.SkippedAnnotation)
	}
}

func TestAgentModeHonoursPortAndContainerAnnotations(t *testing.T) {
	ns := namespace(t, k8s)
	pod := appPod(ns, inject("agent"), map[string]string{webhooks.AgentPortAnnotation: "9555", webhooks.ContainerAnnotation: "worker"})
	pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: "worker", Image: "worker:1"})
	stored := create(t, k8s, pod)
	checkAgentWiring(t, stored, "worker", 9555)
	if app := container(stored, "app"); len(app.Env)+len(app.Ports)+len(app.VolumeMounts) != 0 {
		t.Errorf("the container not named was changed: %+v", app)
	}
}

func TestSidecarModeAddsANativeSidecar(t *testing.T) {
	ns := namespace(t, k8s)
	brokerConfig(t, ns, map[string]string{webhooks.BrokerURLKey: "pulsar://pulsar-broker.pulsar:6650"})
	pod := appPod(ns, inject("sidecar"), nil)
	pod.Spec.InitContainers = []corev1.Container{{Name: "migrate", Image: "migrate:1"}}
	stored := create(t, k8s, pod)

	if got := stored.Annotations[webhooks.InjectedAnnotation]; got != webhooks.ModeSidecar {
		t.Fatalf("annotation %s = %q, want sidecar (skipped: %q)", webhooks.InjectedAnnotation, got, stored.Annotations[webhooks.SkippedAnnotation])
	}
	inits := stored.Spec.InitContainers
	if len(inits) != 2 || inits[0].Name != "migrate" || inits[1].Name != "subflow-sidecar" {
		t.Fatalf("init containers = %v, want migrate then subflow-sidecar", names(inits))
	}
	sc := inits[1]
	if sc.RestartPolicy == nil || *sc.RestartPolicy != corev1.ContainerRestartPolicyAlways || sc.Image != sidecarImage {
		t.Errorf("sidecar restartPolicy %v image %q, want Always and %q", sc.RestartPolicy, sc.Image, sidecarImage)
	}
	wantArgs := []string{"--broker-url=pulsar://pulsar-broker.pulsar:6650", "--listen=127.0.0.1:6650", "--control-addr=:9470",
		"--token-file=/var/run/subflow/token", "--admin-credentials-file=/var/run/subflow-admin/credentials"}
	if !reflect.DeepEqual(sc.Args, wantArgs) {
		t.Errorf("sidecar args = %q, want %q", sc.Args, wantArgs)
	}
	if p := port(&sc, "subflow"); p == nil || p.ContainerPort != 9470 {
		t.Errorf("sidecar port subflow = %+v, want 9470", p)
	}
	for _, v := range []struct{ volume, secret string }{{"subflow-token", "subflow-agent-token"}, {"subflow-admin-credentials", "subflow-admin-credentials"}} {
		if got := volume(stored, v.volume); got == nil || got.Secret == nil || got.Secret.SecretName != v.secret {
			t.Errorf("volume %s = %+v, want Secret %s", v.volume, got, v.secret)
		}
	}
	app := container(stored, "app")
	if e := env(app, "PULSAR_SERVICE_URL"); e == nil || e.Value != "pulsar://localhost:6650" {
		t.Errorf("application PULSAR_SERVICE_URL = %+v, want pulsar://localhost:6650", e)
	}
	if len(app.Ports)+len(app.VolumeMounts) != 0 {
		t.Errorf("sidecar mode changed the application's ports or mounts: %+v", app)
	}
}

func TestSidecarModeAdminSecretFromTheNamespace(t *testing.T) {
	ns := namespace(t, k8s)
	brokerConfig(t, ns, map[string]string{webhooks.BrokerURLKey: "pulsar+ssl://pulsar:6651", webhooks.AdminSecretKey: "pulsar-admin",
		webhooks.AdminURLKey: "https://pulsar:8443"})
	stored := create(t, k8s, appPod(ns, inject("sidecar"), nil))
	if got := volume(stored, "subflow-admin-credentials"); got == nil || got.Secret.SecretName != "pulsar-admin" {
		t.Fatalf("admin volume = %+v, want Secret pulsar-admin", got)
	}
	if args := stored.Spec.InitContainers[0].Args; !slices.Contains(args, "--admin-url=https://pulsar:8443") {
		t.Errorf("sidecar args = %q, want --admin-url=https://pulsar:8443 from the ConfigMap", args)
	}
}

// A pod that asks for it gets a start-gated sidecar: it consumes nothing before the controller's
// first push.
func TestSidecarModeStartGatedOnRequest(t *testing.T) {
	ns := namespace(t, k8s)
	brokerConfig(t, ns, map[string]string{webhooks.BrokerURLKey: "pulsar://pulsar:6650"})
	for value, want := range map[string]bool{"true": true, "false": false} {
		stored := create(t, k8s, appPod(ns, inject("sidecar"), map[string]string{webhooks.StartGatedAnnotation: value}))
		if got := slices.Contains(stored.Spec.InitContainers[0].Args, "--start-gated"); got != want {
			t.Errorf("%s=%s: sidecar args %q, --start-gated %v, want %v", webhooks.StartGatedAnnotation, value, stored.Spec.InitContainers[0].Args, got, want)
		}
	}
}

func TestPodWithoutTheLabelIsNotSent(t *testing.T) {
	ns := namespace(t, k8s)
	pod := appPod(ns, map[string]string{"app": "orders"}, nil)
	stored := create(t, k8s, pod)
	if len(stored.Annotations) != 0 || len(stored.Spec.Volumes) != 0 || len(stored.Spec.Containers[0].Env) != 0 {
		t.Fatalf("an unlabelled pod was changed: annotations %v, volumes %v", stored.Annotations, stored.Spec.Volumes)
	}
}

// TestPodKeepsWhatItDeclares: pieces already there under our names are kept. When they do the
// job the rest is added; when not, the pod is admitted exactly as it came, with the reason.
func TestPodKeepsWhatItDeclares(t *testing.T) {
	ns := namespace(t, k8s)
	tokenVolume := corev1.Volume{Name: "subflow-token", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "subflow-agent-token"}}}
	cases := []struct {
		name        string
		change      func(*corev1.Pod)
		wantSkipped string // "" means wired
	}{
		{"hand-wired like README", func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{tokenVolume}
			c := &p.Spec.Containers[0]
			c.VolumeMounts = []corev1.VolumeMount{{Name: "subflow-token", MountPath: "/var/run/subflow", ReadOnly: true}}
			c.Env = []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}
			c.Ports = []corev1.ContainerPort{{Name: "subflow", ContainerPort: 9470}}
		}, ""},
		{"only the volume", func(p *corev1.Pod) { p.Spec.Volumes = []corev1.Volume{tokenVolume} }, ""},
		{"POD_NAME set otherwise", func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "POD_NAME", Value: "worker"}}
		}, "Conflict: container app already sets POD_NAME"},
		{"port subflow on another number", func(p *corev1.Pod) {
			p.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "subflow", ContainerPort: 9555}}
		}, `Conflict: container app already declares port subflow as 9555, not 9470 (set annotation subflow.dev/agent-port: "9555"`},
		{"port 9470 taken", func(p *corev1.Pod) {
			p.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 9470}}
		}, `Conflict: container app already uses port 9470 for "http"`},
		// The controller looks for the control port only where an agent can serve it: a plain
		// init container has exited before the application starts.
		{"port subflow on a plain init container", func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "migrate", Image: "migrate:1",
				Ports: []corev1.ContainerPort{{Name: "subflow", ContainerPort: 9470}}}}
		}, "Conflict: init container migrate declares port subflow but is not a native sidecar (restartPolicy Always)"},
		{"volume of the same name from a ConfigMap", func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "subflow-token", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: "x"}}}}}
		}, "Conflict: volume subflow-token is already declared and does not project key token of Secret subflow-agent-token"},
		{"something else mounted at the token path", func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "other", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "other", MountPath: "/var/run/subflow"}}
		}, "Conflict: container app already mounts volume other at /var/run/subflow"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := appPod(ns, inject("agent"), nil)
			tc.change(pod)
			declared := pod.Spec.DeepCopy()
			stored := create(t, k8s, pod)
			if tc.wantSkipped == "" {
				checkAgentWiring(t, stored, "app", 9470)
				return
			}
			if got := stored.Annotations[webhooks.SkippedAnnotation]; !strings.HasPrefix(got, tc.wantSkipped) {
				t.Errorf("annotation %s = %q, want it to start with %q", webhooks.SkippedAnnotation, got, tc.wantSkipped)
			}
			if _, ok := stored.Annotations[webhooks.InjectedAnnotation]; ok {
				t.Errorf("a skipped pod carries %s", webhooks.InjectedAnnotation)
			}
			checkUnchangedSpec(t, declared, stored)
		})
	}
}

// checkUnchangedSpec compares what injection touches; the API server defaults the rest.
func checkUnchangedSpec(t *testing.T, declared *corev1.PodSpec, stored *corev1.Pod) {
	t.Helper()
	if len(stored.Spec.Volumes) != len(declared.Volumes) || len(stored.Spec.InitContainers) != len(declared.InitContainers) {
		t.Errorf("volumes %v, init containers %v: want the pod's own only", stored.Spec.Volumes, names(stored.Spec.InitContainers))
	}
	for i, c := range declared.Containers {
		got := stored.Spec.Containers[i]
		if len(got.Env) != len(c.Env) || len(got.Ports) != len(c.Ports) || len(got.VolumeMounts) != len(c.VolumeMounts) {
			t.Errorf("container %s: env %v ports %v mounts %v, want the pod's own only", c.Name, got.Env, got.Ports, got.VolumeMounts)
		}
	}
}

// TestPodAdmittedWithTheReason: whatever is wrong, the pod is created, unwired, and says why.
func TestPodAdmittedWithTheReason(t *testing.T) {
	ns := namespace(t, k8s)
	noConfig := namespace(t, k8s)
	badURL := namespace(t, k8s)
	brokerConfig(t, badURL, map[string]string{webhooks.BrokerURLKey: "http://pulsar:8080"})
	badAdmin := namespace(t, k8s)
	brokerConfig(t, badAdmin, map[string]string{webhooks.BrokerURLKey: "pulsar://pulsar:6650", webhooks.AdminURLKey: "pulsar:8080"})
	cases := []struct {
		name, ns    string
		labels      map[string]string
		annotations map[string]string
		want        string
	}{
		{"a label value that is no mode", ns, inject("agnet"), nil,
			`InvalidMode: label subflow.dev/inject="agnet" is not a mode: want agent or sidecar`},
		{"a port that is no port", ns, inject("agent"), map[string]string{webhooks.AgentPortAnnotation: "http"},
			`InvalidPort: annotation subflow.dev/agent-port="http" is not a port: want a number from 1 to 65535`},
		{"a start gate that is no choice", ns, inject("sidecar"), map[string]string{webhooks.StartGatedAnnotation: "yes"},
			`InvalidStartGated: annotation subflow.dev/start-gated="yes" is not a choice: want true or false`},
		{"a container that is not there", ns, inject("agent"), map[string]string{webhooks.ContainerAnnotation: "worker"},
			`NoContainer: container "worker" named by annotation subflow.dev/container is not in the pod`},
		{"sidecar without the namespace's ConfigMap", noConfig, inject("sidecar"), nil,
			"NoBrokerURL: sidecar mode needs the broker URL: there is no ConfigMap subflow in namespace " + noConfig},
		{"sidecar with a URL that is no broker's", badURL, inject("sidecar"), nil,
			`InvalidBrokerURL: ConfigMap subflow key brokerServiceURL="http://pulsar:8080" is not a broker URL`},
		{"sidecar with an admin URL that is no URL", badAdmin, inject("sidecar"), nil,
			`InvalidAdminURL: ConfigMap subflow key adminServiceURL="pulsar:8080" is not an admin URL`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := appPod(tc.ns, tc.labels, tc.annotations)
			declared := pod.Spec.DeepCopy()
			stored := create(t, k8s, pod)
			if got := stored.Annotations[webhooks.SkippedAnnotation]; !strings.HasPrefix(got, tc.want) {
				t.Errorf("annotation %s = %q, want it to start with %q", webhooks.SkippedAnnotation, got, tc.want)
			}
			checkUnchangedSpec(t, declared, stored)
		})
	}
}

// TestReinvocationChangesNothing sends each stored pod back through the webhook over HTTPS, as
// the API server does with reinvocationPolicy IfNeeded: the answer carries no patch.
func TestReinvocationChangesNothing(t *testing.T) {
	ns := namespace(t, k8s)
	brokerConfig(t, ns, map[string]string{webhooks.BrokerURLKey: "pulsar://pulsar:6650"})
	conflicting := appPod(ns, inject("agent"), nil)
	conflicting.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "POD_NAME", Value: "x"}}
	for name, pod := range map[string]*corev1.Pod{
		"agent": appPod(ns, inject("agent"), nil), "sidecar": appPod(ns, inject("sidecar"), nil),
		"skipped": conflicting, "bad label": appPod(ns, inject("yes"), nil),
	} {
		t.Run(name, func(t *testing.T) {
			stored := create(t, k8s, pod)
			response := review(t, stored)
			if !response.Allowed || len(response.Patch) != 0 {
				t.Fatalf("second invocation: allowed %v, patch %s; want allowed with no patch", response.Allowed, response.Patch)
			}
		})
	}
}

// review posts an AdmissionReview for the pod's creation to the webhook server, trusting the CA
// the webhook configuration trusts.
func review(t *testing.T, pod *corev1.Pod) *admissionv1.AdmissionResponse {
	t.Helper()
	ca, err := servedCA(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: types.UID("reinvocation"), Namespace: pod.Namespace, Operation: admissionv1.Create,
			Kind:     metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Object:   runtime.RawExtension{Raw: raw}},
	})
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	httpClient := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: servingName}}}
	url := fmt.Sprintf("https://%s:%d%s", serving.LocalServingHost, serving.LocalServingPort, webhooks.PodPath)
	resp, err := httpClient.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var answer admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil || answer.Response == nil {
		t.Fatalf("decoding the webhook's answer (HTTP %d): %v", resp.StatusCode, err)
	}
	return answer.Response
}

func names(cs []corev1.Container) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}
