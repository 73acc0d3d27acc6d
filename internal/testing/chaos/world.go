package chaos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/controllers"
	pb "github.com/subflow-dev/subflow/internal/pulsarwire"
	"github.com/subflow-dev/subflow/internal/testing/testclock"
	"github.com/subflow-dev/subflow/internal/testing/testenv"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
	"github.com/subflow-dev/subflow/internal/testing/wirerec"
)

const (
	namespace  = "chaos"
	agentToken = "chaos-agent-token"
	appLabel   = "app"
	tierLabel  = "tier"
	idleSuffix = "-idle"
)

// clockStart is where the controllers' clock starts: two hours before Europe/Berlin springs
// forward (02:00 CET to 03:00 CEST), so that a run's clock advances cross a daylight-saving
// gap with windows in that zone in force.
var clockStart = time.Date(2027, time.March, 27, 23, 0, 0, 0, time.UTC)

// clusterBrokers is the number of brokers in the in-process test cluster.
const clusterBrokers = 2

// maxWireEvents bounds the wire record: a long run (100k messages) sends under 100k FLOWs.
const maxWireEvents = 1 << 22

// groups are the consumer kinds of the run, one flow and one subscription each; topicRoot is
// the broker side's "persistent://tenant/namespace/".
func newGroups(topicRoot string) []*group {
	const queue = 50
	return []*group{
		{name: "shared", subscription: "shared", flowTopic: topicRoot + "chaos-a", topics: []string{"chaos-a"}, useChan: true,
			consumer: pulsar.ConsumerOptions{Topic: topicRoot + "chaos-a", Type: pulsar.Shared, ReceiverQueueSize: queue}},
		{name: "keyshared", subscription: "keyshared", flowTopic: topicRoot + "chaos-a", topics: []string{"chaos-a"},
			consumer: pulsar.ConsumerOptions{Topic: topicRoot + "chaos-a", Type: pulsar.KeyShared, ReceiverQueueSize: queue}},
		{name: "failover", subscription: "failover", flowTopic: topicRoot + "chaos-p", topics: []string{"chaos-p"}, partitions: 3,
			consumer: pulsar.ConsumerOptions{Topic: topicRoot + "chaos-p", Type: pulsar.Failover, ReceiverQueueSize: queue}},
		{name: "regex", subscription: "regex", topics: []string{"chaos-r-0", "chaos-r-1"},
			consumer: pulsar.ConsumerOptions{TopicsPattern: topicRoot + "chaos-r-.*", Type: pulsar.Shared, ReceiverQueueSize: queue}},
		{name: "zeroqueue", subscription: "zeroqueue", flowTopic: topicRoot + "chaos-z", topics: []string{"chaos-z"},
			consumer: pulsar.ConsumerOptions{Topic: topicRoot + "chaos-z", Type: pulsar.Shared, EnableZeroQueueConsumer: true}},
		// Chunked messages (every third is three chunks) from interleaving producer sessions, a
		// small queue and an expiry short enough that pauses outlast it many times.
		{name: "chunked", subscription: "chunked", flowTopic: topicRoot + "chaos-c", topics: []string{"chaos-c"}, chunked: true,
			consumer: pulsar.ConsumerOptions{Topic: topicRoot + "chaos-c", Type: pulsar.Failover, ReceiverQueueSize: 4,
				ExpireTimeOfIncompleteChunk: chunkExpiry}},
		// An application that nacks (first deliveries of some messages), retries later through
		// the retry-letter topic, and dead-letters what it always nacks, on batched messages.
		{name: "nacking", subscription: "nacking", flowTopic: topicRoot + "chaos-n", topics: []string{"chaos-n", "chaos-n-retry"},
			app: nackingApp, consumer: pulsar.ConsumerOptions{Topic: topicRoot + "chaos-n", Type: pulsar.Shared, ReceiverQueueSize: 20,
				NackRedeliveryDelay: 300 * time.Millisecond, RetryEnable: true,
				DLQ: &pulsar.DLQPolicy{MaxDeliveries: 3, RetryLetterTopic: topicRoot + "chaos-n-retry", DeadLetterTopic: topicRoot + "chaos-n-dlq"}}},
	}
}

// chunkExpiry is the chunked group's ExpireTimeOfIncompleteChunk.
const chunkExpiry = 2 * time.Second

// producedTopics are the topics the producer writes, with the partitioned one first created.
var producedTopics = []string{"chaos-a", "chaos-p", "chaos-r-0", "chaos-r-1", "chaos-z", "chaos-c", "chaos-n"}

// world is everything the run drives.
type world struct {
	cfg       Config
	env       *envtest.Environment
	k8s       client.Client
	broker    brokerSide         // the test cluster or a real broker
	root      string             // "persistent://tenant/namespace/" of the run's topics
	wire      *wirerec.Proxy     // in front of the brokers for every agent process; producers go direct
	clock     *testclock.Shifted // the controllers': operations move it across windows and override expiry
	ctrls     *controllerSet
	groups    []*group
	ledger    *ledger
	faults    adminFaults
	mon       *monitor
	producers producers
	start     time.Time

	instances         atomic.Int64
	gatedReceives     atomic.Int64
	sidecarDeliveries atomic.Int64
	sidecarGated      atomic.Int64
	sidecarLeaked     atomic.Int64
	sidecarPods       int // sidecar pods created
	adminRedirects    atomic.Int64
	// clientLog counts, over every consumer client, the frames dropped for a consumer the
	// client no longer knew: a "lost" violation says whether pulsar-client-go's race may be it.
	clientLog testkit.ClientLog

	goroutinesAtStart map[string]int
	podSerial         int
	pods              []*simPod // live, in creation order
	terminating       []*simPod // deleted, held by a finalizer, process still running

	mu         sync.Mutex
	resets     []resetRecord
	violations []violation
	count      map[string]int // violations by kind, also those not kept
	trace      []opRecord
	events     []time.Time // broker-side events that make consumers reconnect
}

func newWorld(cfg Config) (*world, error) {
	ctrl.SetLogger(logr.Discard())
	w := &world{cfg: cfg, clock: testclock.ShiftedFrom(clockStart), ledger: newLedger(), start: time.Now(),
		count: map[string]int{}}
	w.clientLog.Trace = cfg.Verbose
	w.mon = newMonitor(w)
	env, restCfg, err := testenv.Start()
	if err != nil {
		return nil, err
	}
	w.env = env
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = subflowv1.AddToScheme(scheme)
	if w.k8s, err = client.New(restCfg, client.Options{Scheme: scheme}); err != nil {
		return w, err
	}
	w.ctrls = &controllerSet{cfg: restCfg, scheme: scheme, clock: w.clock}
	// The in-process cluster (two brokers: topics move between them, clients follow lookups
	// and admin calls follow 307 redirects to the owner) or the real broker named.
	if w.broker, err = newBrokerSide(cfg); err != nil {
		return w, err
	}
	w.root = w.broker.root()
	w.producers.root = w.root
	w.groups = newGroups(w.root)
	// The recorder keeps the FLOWs the checks read; lookups are rewritten so that the
	// consumers' topic connections go through it too.
	if w.wire, err = wirerec.Start(w.broker.serviceURL(), wirerec.Options{RewriteLookups: true,
		Keep: []pb.BaseCommand_Type{pb.BaseCommand_FLOW}, MaxEvents: maxWireEvents}); err != nil {
		return w, err
	}
	if err := w.broker.createPartitioned("chaos-p", 3); err != nil {
		return w, err
	}
	ctx := context.Background()
	for _, ns := range []string{namespace, leaseNamespace} {
		if err := w.k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return w, err
		}
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: controllers.DefaultTokenSecret},
		Data: map[string][]byte{controllers.DefaultTokenKey: []byte(agentToken)}}
	if err := w.k8s.Create(ctx, secret); err != nil {
		return w, err
	}
	if _, err := w.ctrls.start(false); err != nil {
		return w, err
	}
	for _, g := range w.groups {
		flow := &subflowv1.SubscriptionFlow{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: g.name},
			Spec: subflowv1.SubscriptionFlowSpec{Selector: metav1.LabelSelector{MatchLabels: map[string]string{appLabel: g.name}},
				Subscription: g.subscription, Topic: g.flowTopic, State: subflowv1.StateRunning}}
		if err := w.k8s.Create(ctx, flow); err != nil {
			return w, err
		}
	}
	return w, nil
}

func (w *world) close() {
	for _, p := range slices.Concat(w.pods, w.terminating) {
		p.stop()
	}
	w.pods, w.terminating = nil, nil
	if w.ctrls != nil {
		w.ctrls.killAll()
	}
	if w.wire != nil {
		_ = w.wire.Close()
	}
	if w.broker != nil {
		_ = w.broker.close()
	}
	if w.env != nil {
		_ = w.env.Stop()
	}
}

func (w *world) processEnv() processEnv {
	return processEnv{serviceURL: w.wire.ServiceURL(), adminURLs: w.broker.adminURLs(), token: agentToken,
		faults: &w.faults, ledger: w.ledger, onReset: w.recordReset, onViolation: w.violate, gatedReceives: &w.gatedReceives, sidecarDeliveries: &w.sidecarDeliveries, sidecarGated: &w.sidecarGated, sidecarLeaked: &w.sidecarLeaked, adminRedirects: &w.adminRedirects,
		clientLog: &w.clientLog, nextInstance: func() int { return int(w.instances.Add(1)) }, verbose: w.cfg.Verbose}
}

func (w *world) recordReset(r resetRecord) {
	w.mu.Lock()
	w.resets = append(w.resets, r)
	w.mu.Unlock()
}

// reconnectEvent notes a broker-side fault after which consumers re-subscribe.
func (w *world) reconnectEvent() {
	w.mu.Lock()
	w.events = append(w.events, time.Now())
	w.mu.Unlock()
}

// createPod starts a pod's process and registers its Pod object, as a kubelet would report it.
func (w *world) createPod(ctx context.Context, g *group, sidecar bool) (*simPod, error) {
	w.podSerial++
	p := &simPod{name: fmt.Sprintf("%s-%d", g.name, w.podSerial), group: g, serial: w.podSerial, sidecar: sidecar && sidecarEligible(g)}
	if p.sidecar {
		p.name = fmt.Sprintf("%s-sc-%d", g.name, w.podSerial)
		w.sidecarPods++
	}
	var err error
	if p.proxy, err = newAgentProxy(); err != nil {
		return nil, err
	}
	if p.proc, err = startProcess(w.processEnv(), p); err != nil {
		p.proxy.close()
		return nil, err
	}
	w.mon.watch(p.proc)
	tier := "a"
	if w.podSerial%2 == 0 {
		tier = "b"
	}
	obj := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: p.name, Labels: map[string]string{appLabel: g.name, tierLabel: tier}},
		Spec:       corev1.PodSpec{Containers: podContainers(p)},
	}
	if err := w.k8s.Create(ctx, obj); err != nil {
		p.stop()
		return nil, err
	}
	obj.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1"}
	for _, c := range obj.Spec.Containers {
		obj.Status.ContainerStatuses = append(obj.Status.ContainerStatuses, corev1.ContainerStatus{Name: c.Name, Ready: true, Image: c.Image})
	}
	if err := w.k8s.Status().Update(ctx, obj); err != nil {
		p.stop()
		return nil, err
	}
	w.pods = append(w.pods, p)
	return p, nil
}

// podContainers are the application with the agent linked in, or the application and the
// sidecar container that serves the control port.
func podContainers(p *simPod) []corev1.Container {
	port := []corev1.ContainerPort{{Name: "subflow", ContainerPort: int32(p.proxy.port())}}
	if !p.sidecar {
		return []corev1.Container{{Name: "app", Image: "chaos-consumer", Ports: port}}
	}
	return []corev1.Container{{Name: "app", Image: "chaos-consumer"}, {Name: "subflow-sidecar", Image: "subflow-sidecar", Ports: port}}
}

// deletePod deletes the Pod object, then ends its process, as a kubelet does on deletion.
func (w *world) deletePod(ctx context.Context, p *simPod) error {
	err := w.k8s.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: p.name}},
		client.GracePeriodSeconds(0))
	if proc := p.process(); proc != nil {
		w.mon.forget(proc)
	}
	p.stop()
	w.pods = slices.DeleteFunc(w.pods, func(x *simPod) bool { return x == p })
	return err
}

// terminationFinalizer holds a deleted pod, as a kubelet's grace period does.
const terminationFinalizer = "chaos.subflow.dev/grace-period"

// terminatePod deletes a pod that a finalizer holds: the Pod object is terminating and its
// process keeps running until finishTermination.
func (w *world) terminatePod(ctx context.Context, p *simPod) error {
	obj := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: p.name}}
	if err := w.mergePatch(ctx, obj, map[string]any{"metadata": map[string]any{"finalizers": []string{terminationFinalizer}}}); err != nil {
		return err
	}
	w.pods = slices.DeleteFunc(w.pods, func(x *simPod) bool { return x == p })
	w.terminating = append(w.terminating, p)
	return w.k8s.Delete(ctx, obj)
}

// finishTermination ends a terminating pod's process, then lets the Pod object go.
func (w *world) finishTermination(ctx context.Context, p *simPod) {
	if proc := p.process(); proc != nil {
		w.mon.forget(proc)
	}
	p.stop()
	w.terminating = slices.DeleteFunc(w.terminating, func(x *simPod) bool { return x == p })
	obj := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: p.name}}
	if err := w.mergePatch(ctx, obj, map[string]any{"metadata": map[string]any{"finalizers": nil}}); err != nil {
		w.violate("harness", fmt.Sprintf("pod %s: removing the finalizer: %v", p.name, err))
	}
}

// restartAgent replaces the pod's process (fresh agent state, StartGated) and reports the
// container restart in the Pod status, as the kubelet does.
func (w *world) restartAgent(ctx context.Context, p *simPod) error {
	p.mu.Lock()
	old := p.proc
	p.proc = nil
	p.mu.Unlock()
	if old != nil {
		w.mon.forget(old)
		old.stop()
	}
	proc, err := startProcess(w.processEnv(), p)
	if err != nil {
		return err
	}
	w.mon.watch(proc)
	p.mu.Lock()
	p.proc = proc
	p.restarts++
	restarts := p.restarts
	p.mu.Unlock()
	var obj corev1.Pod
	if err := w.k8s.Get(ctx, client.ObjectKey{Namespace: namespace, Name: p.name}, &obj); err != nil {
		return err
	}
	for i := range obj.Status.ContainerStatuses {
		obj.Status.ContainerStatuses[i].RestartCount = restarts
	}
	return w.k8s.Status().Update(ctx, &obj)
}

func (p *simPod) process() *agentProcess {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.proc
}

func (p *simPod) stop() {
	p.mu.Lock()
	proc := p.proc
	p.proc = nil
	p.mu.Unlock()
	if proc != nil {
		proc.stop()
	}
	p.proxy.close()
}

// labelPod merges labels into the pod's (an empty value removes the label).
func (w *world) labelPod(ctx context.Context, p *simPod, labels map[string]string) error {
	patch := map[string]any{}
	for k, v := range labels {
		if v == "" {
			patch[k] = nil
		} else {
			patch[k] = v
		}
	}
	return w.mergePatch(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: p.name}},
		map[string]any{"metadata": map[string]any{"labels": patch}})
}

func (w *world) mergePatch(ctx context.Context, obj client.Object, patch map[string]any) error {
	data, err := jsonBytes(patch)
	if err != nil {
		return err
	}
	return w.k8s.Patch(ctx, obj, client.RawPatch("application/merge-patch+json", data))
}

// produce writes numbered messages to every topic, paced to spread them over the run, and
// retries a failed send with the same number until it is stored. wait may be called more
// than once.
func (w *world) produce(ctx context.Context, total int, over time.Duration) (wait func() error) {
	var wg sync.WaitGroup
	errs := make(chan error, len(producedTopics))
	for i, topic := range producedTopics {
		n := total / len(producedTopics)
		if i < total%len(producedTopics) {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.produceTopic(ctx, topic, int64(n), over); err != nil {
				errs <- fmt.Errorf("producer %s: %w", topic, err)
			}
		}()
	}
	return sync.OnceValue(func() error {
		wg.Wait()
		close(errs)
		var all []error
		for err := range errs {
			all = append(all, err)
		}
		return errors.Join(all...)
	})
}

func (w *world) produceTopic(ctx context.Context, topic string, n int64, over time.Duration) error {
	start := time.Now()
	for i := int64(0); i < n; i++ {
		if due := start.Add(time.Duration(float64(over) * float64(i) / float64(n))); time.Until(due) > 0 {
			select {
			case <-time.After(time.Until(due)):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		msg := &pulsar.ProducerMessage{Payload: payload(topic, i), Key: fmt.Sprintf("k%d", i%16)}
		if topic == "chaos-c" && i%3 == 0 {
			msg.Payload = paddedPayload(topic, i, 2*chunkSize+chunkSize/2) // three chunks
		}
		id, err := w.producers.send(ctx, w.broker.serviceURL(), topic, msg)
		for err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			id, err = w.producers.send(ctx, w.broker.serviceURL(), topic, msg)
		}
		w.ledger.setProduced(topic, i, id)
	}
	return nil
}

// producers write the numbered messages. They are the harness, not the system under test, and
// pulsar-client-go v0.19 races when a producer reconnects while it sends (grabCnx writes
// producerName and the encryptor that the events loop reads; go test -race reports it), so a
// broker fault first closes them, with no send in flight, and they are created again after it.
type producers struct {
	root   string       // of the topics' full names
	gate   sync.RWMutex // held for reading by each send, for writing around a broker fault
	mu     sync.Mutex
	client pulsar.Client
	byName map[string]pulsar.Producer
}

func (ps *producers) send(ctx context.Context, serviceURL, topic string, msg *pulsar.ProducerMessage) (pulsar.MessageID, error) {
	ps.gate.RLock()
	defer ps.gate.RUnlock()
	p, err := ps.producer(serviceURL, topic)
	if err != nil {
		return nil, err
	}
	return p.Send(ctx, msg)
}

func (ps *producers) producer(serviceURL, topic string) (pulsar.Producer, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if p := ps.byName[topic]; p != nil {
		return p, nil
	}
	if ps.client == nil {
		c, err := pulsar.NewClient(pulsar.ClientOptions{URL: serviceURL, Logger: nopLogger()})
		if err != nil {
			return nil, err
		}
		ps.client, ps.byName = c, map[string]pulsar.Producer{}
	}
	p, err := ps.client.CreateProducer(producerOptions(ps.root, topic))
	if err != nil {
		return nil, err
	}
	ps.byName[topic] = p
	return p, nil
}

// chunkSize is the chunked topic's producer chunk size.
const chunkSize = 1024

// producerOptions batch on some topics, with batches of different sizes, so that seeks land
// inside batches and nacks hit batched messages; chaos-c is chunked.
func producerOptions(root, topic string) pulsar.ProducerOptions {
	opts := pulsar.ProducerOptions{Topic: root + topic, DisableBatching: true, SendTimeout: 5 * time.Second}
	switch topic {
	case "chaos-a", "chaos-p", "chaos-n":
		opts.DisableBatching, opts.BatchingMaxPublishDelay = false, 5*time.Millisecond
		opts.BatchingMaxMessages = map[string]uint{"chaos-a": 7, "chaos-p": 1000, "chaos-n": 3}[topic]
	case "chaos-c":
		opts.EnableChunking, opts.ChunkMaxMessageSize = true, chunkSize
	}
	return opts
}

// aroundFault closes every producer while no send is in flight, applies the fault and lets the
// producers be created again.
func (ps *producers) aroundFault(fault func()) {
	ps.gate.Lock()
	defer ps.gate.Unlock()
	ps.closeAll()
	fault()
}

func (ps *producers) closeAll() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for _, p := range ps.byName {
		p.Close()
	}
	if ps.client != nil {
		ps.client.Close()
	}
	ps.client, ps.byName = nil, nil
}

func (w *world) podsOf(g *group) int {
	n := 0
	for _, p := range w.pods {
		if p.group == g {
			n++
		}
	}
	return n
}

// podShape is a group and a pod kind: the run ends with as many pods of each as it began.
type podShape struct {
	group   *group
	sidecar bool
}

func (w *world) podsOfShape(s podShape) int {
	n := 0
	for _, p := range w.pods {
		if p.group == s.group && p.sidecar == s.sidecar {
			n++
		}
	}
	return n
}

func nopLogger() log.Logger { return log.DefaultNopLogger() }
