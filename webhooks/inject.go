package webhooks

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// The pod's opt-in and its outcome (docs/onboarding.md).
const (
	// InjectLabel opts a pod in; its value is the mode. The webhook only sees pods carrying it.
	InjectLabel = subflowv1.InjectLabel
	// ModeAgent wires a pod whose application links the agent library.
	ModeAgent = "agent"
	// ModeSidecar adds the protocol-proxy sidecar for applications in any language.
	ModeSidecar = "sidecar"

	// InjectedAnnotation records the mode a pod was wired in.
	InjectedAnnotation = subflowv1.InjectedAnnotation
	// SkippedAnnotation records why a pod that asked was admitted unwired: "<Reason>: <message>".
	SkippedAnnotation = subflowv1.InjectionSkippedAnnotation
	// AgentPortAnnotation sets the control port (default protocol.DefaultPort).
	AgentPortAnnotation = "subflow.dev/agent-port"
	// ContainerAnnotation names the application container when the pod has several.
	ContainerAnnotation = "subflow.dev/container"
	// StartGatedAnnotation "true" starts the pod's consumers gated: nothing is consumed until
	// the controller's first push, or the sync timeout (sidecar --start-gated; agent mode
	// StartGatedEnv). "false" never gates. Absent, a pod that a flow selects at admission starts
	// gated (start.go).
	StartGatedAnnotation = "subflow.dev/start-gated"
	// kubectlDefaultContainer is kubectl's own choice of container, used when ours is absent.
	kubectlDefaultContainer = "kubectl.kubernetes.io/default-container"
)

// Reasons recorded in SkippedAnnotation, before the colon; stable for the controller's status.
const (
	ReasonInvalidMode        = "InvalidMode"
	ReasonInvalidPort        = "InvalidPort"
	ReasonInvalidStartGated  = "InvalidStartGated"
	ReasonNoContainer        = "NoContainer"
	ReasonConflict           = "Conflict"
	ReasonNoBrokerURL        = "NoBrokerURL"
	ReasonNoSidecarImage     = "NoSidecarImage"
	ReasonNamespaceConfig    = "NamespaceConfigUnreadable"
	ReasonInvalidBrokerURL   = "InvalidBrokerURL"
	ReasonInvalidAdminSecret = "InvalidAdminSecret"
	ReasonInvalidAdminURL    = "InvalidAdminURL"
	// ReasonInvalidTLSTrustCerts: the namespace's TLSTrustCertsKey names no possible ConfigMap.
	ReasonInvalidTLSTrustCerts = "InvalidTLSTrustCerts"
	// ReasonInvalidSidecarResources: a sidecar resource annotation is no quantity, or makes a
	// request exceed its limit (sidecar_settings.go).
	ReasonInvalidSidecarResources = "InvalidSidecarResources"
	ReasonInvalidStrictPause      = "InvalidStrictPause"
)

// What injection adds. The token paths are the ones README's hand wiring uses.
const (
	TokenVolume    = "subflow-token"
	TokenSecret    = subflowv1.DefaultTokenSecret
	TokenKey       = subflowv1.DefaultTokenKey
	TokenDir       = "/var/run/subflow"
	PodNameEnv     = "POD_NAME"
	AdminVolume    = "subflow-admin-credentials"
	AdminKey       = "credentials"
	AdminDir       = "/var/run/subflow-admin"
	TLSCAVolume    = "subflow-tls-ca"
	TLSCAKey       = "ca.crt"
	TLSCADir       = "/var/run/subflow-tls-ca"
	SidecarName    = "subflow-sidecar"
	SidecarListen  = "127.0.0.1:6650"
	ServiceURLEnv  = "PULSAR_SERVICE_URL"
	ServiceURL     = "pulsar://localhost:6650"
	sidecarHealthz = "/healthz"
)

// skip is why a pod is admitted unwired.
type skip struct{ reason, message string }

func (s *skip) Error() string { return s.reason + ": " + s.message }

func skipped(reason, format string, args ...any) *skip {
	return &skip{reason: reason, message: fmt.Sprintf(format, args...)}
}

// wiring is what injection needs besides the pod.
type wiring struct {
	mode         string
	port         int32
	sidecarImage string
	brokerURL    string
	adminURL     string
	adminSecret  string
	// trustCerts names the ConfigMap holding the CA bundle (key TLSCAKey); empty: system roots.
	trustCerts  string
	start       start
	resources   corev1.ResourceRequirements
	strictPause bool
}

// DefaultSidecarResources are the sidecar's requests and limits unless the controller is told
// otherwise (--sidecar-requests, --sidecar-limits): a memory limit well above what the sidecar
// uses at the throughput benchmark's rate (BENCHMARKS.md), no CPU limit (throttling a proxy
// adds latency to every message).
func DefaultSidecarResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
	}
}

// ParseResourceList reads "cpu=10m,memory=32Mi" (the form of kubectl's --requests), for flags.
func ParseResourceList(value string) (corev1.ResourceList, error) {
	list := corev1.ResourceList{}
	for _, item := range strings.Split(value, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		name, quantity, ok := strings.Cut(item, "=")
		if !ok {
			return nil, fmt.Errorf("%q: want name=quantity, e.g. cpu=10m,memory=32Mi", item)
		}
		q, err := resource.ParseQuantity(quantity)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		list[corev1.ResourceName(name)] = q
	}
	return list, nil
}

// modeOf reads the label; the objectSelector lets through any value, so that a typo is recorded.
func modeOf(pod *corev1.Pod) (string, *skip) {
	mode := pod.Labels[InjectLabel]
	if mode != ModeAgent && mode != ModeSidecar {
		return "", skipped(ReasonInvalidMode, "label %s=%q is not a mode: want %s or %s", InjectLabel, mode, ModeAgent, ModeSidecar)
	}
	return mode, nil
}

func portOf(pod *corev1.Pod) (int32, *skip) {
	value, ok := pod.Annotations[AgentPortAnnotation]
	if !ok {
		return protocol.DefaultPort, nil
	}
	port, err := strconv.ParseInt(value, 10, 32)
	if err != nil || port < 1 || port > 65535 {
		return 0, skipped(ReasonInvalidPort, "annotation %s=%q is not a port: want a number from 1 to 65535", AgentPortAnnotation, value)
	}
	return int32(port), nil
}

// appContainer is the container the application runs in: the one the annotation names, else
// kubectl's default container, else the first.
func appContainer(pod *corev1.Pod) (*corev1.Container, *skip) {
	name, source := pod.Annotations[ContainerAnnotation], ContainerAnnotation
	if name == "" {
		name, source = pod.Annotations[kubectlDefaultContainer], kubectlDefaultContainer
	}
	if name == "" {
		if len(pod.Spec.Containers) == 0 {
			return nil, skipped(ReasonNoContainer, "the pod has no container")
		}
		return &pod.Spec.Containers[0], nil
	}
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i], nil
		}
	}
	return nil, skipped(ReasonNoContainer, "container %q named by annotation %s is not in the pod", name, source)
}

// wire adds what w's mode needs to pod, in place. An item the pod already declares under the same
// name is kept: if it does the job (a second invocation finds its own work) nothing changes, else
// wire returns the conflict and pod may be half changed, so callers wire a copy.
func wire(pod *corev1.Pod, w wiring) *skip {
	app, err := appContainer(pod)
	if err != nil {
		return err
	}
	if err := portOnPlainInit(pod); err != nil {
		return err
	}
	if err := ensureVolume(pod, secretVolume(TokenVolume, TokenSecret, TokenKey)); err != nil {
		return err
	}
	if w.mode == ModeAgent {
		if err := ensureMount(app, corev1.VolumeMount{Name: TokenVolume, MountPath: TokenDir, ReadOnly: true}); err != nil {
			return err
		}
		if err := ensureEnv(app, podNameEnv()); err != nil {
			return err
		}
		startEnv(app, w.start)
		return ensurePort(pod, app, w.port)
	}
	if err := ensureVolume(pod, secretVolume(AdminVolume, w.adminSecret, AdminKey)); err != nil {
		return err
	}
	if w.trustCerts != "" {
		if err := ensureVolume(pod, caVolume(w.trustCerts)); err != nil {
			return err
		}
	}
	if err := ensureSidecar(pod, sidecar(w), w.port); err != nil {
		return err
	}
	return ensureEnv(app, corev1.EnvVar{Name: ServiceURLEnv, Value: ServiceURL})
}

// secretVolume projects one key of a Secret as a file of the same name. Optional: the controller
// creates the agent-token Secret once a flow exists in the namespace, and a pod created before
// must still start; the kubelet adds the file when the Secret appears and the agent re-reads it.
func secretVolume(name, secret, key string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		SecretName: secret, Items: []corev1.KeyToPath{{Key: key, Path: key}}, Optional: ptr.To(true)}}}
}

// caVolume projects the CA bundle. Not optional: a missing bundle shows as the pod's event.
func caVolume(configMap string) corev1.Volume {
	return corev1.Volume{Name: TLSCAVolume, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: configMap}, Items: []corev1.KeyToPath{{Key: TLSCAKey, Path: TLSCAKey}}}}}
}

func podNameEnv() corev1.EnvVar {
	return corev1.EnvVar{Name: PodNameEnv, ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}}
}

func ensureVolume(pod *corev1.Pod, want corev1.Volume) *skip {
	kind, name, items := volumeSource(want)
	key := items[0].Key
	for _, have := range pod.Spec.Volumes {
		if have.Name != want.Name {
			continue
		}
		if haveKind, haveName, haveItems := volumeSource(have); haveKind != kind || haveName != name || !projects(haveItems, key) {
			return skipped(ReasonConflict, "volume %s is already declared and does not project key %s of %s %s", want.Name, key, kind, name)
		}
		return nil
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes, want)
	return nil
}

// volumeSource is the Secret or ConfigMap a volume projects, and its items.
func volumeSource(v corev1.Volume) (kind, name string, items []corev1.KeyToPath) {
	switch {
	case v.Secret != nil:
		return "Secret", v.Secret.SecretName, v.Secret.Items
	case v.ConfigMap != nil:
		return "ConfigMap", v.ConfigMap.Name, v.ConfigMap.Items
	}
	return "", "", nil
}

// projects reports whether a volume with these items holds key as a file named key.
func projects(items []corev1.KeyToPath, key string) bool {
	if len(items) == 0 {
		return true
	}
	for _, item := range items {
		if item.Key == key && item.Path == key {
			return true
		}
	}
	return false
}

func ensureMount(c *corev1.Container, want corev1.VolumeMount) *skip {
	for _, have := range c.VolumeMounts {
		switch {
		case have.Name == want.Name && have.MountPath == want.MountPath:
			return nil
		case have.Name == want.Name:
			return skipped(ReasonConflict, "container %s already mounts volume %s at %s, not %s", c.Name, have.Name, have.MountPath, want.MountPath)
		case have.MountPath == want.MountPath:
			return skipped(ReasonConflict, "container %s already mounts volume %s at %s", c.Name, have.Name, have.MountPath)
		}
	}
	c.VolumeMounts = append(c.VolumeMounts, want)
	return nil
}

func ensureEnv(c *corev1.Container, want corev1.EnvVar) *skip {
	for _, have := range c.Env {
		if have.Name != want.Name {
			continue
		}
		if !sameEnvValue(have, want) {
			return skipped(ReasonConflict, "container %s already sets %s to something else than %s (remove it: injection sets it)", c.Name, want.Name, describeEnv(want))
		}
		return nil
	}
	c.Env = append(c.Env, want)
	return nil
}

func sameEnvValue(have, want corev1.EnvVar) bool {
	if want.ValueFrom == nil {
		return have.ValueFrom == nil && have.Value == want.Value
	}
	return have.ValueFrom != nil && have.ValueFrom.FieldRef != nil && have.ValueFrom.FieldRef.FieldPath == want.ValueFrom.FieldRef.FieldPath
}

func describeEnv(e corev1.EnvVar) string {
	if e.ValueFrom != nil {
		return "the pod's " + e.ValueFrom.FieldRef.FieldPath
	}
	return e.Value
}

// ensurePort names the control port in c. The controller finds an agent by that name where an
// agent can serve it (subflowv1.ContainerPortOf), so a same-named port there counts too.
func ensurePort(pod *corev1.Pod, c *corev1.Container, port int32) *skip {
	if other, have, ok := subflowv1.ContainerPortOf(pod, protocol.PortName); ok {
		if have == port {
			return nil
		}
		return skipped(ReasonConflict, "container %s already declares port %s as %d, not %d (set annotation %s: \"%d\" to use it)",
			other, protocol.PortName, have, port, AgentPortAnnotation, have)
	}
	for _, other := range allContainers(pod) {
		for _, have := range other.Ports {
			if have.ContainerPort == port {
				return skipped(ReasonConflict, "container %s already uses port %d for %q (set annotation %s to another port)",
					other.Name, port, have.Name, AgentPortAnnotation)
			}
		}
	}
	c.Ports = append(c.Ports, corev1.ContainerPort{Name: protocol.PortName, ContainerPort: port, Protocol: corev1.ProtocolTCP})
	return nil
}

// portOnPlainInit refuses a pod whose plain init container declares the control port: the
// controller never looks there (subflowv1.ContainerPortOf), as that container has exited before
// the application starts, so it would push to another port and never reach the agent.
func portOnPlainInit(pod *corev1.Pod) *skip {
	if init, ok := subflowv1.PortOnPlainInitContainer(pod, protocol.PortName); ok {
		return skipped(ReasonConflict, "init container %s declares port %s but is not a native sidecar (restartPolicy Always): "+
			"it has exited before the application starts, so the controller never looks for the agent there; "+
			"remove the port from it (injection declares it where the agent runs)", init, protocol.PortName)
	}
	return nil
}

func allContainers(pod *corev1.Pod) []corev1.Container {
	return append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...)
}

// ensureSidecar appends the sidecar after the pod's own init containers (they run before it and
// need no broker through it), so it starts before the application containers.
func ensureSidecar(pod *corev1.Pod, want corev1.Container, port int32) *skip {
	for _, have := range pod.Spec.InitContainers {
		if have.Name != want.Name {
			continue
		}
		if !subflowv1.NativeSidecar(have) {
			return skipped(ReasonConflict, "init container %s is already declared and is not a sidecar (restartPolicy Always)", want.Name)
		}
		return nil
	}
	for _, have := range pod.Spec.Containers {
		if have.Name == want.Name {
			return skipped(ReasonConflict, "container %s is already declared as an application container", want.Name)
		}
	}
	// Any control port already there belongs to something else than the sidecar.
	for _, other := range allContainers(pod) {
		for _, have := range other.Ports {
			if have.Name == protocol.PortName || have.ContainerPort == port {
				return skipped(ReasonConflict, "container %s already declares port %q as %d; the sidecar's control port is %s %d",
					other.Name, have.Name, have.ContainerPort, protocol.PortName, port)
			}
		}
	}
	want.Ports = []corev1.ContainerPort{{Name: protocol.PortName, ContainerPort: port, Protocol: corev1.ProtocolTCP}}
	pod.Spec.InitContainers = append(pod.Spec.InitContainers, want)
	return nil
}

// sidecar is the native sidecar container; ensureSidecar names its control port.
func sidecar(w wiring) corev1.Container {
	mounts := []corev1.VolumeMount{
		{Name: TokenVolume, MountPath: TokenDir, ReadOnly: true},
		{Name: AdminVolume, MountPath: AdminDir, ReadOnly: true},
	}
	if w.trustCerts != "" {
		mounts = append(mounts, corev1.VolumeMount{Name: TLSCAVolume, MountPath: TLSCADir, ReadOnly: true})
	}
	return corev1.Container{
		Name:          SidecarName,
		Image:         w.sidecarImage,
		RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
		Args:          sidecarArgs(w),
		Env:           []corev1.EnvVar{podNameEnv()},
		VolumeMounts:  mounts,
		// The application starts once the proxy answers, so its first connection finds it.
		StartupProbe: &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: sidecarHealthz, Port: intstr.FromString(protocol.PortName)}},
			PeriodSeconds:    1,
			FailureThreshold: 60,
		},
		Resources: w.resources,
		// What Pod Security "restricted" asks of every container; the image runs as 65532.
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false),
			ReadOnlyRootFilesystem:   ptr.To(true),
			RunAsNonRoot:             ptr.To(true),
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
	}
}

// sidecarArgs are SidecarArgs with the pod's own choices.
func sidecarArgs(w wiring) []string {
	args := SidecarArgs(w.brokerURL, w.adminURL, w.port)
	if w.trustCerts != "" {
		args = append(args, "--tls-ca-file="+TLSCADir+"/"+TLSCAKey)
	}
	if w.strictPause {
		args = append(args, "--strict-pause")
	}
	if w.start.gated {
		args = append(args, "--start-gated")
		if w.start.fallback != protocol.Running {
			args = append(args, "--fallback-state="+string(w.start.fallback))
		}
	}
	return args
}

// startEnv tells an agent-mode application how to start, unless the pod already says: the
// application's own environment wins.
func startEnv(app *corev1.Container, s start) {
	if !s.gated {
		return
	}
	want := []corev1.EnvVar{{Name: StartGatedEnv, Value: "true"}}
	if s.fallback != protocol.Running {
		want = append(want, corev1.EnvVar{Name: FallbackStateEnv, Value: string(s.fallback)})
	}
	for _, e := range want {
		if !slices.ContainsFunc(app.Env, func(have corev1.EnvVar) bool { return have.Name == e.Name }) {
			app.Env = append(app.Env, e)
		}
	}
}

// SidecarArgs are the injected sidecar's arguments: the namespace's broker (and admin URL,
// when it names one), the loopback data listener, the control port and the mounted files.
func SidecarArgs(brokerURL, adminURL string, port int32) []string {
	args := []string{
		"--broker-url=" + brokerURL,
		"--listen=" + SidecarListen,
		"--control-addr=:" + strconv.Itoa(int(port)),
		"--token-file=" + TokenDir + "/" + TokenKey,
		"--admin-credentials-file=" + AdminDir + "/" + AdminKey,
	}
	if adminURL != "" {
		args = append(args, "--admin-url="+adminURL)
	}
	return args
}
