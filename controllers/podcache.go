package controllers

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// cachedPod keeps of a pod only what the controller reads, so that the cache of a large fleet
// holds a few hundred bytes per pod instead of its whole spec and status (images, commands,
// environment, probes, resources, tolerations, conditions, container states): matching
// (labels), pushing (IP, phase, deletion, the named control ports, native sidecars), restarts,
// and the wiring diagnosis (subflow.dev/ annotations, the token Secret's volumes and env vars).
// Objects other than pods pass unchanged. Every reader of the manager's cached pods sees this
// form; read a pod through the API server for anything else.
func cachedPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return &corev1.Pod{
		TypeMeta: pod.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion,
			Generation: pod.Generation, CreationTimestamp: pod.CreationTimestamp, DeletionTimestamp: pod.DeletionTimestamp,
			Labels: pod.Labels, Annotations: subflowAnnotations(pod.Annotations),
		},
		Spec: corev1.PodSpec{
			Containers:     cachedContainers(pod.Spec.Containers),
			InitContainers: cachedContainers(pod.Spec.InitContainers),
			Volumes:        secretVolumes(pod.Spec.Volumes),
		},
		Status: corev1.PodStatus{
			Phase: pod.Status.Phase, PodIP: pod.Status.PodIP, PodIPs: pod.Status.PodIPs,
			ContainerStatuses:     restartCounts(pod.Status.ContainerStatuses),
			InitContainerStatuses: restartCounts(pod.Status.InitContainerStatuses),
		},
	}, nil
}

func subflowAnnotations(in map[string]string) map[string]string {
	var out map[string]string
	for k, v := range in {
		if strings.HasPrefix(k, "subflow.dev/") {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

// cachedContainers keeps names, ports, the restart policy (a native sidecar's Always) and the
// environment read from Secrets.
func cachedContainers(in []corev1.Container) []corev1.Container {
	if len(in) == 0 {
		return nil
	}
	out := make([]corev1.Container, len(in))
	for i, c := range in {
		out[i] = corev1.Container{Name: c.Name, Ports: c.Ports, RestartPolicy: c.RestartPolicy}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				out[i].Env = append(out[i].Env, corev1.EnvVar{Name: e.Name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: e.ValueFrom.SecretKeyRef}})
			}
		}
		for _, e := range c.EnvFrom {
			if e.SecretRef != nil {
				out[i].EnvFrom = append(out[i].EnvFrom, corev1.EnvFromSource{SecretRef: e.SecretRef})
			}
		}
	}
	return out
}

// secretVolumes keeps the volumes that come from Secrets, directly or projected.
func secretVolumes(in []corev1.Volume) []corev1.Volume {
	var out []corev1.Volume
	for _, v := range in {
		switch {
		case v.Secret != nil:
			out = append(out, corev1.Volume{Name: v.Name, VolumeSource: corev1.VolumeSource{Secret: v.Secret}})
		case v.Projected != nil:
			var sources []corev1.VolumeProjection
			for _, s := range v.Projected.Sources {
				if s.Secret != nil {
					sources = append(sources, corev1.VolumeProjection{Secret: s.Secret})
				}
			}
			if len(sources) > 0 {
				out = append(out, corev1.Volume{Name: v.Name, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: sources}}})
			}
		}
	}
	return out
}

func restartCounts(in []corev1.ContainerStatus) []corev1.ContainerStatus {
	if len(in) == 0 {
		return nil
	}
	out := make([]corev1.ContainerStatus, len(in))
	for i, s := range in {
		out[i] = corev1.ContainerStatus{Name: s.Name, RestartCount: s.RestartCount}
	}
	return out
}
