package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/yaml"

	"github.com/subflow-dev/subflow/agent/protocol"

	"github.com/subflow-dev/subflow/controllers"
	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/podsim"
	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/testclock"
	"github.com/subflow-dev/subflow/internal/testing/testenv"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
	"github.com/subflow-dev/subflow/webhooks"
)

const (
	namespace    = "shop"
	subscription = "orders-ingest"
	token        = "demo-agent-token"
)

// brokerURLs names a Pulsar broker to run the demo on; empty starts the test broker.
type brokerURLs struct{ service, admin string }

// world is everything the demo runs: control plane, broker, controller, pods, producer.
type world struct {
	env   *envtest.Environment
	k8s   client.Client
	topic string
	// admin is the broker's admin API. The pods' clients reach the broker through wire, a
	// recorder of every FLOW they send, so that the demo checks permits on the wire with
	// any broker; the producer connects directly.
	admin    string
	service  string
	wire     *wirerec.Proxy
	clock    *testclock.Shifted // the controller's: moved to show a maintenance window without waiting
	pods     []*podsim.Pod
	produced atomic.Int64
	stop     []func()

	// metricsAddr is the controller's /metrics (host:port, plain HTTP).
	metricsAddr string

	stopProducerOnce sync.Once
	stopProducerFn   func()
}

// stopProducer stops publishing; safe to call more than once.
func (w *world) stopProducer() {
	w.stopProducerOnce.Do(func() {
		if w.stopProducerFn != nil {
			w.stopProducerFn()
		}
	})
}

func startWorld(ctx context.Context, pods int, broker brokerURLs) (*world, error) {
	w := &world{clock: &testclock.Shifted{}}
	step("starting a local control plane (kube-apiserver + etcd; built from source on first use)")
	env, cfg, err := testenv.StartWithWebhooks()
	if err != nil {
		return nil, err
	}
	w.env = env
	w.stop = append(w.stop, func() { _ = env.Stop() })
	if w.k8s, err = testenv.Client(cfg); err != nil {
		return w, err
	}
	if err := w.startBroker(broker); err != nil {
		return w, err
	}
	if err := w.startController(cfg); err != nil {
		return w, err
	}
	if err := w.createNamespace(ctx); err != nil {
		return w, err
	}
	if err := w.startPods(ctx, pods); err != nil {
		return w, err
	}
	return w, w.startProducer(ctx, 200)
}

// startBroker starts the test broker, or takes the one named, and puts the wire recorder in
// front of it. A named broker keeps what earlier runs left, so the topic is new each run.
func (w *world) startBroker(broker brokerURLs) error {
	w.topic = "persistent://public/default/orders"
	if broker.service == "" {
		step("starting the test Pulsar broker")
		b, err := pulsartest.New(pulsartest.Options{})
		if err != nil {
			return err
		}
		w.stop = append(w.stop, func() { _ = b.Close() })
		broker = brokerURLs{service: b.ServiceURL(), admin: b.AdminURL()}
	} else {
		step("using the Pulsar broker at " + broker.service)
		w.topic += time.Now().UTC().Format("-20060102-150405")
	}
	w.service, w.admin = broker.service, strings.TrimRight(broker.admin, "/")
	wire, err := wirerec.Start(w.service, wirerec.Options{RewriteLookups: true, Keep: []pb.BaseCommand_Type{pb.BaseCommand_FLOW}})
	if err != nil {
		return err
	}
	w.wire = wire
	w.stop = append(w.stop, func() { _ = wire.Close() })
	fmt.Printf("   service %s (pods through the wire recorder %s), admin %s, topic %s\n", w.service, wire.ServiceURL(), w.admin, w.topic)
	return nil
}

// flows lists the FLOW commands the pods sent for the demo's subscription that a broker
// acted on (not those racing a close).
func (w *world) flows() []wirerec.Event {
	return slices.DeleteFunc(w.wire.Flows(wirerec.Filter{Topic: w.topic, Subscription: subscription}),
		func(e wirerec.Event) bool { return e.AfterClose })
}

// backlog reads the subscription's backlog (msgBacklog) from the broker's admin API.
func (w *world) backlog(ctx context.Context) (int64, error) {
	path := strings.Replace(w.topic, "persistent://", "/admin/v2/persistent/", 1) + "/stats"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.admin+path, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("topic stats: HTTP %d", resp.StatusCode)
	}
	var st struct {
		Subscriptions map[string]struct {
			MsgBacklog int64 `json:"msgBacklog"`
		} `json:"subscriptions"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return 0, err
	}
	return st.Subscriptions[subscription].MsgBacklog, nil
}

func (w *world) startController(cfg *rest.Config) error {
	step("starting the subflow controller")
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))
	var err error
	if w.metricsAddr, err = freeLoopbackAddr(); err != nil {
		return err
	}
	// Plain HTTP without authentication, on loopback only (the manager's --metrics-secure=false):
	// this local world has no API server tokens for a scraper. Deployed, the controller serves
	// /metrics over HTTPS to callers the API server authorizes.
	// The webhooks serve with the certificate envtest made for its webhook configurations, as
	// they serve a cert-manager certificate deployed (config/cert-manager).
	wio := w.env.WebhookInstallOptions
	hooks, err := webhooks.New(webhooks.Options{SidecarImage: "subflow-sidecar:demo", Certs: webhooks.CertsFromFiles,
		CertDir: wio.LocalServingCertDir})
	if err != nil {
		return err
	}
	var started healthz.Checker
	stop, err := testenv.StartController(cfg, testenv.ControllerOptions{Clock: w.clock, Resync: 30 * time.Second,
		Manager: func(o *ctrl.Options) {
			o.Metrics.BindAddress = w.metricsAddr
			o.WebhookServer = webhook.NewServer(hooks.ServerOptions(webhook.Options{Host: wio.LocalServingHost, Port: wio.LocalServingPort}))
		},
		Setup: func(mgr manager.Manager) error {
			started = mgr.GetWebhookServer().StartedChecker()
			return hooks.SetupWithManager(mgr)
		}})
	if err != nil {
		return err
	}
	w.stop = append(w.stop, stop)
	fmt.Printf("   metrics http://%s/metrics\n", w.metricsAddr)
	// The pod webhook fails open, so a pod created before it serves would be admitted unwired.
	return testkit.Poll{Within: 30 * time.Second, Every: 100 * time.Millisecond}.UntilNil(func() error { return started(nil) })
}

// freeLoopbackAddr returns a loopback address with a port free right now: the manager binds
// its metrics server itself and does not tell which port ":0" got.
func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func (w *world) createNamespace(ctx context.Context) error {
	if err := w.k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		return err
	}
	return w.k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: controllers.DefaultTokenSecret},
		Data: map[string][]byte{controllers.DefaultTokenKey: []byte(token)}})
}

// startPods creates n consumer pods the way a team opts in: label subflow.dev/inject=agent and
// only the application container. The webhook wires them (token volume and mount, POD_NAME, the
// control port named subflow); the demo then plays the kubelet, starting each pod's agent (see
// examples/consumer for the app side) on the injected port with the token from the injected
// volume's Secret, and reporting a loopback pod IP. Each agent serves its metrics on
// http://127.0.0.1:<port>/metrics.
func (w *world) startPods(ctx context.Context, n int) error {
	step(fmt.Sprintf("creating %d consumer pods labelled %s=%s; the webhook wires each for its agent", n, webhooks.InjectLabel, webhooks.ModeAgent))
	for i := 0; i < n; i++ {
		pod, err := w.createPod(ctx, fmt.Sprintf("orders-worker-%d", i))
		if err != nil {
			return err
		}
		if i == 0 {
			printInjected(pod)
		}
		if err := w.runAgent(ctx, pod); err != nil {
			return err
		}
	}
	return nil
}

// createPod creates one opted-in pod and returns it as admitted, failing if it was not wired.
func (w *world) createPod(ctx context.Context, name string) (*corev1.Pod, error) {
	addr, err := freeLoopbackAddr() // every simulated pod shares 127.0.0.1, so each needs its own port
	if err != nil {
		return nil, err
	}
	_, port, _ := net.SplitHostPort(addr)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name,
			Labels:      map[string]string{"app": "orders-worker", webhooks.InjectLabel: webhooks.ModeAgent},
			Annotations: map[string]string{webhooks.AgentPortAnnotation: port}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Image: "orders-worker:demo"}}},
	}
	if err := w.k8s.Create(ctx, pod); err != nil {
		return nil, err
	}
	if got := pod.Annotations[webhooks.InjectedAnnotation]; got != webhooks.ModeAgent {
		return nil, fmt.Errorf("pod %s was not wired by the webhook (annotation %s=%q, skipped: %q)",
			name, webhooks.InjectedAnnotation, got, pod.Annotations[webhooks.SkippedAnnotation])
	}
	return pod, nil
}

// runAgent starts the pod's agent as the kubelet would start its container: on the injected
// control port, with the token file the injected volume projects from its Secret.
func (w *world) runAgent(ctx context.Context, pod *corev1.Pod) error {
	port, token, err := w.injectedWiring(ctx, pod)
	if err != nil {
		return err
	}
	// Each pod has its own registry, served on its agent's /metrics (no token, the default).
	p, err := podsim.Start(podsim.Options{Name: pod.Name, ServiceURL: w.wire.ServiceURL(), AdminURL: w.admin,
		Token: token, Topic: w.topic, Subscription: subscription, Type: pulsar.Shared, ReceiverQueueSize: 50,
		Addr: fmt.Sprintf("127.0.0.1:%d", port), Metrics: prometheus.NewRegistry()})
	if err != nil {
		return err
	}
	w.pods = append(w.pods, p)
	w.stop = append(w.stop, p.Close)
	fmt.Printf("   %s agent http://127.0.0.1:%d (metrics on /metrics)\n", pod.Name, p.Port)
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1"}
	return w.k8s.Status().Update(ctx, pod)
}

// injectedWiring reads the control port and the agent's token from what the webhook added.
func (w *world) injectedWiring(ctx context.Context, pod *corev1.Pod) (port int32, token string, err error) {
	for _, p := range pod.Spec.Containers[0].Ports {
		if p.Name == protocol.PortName {
			port = p.ContainerPort
		}
	}
	for _, v := range pod.Spec.Volumes {
		if v.Name != webhooks.TokenVolume || v.Secret == nil {
			continue
		}
		var secret corev1.Secret
		if err := w.k8s.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: v.Secret.SecretName}, &secret); err != nil {
			return 0, "", err
		}
		token = string(secret.Data[webhooks.TokenKey])
	}
	if port == 0 || token == "" {
		return 0, "", fmt.Errorf("pod %s: no port %s or no token in the injected wiring", pod.Name, protocol.PortName)
	}
	return port, token, nil
}

// printInjected shows what the webhook added to a pod that asked with a label and one container.
func printInjected(pod *corev1.Pod) {
	shown := struct {
		Annotations map[string]string  `json:"annotations"`
		Containers  []corev1.Container `json:"containers"`
		Volumes     []corev1.Volume    `json:"volumes"`
	}{pod.Annotations, pod.Spec.Containers, pod.Spec.Volumes}
	for i := range shown.Containers { // the API server's defaults are not the webhook's doing
		c := &shown.Containers[i]
		c.TerminationMessagePath, c.TerminationMessagePolicy, c.ImagePullPolicy = "", "", ""
	}
	out, err := yaml.Marshal(shown)
	if err != nil {
		return
	}
	fmt.Printf("   %s as admitted (created with only container worker):\n", pod.Name)
	for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		fmt.Println("     " + line)
	}
}

// startProducer publishes rate messages per second until stopProducer.
func (w *world) startProducer(ctx context.Context, rate int) error {
	step(fmt.Sprintf("starting a producer at %d messages/s", rate))
	c, err := pulsar.NewClient(pulsar.ClientOptions{URL: w.service, Logger: log.DefaultNopLogger()})
	if err != nil {
		return err
	}
	producer, err := c.CreateProducer(pulsar.ProducerOptions{Topic: w.topic, BatchingMaxPublishDelay: 5 * time.Millisecond})
	if err != nil {
		c.Close()
		return err
	}
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for {
			select {
			case <-pctx.Done():
				return
			case <-tick.C:
				n := w.produced.Load()
				if _, err := producer.Send(pctx, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("order-%d", n))}); err == nil {
					w.produced.Add(1)
				}
			}
		}
	}()
	w.stop = append(w.stop, func() { w.stopProducer(); producer.Close(); c.Close() })
	w.stopProducerFn = func() { cancel(); <-done }
	return nil
}

func (w *world) close() {
	for i := len(w.stop) - 1; i >= 0; i-- {
		w.stop[i]()
	}
}

// writeKubeconfig writes an admin kubeconfig for the local control plane (for --interactive).
func (w *world) writeKubeconfig() (string, error) {
	user, err := w.env.AddUser(envtest.User{Name: "demo-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", err
	}
	data, err := user.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(os.TempDir(), "subflow-demo.kubeconfig")
	return path, os.WriteFile(path, data, 0o600)
}
