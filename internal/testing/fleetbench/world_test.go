package fleetbench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/controllers"
	"github.com/subflow-dev/subflow/internal/testing/testenv"
)

const token = "fleetbench-token"

// shape is one benchmark's fleet.
type shape struct {
	flows, pods, hanging int  // pods and hanging pods per flow
	namespaces           int  // flows spread over this many namespaces
	shared               bool // every flow selects the same pods (the full resync)
	state                subflowv1.FlowState
}

// flowRef is one flow and the fake agents it should reach.
type flowRef struct {
	key    types.NamespacedName
	rule   string // the agents' key of its rule
	agents []*Agent
}

// world is one envtest control plane with a fleet of fake agents, their Pod objects and flows.
type world struct {
	c          client.WithWatch
	cfg        *rest.Config // the API server's, with admin credentials
	kubeconfig string
	dir        string
	fleet      *Fleet
	flows      []flowRef
	// ctrlPid is the running controller's; cpuTimed sums each process's CPU seconds ("cpu:NAME")
	// and the wall time ("cpu:wall") of the timed parts of rounds.
	ctrlPid  int
	cpuTimed Metrics
	patched  []time.Duration // per round, until every flow's patch was answered
	// answered is when each flow's patch of the current round was answered (zero: unknown, the
	// plugin patched it); lags are each flow's last agent told, from then: the controller's share.
	answered []time.Time
	lags     []time.Duration
	// reported are per round, until every flow's status showed the state (watched).
	reported []time.Duration
}

// timed runs the timed part of a round, adding the CPU each process used meanwhile.
func (w *world) timed(part func(start time.Time)) {
	before, start := sampleCPU(w.ctrlPid), time.Now()
	part(start)
	w.addCPU(before, sampleCPU(w.ctrlPid), time.Since(start))
}

func (w *world) addCPU(before, after cpuUse, wall time.Duration) {
	if w.cpuTimed == nil {
		w.cpuTimed = Metrics{}
	}
	w.cpuTimed["cpu:wall"] += wall.Seconds()
	for name, v := range after {
		w.cpuTimed["cpu:"+name] += v - before[name]
	}
}

// newWorld starts a control plane of its own (so that each shape's controller caches only its
// own objects) and creates the shape's namespaces, token Secrets, pods and flows.
func newWorld(b *testing.B, s shape) *world {
	b.Helper()
	env, cfg, err := startEnv()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = env.Stop() })
	cfg.QPS, cfg.Burst = -1, 0 // the harness must not be the bottleneck
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = subflowv1.AddToScheme(scheme)
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		b.Fatal(err)
	}
	w := &world{c: c, cfg: cfg, dir: b.TempDir()}
	w.kubeconfig = filepath.Join(w.dir, "kubeconfig")
	if err := testenv.WriteKubeconfig(w.kubeconfig, cfg); err != nil {
		b.Fatal(err)
	}
	agents := s.flows * s.pods
	if s.shared {
		agents = s.pods
	}
	if w.fleet, err = StartFleet(token, "agent", agents); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(w.fleet.Close)
	w.populate(b, s)
	return w
}

func (w *world) populate(b *testing.B, s shape) {
	ctx := context.Background()
	nsNames := make([]string, max(s.namespaces, 1))
	for i := range nsNames {
		nsNames[i] = fmt.Sprintf("fleet-%02d", i)
		must(b, w.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsNames[i]}}))
		must(b, w.c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: nsNames[i], Name: controllers.DefaultTokenSecret},
			Data: map[string][]byte{controllers.DefaultTokenKey: []byte(token)}}))
	}
	var pods []*corev1.Pod
	for f := range s.flows {
		ns, name := nsNames[f%len(nsNames)], fmt.Sprintf("flow-%04d", f)
		ref := flowRef{key: types.NamespacedName{Namespace: ns, Name: name}, rule: ns + "/" + name}
		label := map[string]string{"fleet-flow": name}
		if s.shared {
			label = map[string]string{"app": "worker"}
			ref.agents = w.fleet.Agents
		} else {
			ref.agents = w.fleet.Agents[f*s.pods : (f+1)*s.pods]
		}
		if !s.shared || f == 0 {
			for _, a := range ref.agents {
				pods = append(pods, podObject(ns, a.Name, a.IP, a.Port, label))
			}
			for h := range s.hanging {
				port, err := w.fleet.StartHanging()
				must(b, err)
				pods = append(pods, podObject(ns, fmt.Sprintf("hanging-%04d-%d", f, h), "127.0.0.1", port, label))
			}
		}
		w.flows = append(w.flows, ref)
	}
	w.createPods(b, pods)
	parallel(b, len(w.flows), func(i int) error {
		f := w.flows[i]
		flow := &subflowv1.SubscriptionFlow{
			ObjectMeta: metav1.ObjectMeta{Namespace: f.key.Namespace, Name: f.key.Name, Labels: map[string]string{"db": "orders"}},
			Spec: subflowv1.SubscriptionFlowSpec{Selector: metav1.LabelSelector{MatchLabels: map[string]string{"fleet-flow": f.key.Name}},
				Subscription: "sub-" + f.key.Name, State: s.state},
		}
		if s.shared {
			flow.Spec.Selector.MatchLabels = map[string]string{"app": "worker"}
		}
		return w.c.Create(ctx, flow)
	})
}

// podObject is a running pod whose agent port is port on ip, as the kubelet would report it.
func podObject(ns, name, ip string, port int, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "worker:1",
			Ports: []corev1.ContainerPort{{Name: protocol.PortName, ContainerPort: int32(port)}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			ContainerStatuses: []corev1.ContainerStatus{{Name: "app", Ready: true, Image: "worker:1", ImageID: "worker:1"}}},
	}
}

// createPods creates the pods and then sets their status (create ignores it).
func (w *world) createPods(b *testing.B, pods []*corev1.Pod) {
	ctx := context.Background()
	parallel(b, len(pods), func(i int) error {
		status := pods[i].Status
		if err := w.c.Create(ctx, pods[i]); err != nil {
			return err
		}
		pods[i].Status = status
		return w.c.Status().Update(ctx, pods[i])
	})
}

// parallel runs do(0..n-1) on 32 goroutines and fails b on the first error.
func parallel(b *testing.B, n int, do func(i int) error) {
	b.Helper()
	work := make(chan int)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := do(i); err != nil {
					errs <- err
				}
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

// patchAll applies one merge patch to every flow, concurrently, as many clients (or one fast
// one) would.
func (w *world) patchAll(b *testing.B, patch string) {
	ctx := context.Background()
	w.answered = make([]time.Time, len(w.flows))
	parallel(b, len(w.flows), func(i int) error {
		flow := &subflowv1.SubscriptionFlow{ObjectMeta: metav1.ObjectMeta{Namespace: w.flows[i].key.Namespace, Name: w.flows[i].key.Name}}
		err := w.c.Patch(ctx, flow, client.RawPatch(types.MergePatchType, []byte(patch)))
		w.answered[i] = time.Now()
		return err
	})
}

// awaitTold waits until every healthy agent of every flow was told want at or after start, and
// returns each agent's delay and the largest.
func (w *world) awaitTold(b *testing.B, want protocol.State, start time.Time, timeout time.Duration) (per []time.Duration, all time.Duration) {
	b.Helper()
	deadline := time.Now().Add(timeout)
	for i, f := range w.flows {
		var last time.Time
		for _, a := range f.agents {
			for {
				state, since := a.Told(f.rule)
				if state == want && !since.Before(start) {
					d := since.Sub(start)
					per, all, last = append(per, d), max(all, d), later(last, since)
					break
				}
				if time.Now().After(deadline) {
					b.Fatalf("%s not told %s for %s within %s (told %q)", a.Name, want, f.rule, timeout, state)
				}
				time.Sleep(time.Millisecond)
			}
		}
		if want == protocol.Paused && i < len(w.answered) && !w.answered[i].IsZero() {
			w.lags = append(w.lags, last.Sub(w.answered[i]))
		}
	}
	return per, all
}

// awaitSettled waits until every flow's status shows the current generation at effective
// state want and Ready (or, with hanging pods, not Ready only because of them), so that a
// round starts with the controller idle.
func (w *world) awaitSettled(b *testing.B, want subflowv1.FlowState, hanging bool, timeout time.Duration) {
	b.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var list subflowv1.SubscriptionFlowList
		must(b, w.c.List(context.Background(), &list))
		settled := 0
		for i := range list.Items {
			if w.settled(&list.Items[i], want, hanging) {
				settled++
			}
		}
		if settled == len(w.flows) {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d flows settled at %s within %s", settled, len(w.flows), want, timeout)
		}
		time.Sleep(100 * time.Millisecond) // untimed; a LIST of every flow is not cheap for the API server
	}
}

// settled tells whether f's status shows its current generation at effective state want, its
// healthy agents synced, and Ready (or, with hanging pods, not Ready only because of them).
func (w *world) settled(f *subflowv1.SubscriptionFlow, want subflowv1.FlowState, hanging bool) bool {
	ready := meta.IsStatusConditionTrue(f.Status.Conditions, subflowv1.ConditionReady)
	return f.Status.ObservedGeneration == f.Generation && f.Status.EffectiveState == want && (ready || hanging) &&
		int(f.Status.Pods.Synced) >= len(w.flowByKey(f))
}

// watchReported watches every flow from now on, noting when each one's status settled at want
// (see settled), and returns a function that waits for the last one. A watch, not a poll: its
// times are exact and it costs the API server nothing per poll.
func (w *world) watchReported(b *testing.B, want subflowv1.FlowState, hanging bool) func(timeout time.Duration) time.Time {
	b.Helper()
	var list subflowv1.SubscriptionFlowList
	must(b, w.c.List(context.Background(), &list))
	// The API server closes a watch that reads too slowly for a burst; a retry watcher resumes it.
	watcher, err := watchtools.NewRetryWatcherWithContext(context.Background(), list.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return w.c.Watch(ctx, &subflowv1.SubscriptionFlowList{}, &client.ListOptions{Raw: &opts})
		},
	})
	must(b, err)
	var last time.Time
	done := make(chan int, 1) // the flows reported
	go func() {
		at := map[types.NamespacedName]bool{}
		for ev := range watcher.ResultChan() {
			f, isFlow := ev.Object.(*subflowv1.SubscriptionFlow)
			if !isFlow {
				continue
			}
			if key := client.ObjectKeyFromObject(f); !at[key] && w.settled(f, want, hanging) {
				at[key], last = true, time.Now()
				if len(at) == len(w.flows) {
					break
				}
			}
		}
		done <- len(at)
	}()
	return func(timeout time.Duration) time.Time {
		timer := time.AfterFunc(timeout, watcher.Stop)
		defer timer.Stop()
		defer watcher.Stop()
		if n := <-done; n < len(w.flows) {
			b.Fatalf("%d of %d flows reported %s within %s", n, len(w.flows), want, timeout)
		}
		return last
	}
}

func (w *world) flowByKey(f *subflowv1.SubscriptionFlow) []*Agent {
	for _, ref := range w.flows {
		if ref.key.Namespace == f.Namespace && ref.key.Name == f.Name {
			return ref.agents
		}
	}
	return nil
}

// controllerLog is where a controller's output goes: FLEETBENCH_LOG_DIR if set, else the temp dir.
func (w *world) controllerLog(name string) string {
	dir := os.Getenv("FLEETBENCH_LOG_DIR")
	if dir == "" {
		dir = w.dir
	}
	return filepath.Join(dir, name+".log")
}

// startEnv starts envtest with the CRDs of config/crd/bases, or of FLEETBENCH_CRD_DIR (to
// measure a changed CRD, e.g. a list type, from another tree).
func startEnv() (*envtest.Environment, *rest.Config, error) {
	dir := os.Getenv("FLEETBENCH_CRD_DIR")
	if dir == "" {
		return testenv.Start()
	}
	assets, err := testenv.Assets()
	if err != nil {
		return nil, nil, err
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets, CRDDirectoryPaths: []string{dir}, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	return env, cfg, err
}

// apiServerProfile saves the API server's CPU profile of the next seconds (its /debug/pprof,
// on by default), to see what a round costs it.
func (w *world) apiServerProfile(seconds int, path string) error {
	cfg := rest.CopyConfig(w.cfg)
	cfg.NegotiatedSerializer, cfg.Timeout = clientgoscheme.Codecs.WithoutConversion(), time.Duration(seconds+30)*time.Second
	rc, err := rest.UnversionedRESTClientFor(cfg)
	if err != nil {
		return err
	}
	body, err := rc.Get().AbsPath("/debug/pprof/profile").Param("seconds", fmt.Sprint(seconds)).DoRaw(context.Background())
	if err != nil {
		return err
	}
	return os.WriteFile(path, body, 0o644)
}
