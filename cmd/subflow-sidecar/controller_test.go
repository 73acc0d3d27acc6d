package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/controllers"
	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/testenv"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
	"github.com/subflow-dev/subflow/webhooks"
)

// The controller pauses and resumes a pod whose consumer goes through the sidecar binary, run
// with the arguments the webhook injects, with nothing sidecar-specific on the controller's
// side: the flow's status names the pod a sidecar, a pause holds in the sidecar what the
// broker sends (status shows it held, and the backlog the sidecar read through the admin
// API) and hands the application none of it, and a resume delivers everything.
func TestControllerDrivesASidecarPod(t *testing.T) {
	k8s := startController(t)
	broker := pulsartest.Start(t)
	ctx := context.Background()

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "sidecar-"}}
	if err := k8s.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	topic := "persistent://public/default/orders-" + ns.Name
	flow := &subflowv1.SubscriptionFlow{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "orders"},
		Spec: subflowv1.SubscriptionFlowSpec{Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "orders"}},
			Subscription: "ingest", Topic: topic, State: subflowv1.StateRunning},
	}
	if err := k8s.Create(ctx, flow); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	mountToken(t, k8s, ns.Name, tokenFile)

	// The arguments the webhook injects, and then what the kubelet and the pod's network
	// would make of them here: a free port per listener and the token mounted elsewhere.
	controlPort := testkit.FreePort(t)
	dataAddr := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	args := append(webhooks.SidecarArgs(broker.ServiceURL(), broker.AdminURL(), int32(controlPort)),
		"--listen="+dataAddr, fmt.Sprintf("--control-addr=127.0.0.1:%d", controlPort), "--token-file="+tokenFile,
		"--name=orders-0", "--backlog-refresh=200ms")
	startSidecarBinary(t, args...)
	createRunningPod(t, k8s, ns.Name, "orders-0", controlPort)

	app := consumeThrough(t, "pulsar://"+dataAddr, topic)
	producer := newProducer(t, broker.ServiceURL(), topic)
	first := producer.send(t, "m", 0, 5)
	waitUntil(t, "the application to receive the first 5", func() bool { return len(app.missing(first)) == 0 })
	waitFlow(t, k8s, flow, "the pod reported as a Running sidecar", func(f *subflowv1.SubscriptionFlow) bool {
		return len(f.Status.Agents) == 1 && f.Status.Agents[0].Kind == "sidecar" && f.Status.Agents[0].State == "Running"
	})

	patch(t, k8s, flow, `{"spec":{"state":"Paused"}}`)
	waitFlow(t, k8s, flow, "Paused=True", func(f *subflowv1.SubscriptionFlow) bool {
		return meta.IsStatusConditionTrue(f.Status.Conditions, subflowv1.ConditionPaused)
	})
	during := producer.send(t, "m", 5, 15)
	waitFlow(t, k8s, flow, "the status to show the 10 held in the sidecar", func(f *subflowv1.SubscriptionFlow) bool {
		if len(f.Status.Agents) == 1 && f.Status.Agents[0].HeldMessages == 10 {
			return true
		}
		poke(t, k8s, flow)
		return false
	})
	waitFlow(t, k8s, flow, "the sidecar to report the backlog of 10", func(f *subflowv1.SubscriptionFlow) bool {
		if b := f.Status.Backlog; b != nil && b.Reporter == "orders-0" && b.Messages == 10 && b.Message == "" {
			return true
		}
		poke(t, k8s, flow)
		return false
	})
	if leaked := app.got(during); len(leaked) > 0 {
		t.Fatalf("messages produced during the pause reached the application: %v", leaked)
	}

	patch(t, k8s, flow, `{"spec":{"state":"Running"}}`)
	waitUntil(t, "the application to receive the 10 after resume", func() bool { return len(app.missing(during)) == 0 })
	waitFlow(t, k8s, flow, "Paused=False with the sidecar Running", func(f *subflowv1.SubscriptionFlow) bool {
		return !meta.IsStatusConditionTrue(f.Status.Conditions, subflowv1.ConditionPaused) &&
			len(f.Status.Agents) == 1 && f.Status.Agents[0].State == "Running"
	})
}

// startController starts an API server and the controller in this process, as the
// controllers' integration tests do.
func startController(t *testing.T) client.Client {
	t.Helper()
	env, cfg, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	stop, err := testenv.StartController(cfg, testenv.ControllerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	k8s, err := testenv.Client(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return k8s
}

// mountToken waits for the token Secret the controller creates for the namespace and writes
// its key where the sidecar reads it, as the kubelet mounts it.
func mountToken(t *testing.T, k8s client.Client, ns, file string) {
	t.Helper()
	var token []byte
	waitUntil(t, "the controller to create the agent token Secret", func() bool {
		var s corev1.Secret
		err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: controllers.DefaultTokenSecret}, &s)
		token = s.Data[controllers.DefaultTokenKey]
		return err == nil && len(token) > 0
	})
	if err := os.WriteFile(file, token, 0o600); err != nil {
		t.Fatal(err)
	}
}

// createRunningPod creates a Pod object that names the sidecar's control port "subflow", with
// the loopback IP the kubelet would report.
func createRunningPod(t *testing.T, k8s client.Client, ns, name string, port int) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": "orders"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app:1",
			Ports: []corev1.ContainerPort{{Name: "subflow", ContainerPort: int32(port)}}}}},
	}
	if err := k8s.Create(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1",
		ContainerStatuses: []corev1.ContainerStatus{{Name: "app", Ready: true, Image: "app:1", ImageID: "app:1"}}}
	if err := k8s.Status().Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
}

var (
	binaryOnce sync.Once
	binaryPath string
	binaryErr  error
)

// sidecarBinary builds this command once per test run.
func sidecarBinary(t *testing.T) string {
	t.Helper()
	binaryOnce.Do(func() {
		dir, err := os.MkdirTemp("", "subflow-sidecar-bin")
		if err != nil {
			binaryErr = err
			return
		}
		binaryPath = filepath.Join(dir, "subflow-sidecar")
		if out, err := exec.Command("go", "build", "-o", binaryPath, ".").CombinedOutput(); err != nil {
			binaryErr = fmt.Errorf("build: %v: %s", err, out)
		}
	})
	if binaryErr != nil {
		t.Fatal(binaryErr)
	}
	return binaryPath
}

// startSidecarBinary runs the sidecar until the test ends, its log in the test's.
func startSidecarBinary(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command(sidecarBinary(t), args...)
	cmd.Stderr = testWriter{t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// app is a pulsar-client-go consumer whose application records what it receives.
type app struct {
	mu       sync.Mutex
	received []string
}

func consumeThrough(t *testing.T, url, topic string) *app {
	t.Helper()
	var c pulsar.Client
	var consumer pulsar.Consumer
	// The sidecar may still be starting: a client that cannot connect fails its subscribe.
	waitUntil(t, "the application to subscribe through the sidecar", func() bool {
		var err error
		if c, err = pulsar.NewClient(pulsar.ClientOptions{URL: url, Logger: log.DefaultNopLogger(), OperationTimeout: 5 * time.Second}); err != nil {
			return false
		}
		if consumer, err = c.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "ingest", Name: "app", Type: pulsar.Shared}); err != nil {
			c.Close()
			return false
		}
		return true
	})
	a := &app{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := consumer.Receive(ctx)
			if err != nil {
				return
			}
			_ = consumer.Ack(m)
			a.mu.Lock()
			a.received = append(a.received, string(m.Payload()))
			a.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-done; consumer.Close(); c.Close() })
	return a
}

func (a *app) missing(want []string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, w := range want {
		if !slices.Contains(a.received, w) {
			out = append(out, w)
		}
	}
	return out
}

func (a *app) got(want []string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, w := range want {
		if slices.Contains(a.received, w) {
			out = append(out, w)
		}
	}
	return out
}

type producer struct{ p pulsar.Producer }

func newProducer(t *testing.T, url, topic string) producer {
	t.Helper()
	c, err := pulsar.NewClient(pulsar.ClientOptions{URL: url, Logger: log.DefaultNopLogger()})
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(); c.Close() })
	return producer{p}
}

func (p producer) send(t *testing.T, prefix string, from, to int) []string {
	t.Helper()
	var sent []string
	for i := from; i < to; i++ {
		v := fmt.Sprintf("%s-%d", prefix, i)
		if _, err := p.p.Send(context.Background(), &pulsar.ProducerMessage{Payload: []byte(v)}); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, v)
	}
	return sent
}

func patch(t *testing.T, k8s client.Client, flow *subflowv1.SubscriptionFlow, body string) {
	t.Helper()
	if err := k8s.Patch(context.Background(), flow, client.RawPatch("application/merge-patch+json", []byte(body))); err != nil {
		t.Fatal(err)
	}
}

// poke makes the controller reconcile now: status figures come with pushes.
func poke(t *testing.T, k8s client.Client, flow *subflowv1.SubscriptionFlow) {
	t.Helper()
	patch(t, k8s, flow, fmt.Sprintf(`{"metadata":{"annotations":{"test.subflow.dev/poke":"%d"}}}`, time.Now().UnixNano()))
}

func waitFlow(t *testing.T, k8s client.Client, flow *subflowv1.SubscriptionFlow, what string, cond func(*subflowv1.SubscriptionFlow) bool) {
	t.Helper()
	waitUntil(t, what, func() bool {
		var f subflowv1.SubscriptionFlow
		return k8s.Get(context.Background(), client.ObjectKeyFromObject(flow), &f) == nil && cond(&f)
	})
}

// waitUntil polls cond until it holds or a minute passes.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testkit.Poll{Within: time.Minute, Every: 100 * time.Millisecond}.Eventually(t, what, cond)
}
