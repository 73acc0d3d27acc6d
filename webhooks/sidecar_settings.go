package webhooks

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Per-pod settings of the injected sidecar (sidecar mode; agent mode has no sidecar and ignores
// them). Each resource annotation replaces one entry of the controller's --sidecar-requests or
// --sidecar-limits with a Kubernetes quantity, one annotation per entry as Istio's
// sidecar.istio.io/proxyCPU and proxyMemoryLimit are; what a pod does not set stays the
// controller's.
const (
	SidecarCPURequestAnnotation    = "subflow.dev/sidecar-cpu-request"
	SidecarMemoryRequestAnnotation = "subflow.dev/sidecar-memory-request"
	SidecarCPULimitAnnotation      = "subflow.dev/sidecar-cpu-limit"
	SidecarMemoryLimitAnnotation   = "subflow.dev/sidecar-memory-limit"
	// SidecarStrictPauseAnnotation "true" runs the sidecar with --strict-pause: a pause takes
	// back what the client had buffered (docs/sidecar.md). "false" or absent: the default pause.
	SidecarStrictPauseAnnotation = "subflow.dev/sidecar-strict-pause"
)

// resourceAnnotation is one entry a pod may set.
type resourceAnnotation struct {
	annotation string
	resource   corev1.ResourceName
	limit      bool
	example    string
}

var resourceAnnotations = []resourceAnnotation{
	{SidecarCPURequestAnnotation, corev1.ResourceCPU, false, "100m"},
	{SidecarMemoryRequestAnnotation, corev1.ResourceMemory, false, "64Mi"},
	{SidecarCPULimitAnnotation, corev1.ResourceCPU, true, "500m"},
	{SidecarMemoryLimitAnnotation, corev1.ResourceMemory, true, "256Mi"},
}

// sidecarResources are the controller's requests and limits with the pod's annotations applied.
// A value the API server would refuse in the pod (not a quantity, negative, a request above its
// limit) is refused here, so that the pod is still admitted, unwired, with the reason.
func sidecarResources(pod *corev1.Pod, defaults corev1.ResourceRequirements) (corev1.ResourceRequirements, *skip) {
	r := *defaults.DeepCopy()
	from := map[entry]string{} // the annotation each entry came from
	for _, a := range resourceAnnotations {
		value, ok := pod.Annotations[a.annotation]
		if !ok {
			continue
		}
		q, err := resource.ParseQuantity(value)
		switch {
		case a.limit && (err != nil || q.Sign() <= 0):
			return r, skipped(ReasonInvalidSidecarResources, "annotation %s=%q is not a quantity: want a positive Kubernetes quantity such as %s", a.annotation, value, a.example)
		case err != nil || q.Sign() < 0:
			return r, skipped(ReasonInvalidSidecarResources, "annotation %s=%q is not a quantity: want a Kubernetes quantity, 0 or more, such as %s", a.annotation, value, a.example)
		}
		list := &r.Requests
		if a.limit {
			list = &r.Limits
		}
		if *list == nil {
			*list = corev1.ResourceList{}
		}
		(*list)[a.resource] = q
		from[entry{a.resource, a.limit}] = "annotation " + a.annotation
	}
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		request, hasRequest := r.Requests[name]
		limit, hasLimit := r.Limits[name]
		if hasRequest && hasLimit && request.Cmp(limit) > 0 {
			return r, skipped(ReasonInvalidSidecarResources, "the sidecar's %s request %s (%s) is above its limit %s (%s): set both",
				name, request.String(), origin(from, name, false), limit.String(), origin(from, name, true))
		}
	}
	return r, nil
}

// entry is a request or a limit of one resource.
type entry struct {
	resource corev1.ResourceName
	limit    bool
}

// origin says where an entry came from, for the reason.
func origin(from map[entry]string, name corev1.ResourceName, limit bool) string {
	if source, ok := from[entry{name, limit}]; ok {
		return source
	}
	if limit {
		return "the controller's --sidecar-limits"
	}
	return "the controller's --sidecar-requests"
}

// strictPauseOf reads SidecarStrictPauseAnnotation.
func strictPauseOf(pod *corev1.Pod) (bool, *skip) {
	switch value, ok := pod.Annotations[SidecarStrictPauseAnnotation]; {
	case !ok || value == "false":
		return false, nil
	case value == "true":
		return true, nil
	default:
		return false, skipped(ReasonInvalidStrictPause, "annotation %s=%q is not a choice: want true or false", SidecarStrictPauseAnnotation, value)
	}
}

// sidecarSettings applies the pod's own sidecar settings to w.
func sidecarSettings(pod *corev1.Pod, w *wiring) *skip {
	var err *skip
	if w.resources, err = sidecarResources(pod, w.resources); err != nil {
		return err
	}
	w.strictPause, err = strictPauseOf(pod)
	return err
}
