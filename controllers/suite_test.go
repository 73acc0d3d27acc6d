package controllers_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/controllers"
	"github.com/subflow-dev/subflow/controllers/pausewhen"
	"github.com/subflow-dev/subflow/internal/testing/podsim"
	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/testenv"
)

const testToken = "integration-token"

var (
	k8s    client.Client
	cached client.Client // the manager's client: flows and pods from its cache, as in production
	broker *pulsartest.Broker
	// restConfig reaches the test API server as its administrator.
	restConfig *rest.Config
	clock      = clocktesting.NewFakeClock(time.Now()) // the reconciler's: tests move it across windows and override expiry
)

// TestMain starts one real API server, one test broker and the controller for all tests.
func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))
	env, cfg, err := testenv.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	if broker, err = pulsartest.New(pulsartest.Options{}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = broker.Close() }()

	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = subflowv1.AddToScheme(scheme)
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	if err == nil {
		err = applyControllerRBAC(context.Background(), k8s)
	}
	if err == nil {
		agentTLS, err = newTestCA()
	}
	var mgr ctrl.Manager
	if err == nil {
		restConfig = cfg
		mgr, err = newController(scheme, controllers.CacheOptions())
	}
	if err == nil {
		cached = mgr.GetClient()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = mgr.Start(ctx) }()
	defer func() { cancel(); <-done }()
	return m.Run()
}

// newController returns a manager running the reconciler as the controller's ServiceAccount
// with the deployed RBAC, its cache limited by cacheOpts.
func newController(scheme *runtime.Scheme, cacheOpts cache.Options) (ctrl.Manager, error) {
	skip := true
	mgr, err := ctrl.NewManager(asController(restConfig), ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"},
		Client: controllers.ClientOptions(), Cache: cacheOpts, Controller: config.Controller{SkipNameValidation: &skip}})
	if err != nil {
		return nil, err
	}
	// No periodic resync within a test's time: every recovery must come from a watch or a
	// retry, not from the fallback.
	err = (&controllers.SubscriptionFlowReconciler{Client: mgr.GetClient(), Scheme: scheme, Clock: clock,
		Agents: controllers.NewHTTPAgentClient(2*time.Second, agentTLS.client), Recorder: mgr.GetEventRecorder("subflow-controller"),
		Resync: time.Hour, Conditions: &controllers.Conditions{Prober: pausewhen.NewProber(clusterIPs.dial)}}).SetupWithManager(mgr)
	return mgr, err
}

// namespace creates a fresh namespace, with the agents' token Secret unless told otherwise.
func namespace(t testing.TB, withToken bool) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "t-"}}
	if err := k8s.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	if withToken {
		secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: controllers.DefaultTokenSecret},
			Data: map[string][]byte{controllers.DefaultTokenKey: []byte(testToken)}}
		if err := k8s.Create(context.Background(), secret); err != nil {
			t.Fatal(err)
		}
	}
	return ns.Name
}

// startPod runs a simulated pod consuming topic/sub and registers its Pod object.
func startPod(t *testing.T, ns, name, topic, token string) *podsim.Pod {
	t.Helper()
	return startPodWith(t, ns, podsim.Options{Name: name, Token: token, Topic: topic})
}

// startPodWith is startPod with more options; it fills in the test broker (its admin API
// unless opts names another) and the suite's Shared subscription "ingest" with a queue of 10.
func startPodWith(t *testing.T, ns string, opts podsim.Options) *podsim.Pod {
	t.Helper()
	opts.ServiceURL = broker.ServiceURL()
	if opts.AdminURL == "" {
		opts.AdminURL = broker.AdminURL()
	}
	opts.Subscription, opts.Type, opts.ReceiverQueueSize = "ingest", pulsar.Shared, 10
	p, err := podsim.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	createPod(t, ns, opts.Name, p.Port)
	return p
}

// createPod creates a Pod object whose agent port is port and gives it a loopback IP, as the
// kubelet would once it runs.
func createPod(t testing.TB, ns, name string, port int) *corev1.Pod {
	t.Helper()
	return createPodWithPort(t, ns, name, "subflow", port)
}

func createPodWithPort(t testing.TB, ns, name, portName string, port int) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": "worker"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "worker:1",
			Ports: []corev1.ContainerPort{{Name: portName, ContainerPort: int32(port)}}}}},
	}
	if err := k8s.Create(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1",
		ContainerStatuses: []corev1.ContainerStatus{{Name: "app", Ready: true, Image: "worker:1", ImageID: "worker:1"}}}
	if err := k8s.Status().Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	return pod
}

func newFlow(ns, name, topic string, state subflowv1.FlowState) *subflowv1.SubscriptionFlow {
	return &subflowv1.SubscriptionFlow{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: subflowv1.SubscriptionFlowSpec{Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "worker"}},
			Subscription: "ingest", Topic: topic, State: state},
	}
}

func create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := k8s.Create(context.Background(), obj); err != nil {
		t.Fatal(err)
	}
}

// patchFlow applies a JSON merge patch, as `kubectl patch --type merge` does.
func patchFlow(t *testing.T, flow *subflowv1.SubscriptionFlow, patch string) {
	t.Helper()
	if err := k8s.Patch(context.Background(), flow, client.RawPatch("application/merge-patch+json", []byte(patch))); err != nil {
		t.Fatal(err)
	}
}

// poke changes an unrelated annotation so that the controller reconciles now (after the fake
// clock moved) instead of at its real-time requeue.
func poke(t *testing.T, flow *subflowv1.SubscriptionFlow) {
	t.Helper()
	patchFlow(t, flow, fmt.Sprintf(`{"metadata":{"annotations":{"test.subflow.dev/poke":"%d"}}}`, time.Now().UnixNano()))
}

func getFlow(t *testing.T, flow *subflowv1.SubscriptionFlow) *subflowv1.SubscriptionFlow {
	t.Helper()
	got := &subflowv1.SubscriptionFlow{}
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(flow), got); err != nil {
		t.Fatal(err)
	}
	return got
}

// waitFlow polls the flow until cond holds, failing with the last status otherwise.
func waitFlow(t *testing.T, flow *subflowv1.SubscriptionFlow, what string, cond func(*subflowv1.SubscriptionFlow) bool) *subflowv1.SubscriptionFlow {
	t.Helper()
	var got *subflowv1.SubscriptionFlow
	eventually(t, what, func() bool { got = getFlow(t, flow); return cond(got) }, func() string {
		return fmt.Sprintf("status: %+v", got.Status)
	})
	return got
}

func eventually(t *testing.T, what string, cond func() bool, detail ...func() string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			msg := ""
			for _, d := range detail {
				msg = d()
			}
			t.Fatalf("timed out waiting for %s %s", what, msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func condition(flow *subflowv1.SubscriptionFlow, condType string) *metav1.Condition {
	return meta.FindStatusCondition(flow.Status.Conditions, condType)
}

func isTrue(flow *subflowv1.SubscriptionFlow, condType string) bool {
	return meta.IsStatusConditionTrue(flow.Status.Conditions, condType)
}

func current(flow *subflowv1.SubscriptionFlow) bool {
	return flow.Status.ObservedGeneration == flow.Generation
}

func produce(t *testing.T, topic, prefix string, n int) {
	t.Helper()
	c, err := pulsar.NewClient(pulsar.ClientOptions{URL: broker.ServiceURL(), Logger: nopLogger})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := 0; i < n; i++ {
		p.SendAsync(context.Background(), &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("%s-%d", prefix, i))}, nil)
	}
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
}

func totalReceived(pods ...*podsim.Pod) int {
	n := 0
	for _, p := range pods {
		n += p.Received()
	}
	return n
}
