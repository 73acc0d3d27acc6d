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
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/subflow-dev/subflow/controllers"
	"github.com/subflow-dev/subflow/internal/podsim"
	pb "github.com/subflow-dev/subflow/internal/pulsarpb"
	"github.com/subflow-dev/subflow/internal/pulsartest"
	"github.com/subflow-dev/subflow/internal/testclock"
	"github.com/subflow-dev/subflow/internal/testenv"
	"github.com/subflow-dev/subflow/internal/wirerec"
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
	env, cfg, err := testenv.Start()
	if err != nil {
		return nil, err
	}
	w.env = env
	w.stop = append(w.stop, func() { _ = env.Stop() })
	scheme := testenv.Scheme()
	if w.k8s, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return w, err
	}
	if err := w.startBroker(broker); err != nil {
		return w, err
	}
	if err := w.startController(ctx, cfg, scheme); err != nil {
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

func (w *world) startController(ctx context.Context, cfg *rest.Config, scheme *runtime.Scheme) error {
	step("starting the subflow controller")
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))
	var err error
	if w.metricsAddr, err = freeLoopbackAddr(); err != nil {
		return err
	}
	// Plain HTTP without authentication, on loopback only (the manager's --metrics-secure=false):
	// this local world has no API server tokens for a scraper. Deployed, the controller serves
	// /metrics over HTTPS to callers the API server authorizes.
	// One world per run, but a test process may start worlds one after another (go test -count):
	// the earlier controller of that name is stopped by then.
	skipNameValidation := true
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme, Client: controllers.ClientOptions(),
		Metrics:    metricsserver.Options{BindAddress: w.metricsAddr},
		Controller: config.Controller{SkipNameValidation: &skipNameValidation}})
	if err != nil {
		return err
	}
	r := &controllers.SubscriptionFlowReconciler{Client: mgr.GetClient(), Scheme: scheme, Clock: w.clock,
		Agents: controllers.NewHTTPAgentClient(2*time.Second, nil), Recorder: mgr.GetEventRecorder("subflow-controller"),
		Resync: 30 * time.Second}
	if err := r.SetupWithManager(mgr); err != nil {
		return err
	}
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(mctx); err != nil {
			fmt.Fprintln(os.Stderr, "controller stopped:", err)
		}
	}()
	w.stop = append(w.stop, func() { cancel(); <-done })
	fmt.Printf("   metrics http://%s/metrics\n", w.metricsAddr)
	return nil
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

// startPods runs n consumer pods built on the agent (see examples/consumer for the app side)
// and registers them as Pod objects with a loopback IP, as the kubelet would. Each agent serves
// its metrics on http://127.0.0.1:<port>/metrics.
func (w *world) startPods(ctx context.Context, n int) error {
	step(fmt.Sprintf("starting %d consumer pods, each with an agent on its own port", n))
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("orders-worker-%d", i)
		// Each pod has its own registry, served on its agent's /metrics (no token, the default).
		p, err := podsim.Start(podsim.Options{Name: name, ServiceURL: w.wire.ServiceURL(), AdminURL: w.admin,
			Token: token, Topic: w.topic, Subscription: subscription, Type: pulsar.Shared, ReceiverQueueSize: 50,
			Metrics: prometheus.NewRegistry()})
		if err != nil {
			return err
		}
		w.pods = append(w.pods, p)
		fmt.Printf("   %s agent http://127.0.0.1:%d (metrics on /metrics)\n", name, p.Port)
		w.stop = append(w.stop, p.Close)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: map[string]string{"app": "orders-worker"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Image: "orders-worker:demo",
				Ports: []corev1.ContainerPort{{Name: "subflow", ContainerPort: int32(p.Port)}}}}},
		}
		if err := w.k8s.Create(ctx, pod); err != nil {
			return err
		}
		pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1"}
		if err := w.k8s.Status().Update(ctx, pod); err != nil {
			return err
		}
	}
	return nil
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
