// Package teardown tests removing subflow from a cluster the way the README says, with the
// Makefile's own targets and kubectl, against a real API server, a running controller and a
// simulated consumer pod: no order strands the CRD, and pods are resumed, or told why not.
package teardown

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/controllers"
	"github.com/subflow-dev/subflow/internal/testing/podsim"
	"github.com/subflow-dev/subflow/internal/testing/pulsartest"
	"github.com/subflow-dev/subflow/internal/testing/testenv"
	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

const token = "teardown-token"

// cluster is one test's API server, broker and kubeconfig.
type cluster struct {
	t          *testing.T
	cfg        *rest.Config
	k8s        client.Client
	broker     *pulsartest.Broker
	kubeconfig string
	path       string // PATH with kubectl
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	assets, err := testenv.Assets()
	if err != nil {
		t.Fatal(err)
	}
	path := assets + string(os.PathListSeparator) + os.Getenv("PATH")
	if _, err := exec.LookPath("kubectl"); err != nil {
		if _, err := os.Stat(filepath.Join(assets, "kubectl")); err != nil {
			t.Skip("no kubectl on PATH or with the envtest binaries: the Makefile's teardown targets run kubectl")
		}
	}
	env, cfg, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	broker, err := pulsartest.New(pulsartest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = broker.Close() })
	k8s, err := testenv.Client(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, cfg: cfg, k8s: k8s, broker: broker, path: path, kubeconfig: filepath.Join(t.TempDir(), "kubeconfig")}
	c.finalizeNamespaces()
	if err := testenv.WriteKubeconfig(c.kubeconfig, cfg); err != nil {
		t.Fatal(err)
	}
	return c
}

// finalizeNamespaces stands in for the namespace controller, which envtest does not run: a
// namespace being deleted is finalized, so that kubectl delete of the manifests returns.
func (c *cluster) finalizeNamespaces() {
	clientset := kubernetes.NewForConfigOrDie(c.cfg)
	ctx, cancel := context.WithCancel(context.Background())
	c.t.Cleanup(cancel)
	go func() {
		for ctx.Err() == nil {
			list, err := clientset.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
			for i := range list.Items {
				if ns := &list.Items[i]; err == nil && !ns.DeletionTimestamp.IsZero() && len(ns.Spec.Finalizers) > 0 {
					ns.Spec.Finalizers = nil
					_, _ = clientset.CoreV1().Namespaces().Finalize(ctx, ns, metav1.UpdateOptions{})
				}
			}
			time.Sleep(50 * time.Millisecond) // polling pace
		}
	}()
}

// startController runs the controller until the returned stop is called (or the test ends).
func (c *cluster) startController() (stop func()) {
	c.t.Helper()
	stop, err := testenv.StartController(c.cfg, testenv.ControllerOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(stop)
	return stop
}

// pausedPod creates a namespace with a consumer pod and a flow that pauses it, and waits until
// it is paused.
func (c *cluster) pausedPod() *podsim.Pod {
	c.t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "teardown-"}}
	must(c.t, c.k8s.Create(ctx, ns))
	must(c.t, c.k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: controllers.DefaultTokenSecret},
		Data: map[string][]byte{controllers.DefaultTokenKey: []byte(token)}}))
	p, err := podsim.Start(podsim.Options{Name: "worker-0", ServiceURL: c.broker.ServiceURL(), AdminURL: c.broker.AdminURL(),
		Token: token, Topic: "teardown-" + ns.Name, Subscription: "ingest", Type: pulsar.Shared})
	must(c.t, err)
	c.t.Cleanup(p.Close)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "worker-0", Labels: map[string]string{"app": "worker"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "worker:1",
			Ports: []corev1.ContainerPort{{Name: protocol.PortName, ContainerPort: int32(p.Port)}}}}}}
	must(c.t, c.k8s.Create(ctx, pod))
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1",
		ContainerStatuses: []corev1.ContainerStatus{{Name: "app", Ready: true, Image: "worker:1", ImageID: "worker:1"}}}
	must(c.t, c.k8s.Status().Update(ctx, pod))
	must(c.t, c.k8s.Create(ctx, &subflowv1.SubscriptionFlow{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "ingest"},
		Spec: subflowv1.SubscriptionFlowSpec{Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "worker"}},
			Subscription: "ingest", State: subflowv1.StatePaused}}))
	poll.Eventually(c.t, "the consumer paused", func() bool { return p.Consumer.State() == protocol.Paused })
	return p
}

// make runs a target of the repository's Makefile against the cluster.
func (c *cluster) make(env []string, target string) (string, error) {
	cmd := exec.Command("make", "--no-print-directory", "-C", testenv.RepoRoot(), target)
	cmd.Env = append(os.Environ(), append(env, "KUBECONFIG="+c.kubeconfig, "PATH="+c.path)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (c *cluster) crdGone() bool {
	err := c.k8s.Get(context.Background(), client.ObjectKey{Name: "subscriptionflows.subflow.dev"}, &apiextensionsv1.CustomResourceDefinition{})
	return apierrors.IsNotFound(err)
}

// runsWithItsDeployment stops the controller the moment its Deployment starts going, as its
// pod would, and returns how many flows were left at that moment.
func (c *cluster) runsWithItsDeployment(stop func()) <-chan int {
	left := make(chan int, 1)
	go func() {
		defer stop()
		key := client.ObjectKey{Namespace: "subflow-system", Name: "subflow-controller"}
		for {
			var d appsv1.Deployment
			err := c.k8s.Get(context.Background(), key, &d)
			if apierrors.IsNotFound(err) || (err == nil && !d.DeletionTimestamp.IsZero()) {
				var flows subflowv1.SubscriptionFlowList
				_ = c.k8s.List(context.Background(), &flows) // no CRD: no flows
				left <- len(flows.Items)
				return
			}
			time.Sleep(5 * time.Millisecond) // polling pace
		}
	}()
	return left
}

// The README's order, make deploy, later make undeploy then make uninstall. The controller runs
// until its Deployment goes, as its pod would: undeploy deletes the flows first, while it still
// releases their pods, so the pod runs again, no flow is left when the controller stops, and
// the CRD is gone.
func TestUndeployThenUninstallResumesPodsAndRemovesTheCRD(t *testing.T) {
	c := newCluster(t)
	if out, err := c.make([]string{"IMG=example.test/subflow:teardown"}, "deploy"); err != nil {
		t.Fatalf("make deploy: %v\n%s", err, out)
	}
	left := c.runsWithItsDeployment(c.startController())
	p := c.pausedPod()
	if out, err := c.make(nil, "undeploy"); err != nil {
		t.Fatalf("make undeploy: %v\n%s", err, out)
	}
	if n := <-left; n != 0 {
		t.Fatalf("%d flows were left when the controller's Deployment went: nothing would release their pods", n)
	}
	if p.Consumer.State() != protocol.Running {
		t.Fatalf("after make undeploy the consumer is %s, want Running", p.Consumer.State())
	}
	poll.Eventually(t, "the CRD gone", c.crdGone)
	if out, err := c.make(nil, "uninstall"); err != nil {
		t.Fatalf("make uninstall after undeploy: %v\n%s", err, out)
	}
}

// The controller is already gone: make uninstall does not leave the CRD Terminating. It waits a
// bounded time, says why it cannot go on and what to do, and removes nothing; once a controller
// runs again it completes and the pod runs. With FORCE=1 and no controller it completes too,
// leaving the pod paused, as it says.
func TestUninstallWithoutAControllerNeverStrandsTheCRD(t *testing.T) {
	c := newCluster(t)
	stop := c.startController()
	p := c.pausedPod()
	stop()
	out, err := c.make([]string{"RELEASE_TIMEOUT=3s"}, "uninstall")
	if err == nil || !strings.Contains(out, "still terminating") || !strings.Contains(out, "FORCE=1") {
		t.Fatalf("make uninstall without a controller: err %v\n%s", err, out)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	must(t, c.k8s.Get(context.Background(), client.ObjectKey{Name: "subscriptionflows.subflow.dev"}, &crd))
	if !crd.DeletionTimestamp.IsZero() {
		t.Fatal("the CRD is terminating: it would wait for a controller that does not run")
	}
	stop = c.startController()
	if out, err := c.make(nil, "uninstall"); err != nil {
		t.Fatalf("make uninstall once the controller runs: %v\n%s", err, out)
	}
	if p.Consumer.State() != protocol.Running || !c.crdGone() {
		t.Fatalf("consumer %s, CRD gone %v", p.Consumer.State(), c.crdGone())
	}

	// FORCE=1: the controller is gone for good. Left running, it would put its finalizer back
	// on the flow or release the pod the moment the flow goes.
	stop()
	if out, err := c.make(nil, "install"); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	poll.Eventually(t, "the CRD served", func() bool {
		return c.k8s.List(context.Background(), &subflowv1.SubscriptionFlowList{}) == nil
	})
	stop = c.startController()
	q := c.pausedPod()
	stop()
	if out, err := c.make([]string{"FORCE=1"}, "uninstall"); err != nil || !strings.Contains(out, "removing the finalizers") {
		t.Fatalf("make uninstall FORCE=1: %v\n%s", err, out)
	}
	if !c.crdGone() || q.Consumer.State() != protocol.Paused {
		t.Fatalf("FORCE=1: CRD gone %v, consumer %s (want left Paused)", c.crdGone(), q.Consumer.State())
	}
}

// poll is how the tests wait for the API server and the controller.
var poll = testkit.Poll{Within: 30 * time.Second, Every: 20 * time.Millisecond}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
