package controllers

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// A pod as a Deployment makes it, with the pieces subflow reads and many it does not.
func realisticPod(variant int) *corev1.Pod {
	env := []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}
	for i := range 30 {
		env = append(env, corev1.EnvVar{Name: fmt.Sprintf("SETTING_%d", i), Value: strings.Repeat("v", 40)})
	}
	probe := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}}}
	app := corev1.Container{Name: "app", Image: "registry.example/orders:1.2.3", Command: []string{"/app", "--serve"}, Env: env,
		Ports:          []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
		LivenessProbe:  probe,
		ReadinessProbe: probe,
		VolumeMounts:   []corev1.VolumeMount{{Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"}},
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("orders-%d", variant), Namespace: "shop", UID: "u-1", ResourceVersion: "42",
			Labels:          map[string]string{"app": "orders", "pod-template-hash": "5d9f"},
			Annotations:     map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-12-01T00:00:00Z", "prometheus.io/scrape": "true"},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate}},
			OwnerReferences: []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "orders-5d9f", UID: "rs"}},
		},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{app},
			Volumes: []corev1.Volume{{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}}}}}}},
			Tolerations: []corev1.Toleration{{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}},
			NodeName:    "node-7",
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.7", PodIPs: []corev1.PodIP{{IP: "10.0.0.7"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "app", RestartCount: 2, Image: "registry.example/orders:1.2.3", ImageID: "sha256:abc",
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}},
	}
	c := &pod.Spec.Containers[0]
	switch variant {
	case 1: // wired for the agent by the webhook: the control port, the token mount
		pod.Annotations[subflowv1.InjectedAnnotation] = "agent"
		c.Ports = append(c.Ports, corev1.ContainerPort{Name: "subflow", ContainerPort: 9470})
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "subflow-token", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: DefaultTokenSecret}}})
	case 2: // the sidecar as a native sidecar serving https, restarted once
		pod.Spec.InitContainers = []corev1.Container{{Name: "subflow-sidecar", Image: "sidecar:1", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
			Ports: []corev1.ContainerPort{{Name: "subflow-https", ContainerPort: 9443}}}}
		pod.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "subflow-sidecar", RestartCount: 1}}
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			Sources: []corev1.VolumeProjection{{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: DefaultTokenSecret}}}}}}})
	case 3: // the token as an env var, terminating
		c.Env = append(c.Env, corev1.EnvVar{Name: "SUBFLOW_TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: DefaultTokenSecret}, Key: "token"}}})
		pod.DeletionTimestamp = &metav1.Time{}
	case 4: // asked for injection and skipped, the token through envFrom
		pod.Labels[subflowv1.InjectLabel] = "sidecar"
		pod.Annotations[subflowv1.InjectionSkippedAnnotation] = "NoBrokerURL: no ConfigMap"
		c.EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: DefaultTokenSecret}}}}
	case 5: // labelled, never injected, no IP yet
		pod.Labels[subflowv1.InjectLabel] = "agent"
		pod.Status.PodIP, pod.Status.PodIPs = "", nil
	}
	return pod
}

// Every question the controller asks of a pod gets the same answer from its cached form, and
// the cached form drops what it never reads.
func TestCachedPodAnswersAsThePod(t *testing.T) {
	flow := &subflowv1.SubscriptionFlow{}
	byName := intstr.FromString("http")
	refused := &AgentError{Status: http.StatusUnauthorized}
	for variant := range 6 {
		pod := realisticPod(variant)
		obj, err := cachedPod(pod.DeepCopy())
		if err != nil {
			t.Fatal(err)
		}
		cached := obj.(*corev1.Pod)
		t.Run(pod.Name, func(t *testing.T) {
			for _, spec := range []subflowv1.AgentSpec{{}, {Port: &byName}} {
				if got, want := agentBaseURL(cached, spec), agentBaseURL(pod, spec); got != want {
					t.Errorf("agentBaseURL(%+v) = %q cached, %q from the pod", spec, got, want)
				}
				if got, want := namesAgentPort(cached, spec), namesAgentPort(pod, spec); got != want {
					t.Errorf("namesAgentPort(%+v) = %v cached, %v from the pod", spec, got, want)
				}
			}
			for _, pushErr := range []error{nil, refused, errors.New("connection refused")} {
				if got, want := wiringProblems(cached, flow, pushErr), wiringProblems(pod, flow, pushErr); !slices.Equal(got, want) {
					t.Errorf("wiringProblems(%v) = %q cached, %q from the pod", pushErr, got, want)
				}
			}
			checks := []struct {
				what      string
				got, want any
			}{
				{"usesSecret", usesSecret(cached, DefaultTokenSecret), usesSecret(pod, DefaultTokenSecret)},
				{"restarts", restarts(cached), restarts(pod)},
				{"pushable", pushable(cached), pushable(pod)},
				{"labels", fmt.Sprint(cached.Labels), fmt.Sprint(pod.Labels)},
				{"identity", cached.Name + "/" + cached.Namespace + "/" + string(cached.UID) + "/" + cached.ResourceVersion,
					pod.Name + "/" + pod.Namespace + "/" + string(pod.UID) + "/" + pod.ResourceVersion},
				{"phase", cached.Status.Phase, pod.Status.Phase},
			}
			for _, c := range checks {
				if c.got != c.want {
					t.Errorf("%s = %v cached, %v from the pod", c.what, c.got, c.want)
				}
			}
			app := cached.Spec.Containers[0]
			if app.Image != "" || len(app.Command) > 0 || app.LivenessProbe != nil || len(cached.Spec.Tolerations) > 0 ||
				len(cached.Status.Conditions) > 0 || len(cached.ManagedFields) > 0 || cached.Annotations["prometheus.io/scrape"] != "" {
				t.Errorf("the cached pod kept what the controller never reads: %+v", cached)
			}
			for _, e := range app.Env {
				if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
					t.Errorf("the cached pod kept env var %s, not read from a Secret", e.Name)
				}
			}
			t.Logf("%d bytes as the API server sends it, %d cached", pod.Size(), cached.Size())
		})
	}
	if obj, _ := cachedPod("not a pod"); obj != "not a pod" {
		t.Errorf("cachedPod changed an object that is no pod: %v", obj)
	}
}
