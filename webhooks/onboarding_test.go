package webhooks_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/testing/podsim"
	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/testenv"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
	"github.com/subflow-dev/subflow/webhooks"
)

// TestInjectedAgentPodIsPausedByAFlow is the acceptance for agent mode: a pod labelled
// for injection, created with only its application container, is reached and paused by a flow
// with no hand-written wiring. The test plays the kubelet: it materialises the injected token
// volume where the injected mount puts it and gives the pod its IP.
func TestInjectedAgentPodIsPausedByAFlow(t *testing.T) {
	broker, ns := startOnboarding(t)
	f := createPausedFlow(t, ns)

	// The application links the agent; its control port is a free loopback one, told to the
	// webhook by annotation. It reads its token where the injected mount puts the Secret.
	root := t.TempDir()
	pod := appPod(ns, map[string]string{"app": "orders-worker", webhooks.InjectLabel: webhooks.ModeAgent}, nil)
	pod.GenerateName, pod.Name = "", "orders-worker-0"
	app, err := podsim.Start(podsim.Options{Name: pod.Name, ServiceURL: broker.ServiceURL(), AdminURL: broker.AdminURL(),
		TokenFile: filepath.Join(root, "var/run/subflow/token"), Topic: "orders", Subscription: "orders-ingest", Type: pulsar.Shared})
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	pod.Annotations = map[string]string{webhooks.AgentPortAnnotation: strconv.Itoa(app.Port)}
	stored := create(t, k8s, pod)
	runAsKubelet(t, root, stored)

	eventually(t, func() error {
		if state := app.Consumer.State(); state != protocol.Paused {
			return fmt.Errorf("the pod's consumer is %s, want Paused", state)
		}
		var got subflowv1.SubscriptionFlow
		if err := k8s.Get(t.Context(), client.ObjectKeyFromObject(f), &got); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(got.Status.Conditions, subflowv1.ConditionPaused) {
			return fmt.Errorf("the flow's Paused condition is not True: %+v", got.Status.Conditions)
		}
		return nil
	})
}

// TestInjectedSidecarPodIsPausedByAFlow is the acceptance for sidecar mode: a pod labelled
// for the sidecar, created with only its application container, gets the native sidecar; run
// with the arguments injected, the sidecar binary is reached by the controller, and a flow
// pauses the application's consumer behind it: the status names the pod a sidecar with its
// consumer Paused and what the broker sends meanwhile stays in the sidecar. The flow runs
// until the status counts the consumer, so its first permits reach the broker before the
// pause and the broker has messages to send (a pod born into a paused flow is sent nothing:
// TestPodBornIntoAFlowStartsGated). The test plays the kubelet (the token file, the pod's IP)
// and the pod's network namespace (the sidecar's data listener moves off port 6650, which
// tests running at once would share).
func TestInjectedSidecarPodIsPausedByAFlow(t *testing.T) {
	broker, ns := startOnboarding(t)
	brokerConfig(t, ns, map[string]string{webhooks.BrokerURLKey: broker.ServiceURL()})

	f := createFlow(t, ns, subflowv1.StateRunning)

	root := t.TempDir()
	controlPort, dataAddr := testkit.FreePort(t), fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	pod := appPod(ns, map[string]string{"app": "orders-worker", webhooks.InjectLabel: webhooks.ModeSidecar},
		map[string]string{webhooks.AgentPortAnnotation: strconv.Itoa(controlPort)})
	pod.GenerateName, pod.Name = "", "orders-worker-0"
	stored := create(t, k8s, pod)
	if len(stored.Spec.InitContainers) != 1 {
		t.Fatalf("the pod was not given the sidecar: %s", stored.Annotations[webhooks.SkippedAnnotation])
	}
	runAsKubelet(t, root, stored)
	args := append(rooted(root, stored.Spec.InitContainers[0].Args), "--listen="+dataAddr, "--name="+stored.Name)
	runSidecar(t, args)

	app := consumeThrough(t, "pulsar://"+dataAddr, "orders", "orders-ingest")
	var got subflowv1.SubscriptionFlow
	eventually(t, func() error {
		if err := k8s.Get(t.Context(), client.ObjectKeyFromObject(f), &got); err != nil {
			return err
		}
		if a := got.Status.Agents; len(a) != 1 || a[0].State != string(protocol.Running) || a[0].Consumers != 1 {
			poke(t, f)
			return fmt.Errorf("agents %+v, want the pod with 1 consumer Running", a)
		}
		if permits := brokerPermits(t, broker.AdminURL(), "orders", "orders-ingest"); permits == 0 {
			return fmt.Errorf("the broker holds no permit of the consumer yet")
		}
		return nil
	})
	setState(t, f, subflowv1.StatePaused)
	eventually(t, func() error {
		if err := k8s.Get(t.Context(), client.ObjectKeyFromObject(f), &got); err != nil {
			return err
		}
		if a := got.Status.Agents; len(a) != 1 || a[0].Kind != protocol.KindSidecar || a[0].State != string(protocol.Paused) || a[0].Consumers != 1 {
			return fmt.Errorf("agents %+v, want the pod a sidecar with 1 consumer Paused", a)
		}
		if !meta.IsStatusConditionTrue(got.Status.Conditions, subflowv1.ConditionPaused) {
			return fmt.Errorf("the flow's Paused condition is not True: %+v", got.Status.Conditions)
		}
		return nil
	})
	testkit.ProduceUnbatched(t, broker.ServiceURL(), "orders", "m", 5)
	eventually(t, func() error {
		_ = k8s.Get(t.Context(), client.ObjectKeyFromObject(f), &got)
		if a := got.Status.Agents; len(a) == 1 && a[0].HeldMessages == 5 {
			return nil
		}
		poke(t, f)
		return fmt.Errorf("status agents %+v, want 5 held in the sidecar", got.Status.Agents)
	})
	if n := app.received(); n != 0 {
		t.Fatalf("the application received %d messages while its flow is paused", n)
	}
}

// brokerPermits reads from the broker's topic stats the permits its consumers of the
// subscription hold.
func brokerPermits(t *testing.T, adminURL, topic, subscription string) int64 {
	t.Helper()
	resp, err := http.Get(adminURL + "/admin/v2/persistent/public/default/" + topic + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var stats struct {
		Subscriptions map[string]struct {
			Consumers []struct {
				AvailablePermits int64 `json:"availablePermits"`
			} `json:"consumers"`
		} `json:"subscriptions"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&stats); err != nil {
		t.Fatalf("topic stats: %s: %v", resp.Status, err)
	}
	var permits int64
	for _, c := range stats.Subscriptions[subscription].Consumers {
		permits += c.AvailablePermits
	}
	return permits
}

// rooted moves the file arguments of the injected sidecar under root, where runAsKubelet puts
// the mounted files.
func rooted(root string, args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = a
		for _, flag := range []string{"--token-file=", "--admin-credentials-file="} {
			if path, ok := strings.CutPrefix(a, flag); ok {
				out[i] = flag + filepath.Join(root, path)
			}
		}
	}
	return out
}

// runSidecar builds and runs the sidecar binary until the test ends.
func runSidecar(t *testing.T, args []string) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "subflow-sidecar")
	build := exec.Command("go", "build", "-o", bin, "./cmd/subflow-sidecar")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the sidecar: %v: %s", err, out)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
}

// counted is an application consuming through the sidecar, counting what it receives.
type counted struct{ n atomic.Int64 }

func (c *counted) received() int64 { return c.n.Load() }

func consumeThrough(t *testing.T, url, topic, subscription string) *counted {
	t.Helper()
	var consumer pulsar.Consumer
	eventually(t, func() error { // the sidecar may still be starting
		c, err := pulsar.NewClient(pulsar.ClientOptions{URL: url, Logger: log.DefaultNopLogger(), OperationTimeout: 5 * time.Second})
		if err != nil {
			return err
		}
		if consumer, err = c.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: subscription, Type: pulsar.Shared}); err != nil {
			c.Close()
			return err
		}
		t.Cleanup(c.Close)
		return nil
	})
	app := &counted{}
	testkit.ReceiveInBackground(t, consumer, true, func(pulsar.Message) { app.n.Add(1) })
	t.Cleanup(consumer.Close)
	return app
}

// poke makes the controller reconcile now: status figures come with pushes.
func poke(t *testing.T, f *subflowv1.SubscriptionFlow) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{"test.subflow.dev/poke":"%d"}}}`, time.Now().UnixNano())
	if err := k8s.Patch(context.Background(), f, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
}

// runAsKubelet writes the token files of the pod's Secret volumes under root at the paths its
// containers (the sidecar's included) mount them, once the Secrets exist, and reports the pod
// running. An optional Secret that does not exist is left out, as the kubelet does.
func runAsKubelet(t *testing.T, root string, pod *corev1.Pod) {
	t.Helper()
	mounts := map[string]string{}
	for _, c := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...) {
		for _, m := range c.VolumeMounts {
			mounts[m.Name] = m.MountPath
		}
	}
	for _, v := range pod.Spec.Volumes {
		if v.Secret == nil || mounts[v.Name] == "" {
			continue
		}
		var secret corev1.Secret
		key := client.ObjectKey{Namespace: pod.Namespace, Name: v.Secret.SecretName}
		if v.Secret.Optional != nil && *v.Secret.Optional && v.Secret.SecretName != subflowv1.DefaultTokenSecret {
			if err := k8s.Get(context.Background(), key, &secret); err != nil {
				continue
			}
		}
		eventually(t, func() error { return k8s.Get(context.Background(), key, &secret) })
		for _, item := range v.Secret.Items {
			path := filepath.Join(root, mounts[v.Name], item.Path)
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, secret.Data[item.Key], 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1"}
	if err := k8s.Status().Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
}

// startOnboarding starts what the acceptance tests run against, a broker and the reconciler,
// and creates their namespace.
func startOnboarding(t *testing.T) (*pulsartest.Broker, string) {
	t.Helper()
	broker := pulsartest.Start(t)
	startReconciler(t)
	return broker, namespace(t, k8s)
}

// createPausedFlow creates in ns a Paused flow for the pods labelled app=orders-worker.
func createPausedFlow(t *testing.T, ns string) *subflowv1.SubscriptionFlow {
	t.Helper()
	return createFlow(t, ns, subflowv1.StatePaused)
}

// createFlow creates in ns a flow in the given state for the pods labelled app=orders-worker.
func createFlow(t *testing.T, ns string, state subflowv1.FlowState) *subflowv1.SubscriptionFlow {
	t.Helper()
	f := flow(ns, nil)
	f.Spec.Selector.MatchLabels = map[string]string{"app": "orders-worker"}
	f.Spec.State = state
	if err := k8s.Create(context.Background(), f); err != nil {
		t.Fatal(err)
	}
	return f
}

// setState patches the flow's spec.state, as kubectl patch does during an incident.
func setState(t *testing.T, f *subflowv1.SubscriptionFlow, state subflowv1.FlowState) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"state":%q}}`, state)
	if err := k8s.Patch(context.Background(), f, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
}

// startReconciler runs the SubscriptionFlow controller as main.go does, as the controller's
// ServiceAccount, until the test ends.
func startReconciler(t *testing.T) {
	t.Helper()
	cfg := rest.CopyConfig(shared.cfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: controllerUser,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + controllerNamespace, "system:authenticated"}}
	stop, err := testenv.StartController(cfg, testenv.ControllerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
}
