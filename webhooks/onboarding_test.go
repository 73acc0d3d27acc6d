package webhooks_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/controllers"
	"github.com/subflow-dev/subflow/internal/podsim"
	"github.com/subflow-dev/subflow/internal/pulsartest"
	"github.com/subflow-dev/subflow/webhooks"
)

// TestInjectedAgentPodIsPausedByAFlow is the acceptance for agent mode: a pod labelled
// for injection, created with only its application container, is reached and paused by a flow
// with no hand-written wiring. The test plays the kubelet: it materialises the injected token
// volume where the injected mount puts it and gives the pod its IP.
func TestInjectedAgentPodIsPausedByAFlow(t *testing.T) {
	broker, err := pulsartest.New(pulsartest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer broker.Close()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	startReconciler(ctx, t)
	ns := namespace(t, k8s)

	f := flow(ns, nil)
	f.Spec.Selector.MatchLabels = map[string]string{"app": "orders-worker"}
	f.Spec.State = subflowv1.StatePaused
	if err := k8s.Create(ctx, f); err != nil {
		t.Fatal(err)
	}

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
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(f), &got); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(got.Status.Conditions, subflowv1.ConditionPaused) {
			return fmt.Errorf("the flow's Paused condition is not True: %+v", got.Status.Conditions)
		}
		return nil
	})
}

// runAsKubelet writes the token files of the pod's Secret volumes under root at the paths its
// application container mounts them, once the Secrets exist, and reports the pod running.
func runAsKubelet(t *testing.T, root string, pod *corev1.Pod) {
	t.Helper()
	mounts := map[string]string{}
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	for _, v := range pod.Spec.Volumes {
		if v.Secret == nil || mounts[v.Name] == "" {
			continue
		}
		var secret corev1.Secret
		eventually(t, func() error {
			return k8s.Get(context.Background(), client.ObjectKey{Namespace: pod.Namespace, Name: v.Secret.SecretName}, &secret)
		})
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

// startReconciler runs the SubscriptionFlow controller as main.go does, as the controller's
// ServiceAccount.
func startReconciler(ctx context.Context, t *testing.T) {
	t.Helper()
	cfg := rest.CopyConfig(shared.cfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: controllerUser,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + controllerNamespace, "system:authenticated"}}
	skip := true // go test -count=n starts it n times in one process
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"},
		Client: controllers.ClientOptions(), Controller: config.Controller{SkipNameValidation: &skip}})
	if err != nil {
		t.Fatal(err)
	}
	err = (&controllers.SubscriptionFlowReconciler{Client: mgr.GetClient(), Scheme: scheme, Clock: clock.RealClock{},
		Agents: controllers.NewHTTPAgentClient(2*time.Second, nil), Recorder: mgr.GetEventRecorder("subflow-controller"),
		Resync: time.Hour}).SetupWithManager(mgr)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		if err := mgr.Start(ctx); err != nil && !errors.Is(err, context.Canceled) {
			fmt.Fprintln(os.Stderr, "controller:", err) // the test may be over: no t here
		}
	}()
}
