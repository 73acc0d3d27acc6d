package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// incident is a Deployment of the example consumer with its flow, paused with kubectl patch,
// with messages produced during the pause.
type incident struct {
	ns, app, sub, topic, selector string
	before, during                []string
	seen                          map[string]int
}

func startIncident(t *testing.T, ns string, k consumerKind, replicas int) *incident {
	in := &incident{ns: ns, app: "orders-worker", sub: "orders-ingest", topic: "persistent://public/default/" + ns,
		selector: "app=orders-worker", seen: map[string]int{}}
	namespace(t, ns)
	k.deploy(t, ns, in.app, replicas, in.topic, in.sub, "")
	apply(t, flow(ns, in.sub, in.app, in.topic, in.sub, "Running"))
	kubectl(t, "rollout", "status", "deployment/"+in.app, "-n", ns, "--timeout=180s")
	kubectl(t, "wait", "sf/"+in.sub, "-n", ns, "--for=condition=Ready", "--timeout=120s")
	in.before = produce(t, in.topic, "before", 20)
	in.waitProcessed(t, in.before)
	kubectl(t, "patch", "sf", in.sub, "-n", ns, "--type", "merge", "-p", `{"spec":{"state":"Paused"}}`)
	kubectl(t, "wait", "sf/"+in.sub, "-n", ns, "--for=condition=Paused", "--timeout=60s")
	in.during = produce(t, in.topic, "during", 20)
	return in
}

func (in *incident) collect(t *testing.T) {
	for p, n := range printed(t, in.ns, in.selector, "app") {
		in.seen[p] = max(in.seen[p], n)
	}
}

func (in *incident) waitProcessed(t *testing.T, want []string) {
	t.Helper()
	eventually(t, 60*time.Second, "every message produced is processed", func() error {
		in.collect(t)
		if m := missing(want, in.seen); len(m) > 0 {
			return fmt.Errorf("%d not processed, e.g. %s", len(m), m[0])
		}
		return nil
	})
}

// resume lets the flow run and checks that every message produced was processed.
func (in *incident) resume(t *testing.T) {
	kubectl(t, "patch", "sf", in.sub, "-n", in.ns, "--type", "merge", "-p", `{"spec":{"state":"Running"}}`)
	in.waitProcessed(t, append(append([]string{}, in.before...), in.during...))
}

// watch observes, until the returned function is called, what must hold while the incident's
// pause holds: no application prints a message produced during the pause, and, with condition,
// the flow's Paused condition stays True. It returns every violation it saw, with its time.
func (in *incident) watch(condition bool) (stop func() []string) {
	var (
		mu         sync.Mutex
		violations []string
		done       = make(chan struct{})
		finished   = make(chan struct{})
	)
	note := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		violations = append(violations, time.Now().Format("15:04:05.000 ")+fmt.Sprintf(format, args...))
	}
	go func() {
		defer close(finished)
		for {
			counts, err := readPrinted(in.ns, in.selector, "app")
			if err == nil {
				for _, p := range in.during {
					if counts[p] > 0 {
						note("an application processed %s", p)
					}
				}
			}
			paused, err := w.cluster.Kubectl(context.Background(), "get", "sf", in.sub, "-n", in.ns,
				"-o", `jsonpath={.status.conditions[?(@.type=="Paused")].status}`)
			if condition && err == nil && strings.TrimSpace(paused) != "True" {
				note("the flow's Paused condition is %q", strings.TrimSpace(paused))
			}
			select {
			case <-done:
				return
			case <-time.After(300 * time.Millisecond): // observation interval
			}
		}
	}()
	return func() []string {
		close(done)
		<-finished
		mu.Lock()
		defer mu.Unlock()
		return violations
	}
}

// TestIncidentPauseHeldThroughUpgradeAndLeaderLoss: during an incident pause the controller is
// upgraded with helm upgrade to a new image tag, and then its leader pod is deleted. No consumer
// resumes, even briefly, the flow's Paused condition stays True throughout, and the new leader
// acts: the resume after it delivers every message.
func TestIncidentPauseHeldThroughUpgradeAndLeaderLoss(t *testing.T) {
	in := startIncident(t, "shop-incident", goAgent, 2)
	stop := in.watch(true)

	if _, err := w.helm(context.Background(), "upgrade", "subflow", "../charts/subflow", "-n", "subflow-system", "--reuse-values",
		"--set", "image.tag="+imageTag+"-next", "--wait", "--timeout", "3m"); err != nil {
		stop()
		t.Fatal(err)
	}
	// The old replicas go after helm's wait; then every controller runs the new tag, and one of
	// them holds the lease.
	var leader string
	eventually(t, 90*time.Second, "only upgraded controllers run, one of them the leader", func() error {
		pods := kubectl(t, "get", "pods", "-n", "subflow-system", "-l", "app.kubernetes.io/component=controller",
			"-o", `jsonpath={range .items[*]}{.metadata.name} {.spec.containers[0].image}{"\n"}{end}`)
		names := map[string]bool{}
		for _, line := range strings.Split(strings.TrimSpace(pods), "\n") {
			name, img, _ := strings.Cut(line, " ")
			if img != image("subflow-controller")+"-next" {
				return fmt.Errorf("controller %s runs %s", name, img)
			}
			names[name] = true
		}
		if leader = leaderPod(t); !names[leader] {
			return fmt.Errorf("the lease is held by %q, not an upgraded controller", leader)
		}
		return nil
	})
	kubectl(t, "delete", "pod", leader, "-n", "subflow-system", "--wait=false")
	eventually(t, 90*time.Second, "a new leader is elected", func() error {
		if now := leaderPod(t); now == leader || now == "" {
			return fmt.Errorf("the lease is held by %q", now)
		}
		return nil
	})
	if v := stop(); len(v) > 0 {
		t.Fatalf("the pause did not hold through the upgrade and the leader's loss:\n%s", strings.Join(v, "\n"))
	}
	in.resume(t)
}

// leaderPod is the controller pod holding the leader-election lease (holderIdentity is
// <pod>_<uuid>).
func leaderPod(t *testing.T) string {
	holder := kubectl(t, "get", "lease", "subflow-controller.subflow.dev", "-n", "subflow-system", "-o", "jsonpath={.spec.holderIdentity}")
	pod, _, _ := strings.Cut(strings.TrimSpace(holder), "_")
	return pod
}

// TestCrashedContainerAndDeletedPodWhilePaused: while the flow is Paused, a container is killed
// on the node and the kubelet restarts it - the application for the Go agent and Python, the
// injected sidecar for Java - and the consumer stays paused; a pod deleted while Paused is
// replaced by one that consumes nothing; after the resume the messages reach the pods.
func TestCrashedContainerAndDeletedPodWhilePaused(t *testing.T) {
	crash := map[string]string{goAgent.name: "app", javaSidecar.name: "subflow-sidecar", pythonSidecar.name: "app"}
	kinds(t, everyConsumer, func(t *testing.T, k consumerKind) {
		in := startIncident(t, namespaceFor("shop-crash", k), k, 2)
		// A replaced pod is not Paused until the controller has pushed to it: only the
		// applications are watched here.
		stop := in.watch(false)
		pods := strings.Fields(kubectl(t, "get", "pods", "-n", in.ns, "-l", in.selector, "-o", "jsonpath={.items[*].metadata.name}"))
		if err := killContainer(t, in.ns, pods[0], crash[k.name]); err != nil {
			stop()
			t.Fatal(err)
		}
		kubectl(t, "delete", "pod", pods[1], "-n", in.ns)
		kubectl(t, "rollout", "status", "deployment/"+in.app, "-n", in.ns, "--timeout=180s")
		eventually(t, 60*time.Second, "every pod is reported paused", func() error { return pausedColumnIs(t, in.ns, in.sub, "2/2") })
		assertNothingProcessed(t, in.ns, in.selector, in.during, 5*time.Second)
		if v := stop(); len(v) > 0 {
			t.Fatalf("the pause did not hold through the crash and the deletion:\n%s", strings.Join(v, "\n"))
		}
		in.resume(t)
	})
}

// killContainer kills a pod's container on the node (SIGKILL through containerd, as a crash) and
// waits until the kubelet has restarted it and it is ready again. Native sidecars are init
// containers.
func killContainer(t *testing.T, ns, pod, container string) error {
	statuses := "containerStatuses"
	if container == "subflow-sidecar" {
		statuses = "initContainerStatuses"
	}
	field := fmt.Sprintf(`{.status.%s[?(@.name==%q)]`, statuses, container)
	id := kubectl(t, "get", "pod", pod, "-n", ns, "-o", "jsonpath="+field+".containerID}")
	if strings.TrimSpace(id) == "" {
		return fmt.Errorf("pod %s has no container %s", pod, container)
	}
	if _, err := w.cluster.Ctr(context.Background(), "tasks", "kill", "-s", "SIGKILL", strings.TrimPrefix(strings.TrimSpace(id), "containerd://")); err != nil {
		return err
	}
	eventually(t, 60*time.Second, "the kubelet restarts the killed "+container+" container", func() error {
		out := kubectl(t, "get", "pod", pod, "-n", ns, "-o", "jsonpath="+field+".restartCount} "+field+".ready}")
		if strings.TrimSpace(out) != "1 true" {
			return fmt.Errorf("restartCount and ready: %q", out)
		}
		return nil
	})
	return nil
}
