package controllers_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/subflow-dev/subflow/agent/protocol"
	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
	"github.com/subflow-dev/subflow/internal/testing/podsim"
)

// dependency creates a Deployment standing for what the consumers depend on, with its
// Available condition as given.
func dependency(t *testing.T, ns, name string, available corev1.ConditionStatus) *appsv1.Deployment {
	t.Helper()
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "db", Image: "db"}}}}}}
	create(t, d)
	setAvailable(t, d, available)
	return d
}

// setAvailable writes the Deployment's Available condition, as its controller would.
func setAvailable(t *testing.T, d *appsv1.Deployment, available corev1.ConditionStatus) {
	t.Helper()
	d.Status.Conditions = []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: available, Reason: "Test",
		LastUpdateTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if err := k8s.Status().Update(context.Background(), d); err != nil {
		t.Fatal(err)
	}
}

func whileDown(name string) subflowv1.PauseCondition {
	return subflowv1.PauseCondition{Name: name + "-down", ResumeAfter: &metav1.Duration{Duration: 10 * time.Second},
		Kubernetes: &subflowv1.ObjectConditionSource{APIVersion: "apps/v1", Kind: "Deployment", Name: name,
			ConditionType: "Available", Status: "False"}}
}

// clusterIPs routes connections to a Service's cluster IP and port to where a test's server
// listens, as kube-proxy does on a node (the test API server has none).
var clusterIPs serviceRoutes

type serviceRoutes struct{ routes sync.Map } // "ip:port" -> listening address

func (s *serviceRoutes) dial(ctx context.Context, network, address string) (net.Conn, error) {
	target, ok := s.routes.Load(address)
	if !ok {
		return nil, fmt.Errorf("dial %s: no route to the cluster IP", address)
	}
	return (&net.Dialer{}).DialContext(ctx, network, target.(string))
}

// healthEndpoint serves a dependency's health at a Service's cluster IP, answering status.
type healthEndpoint struct {
	status  atomic.Int32
	address string // the Service's cluster IP and port
	server  *httptest.Server
}

// serviceWithHealth creates a Service named name with port http (80) routed to a real HTTP
// server answering the endpoint's status at /ready.
func serviceWithHealth(t *testing.T, ns, name string) *healthEndpoint {
	t.Helper()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}}}
	create(t, svc)
	if svc.Spec.ClusterIP == "" {
		t.Fatal("the API server gave the Service no cluster IP")
	}
	h := &healthEndpoint{address: net.JoinHostPort(svc.Spec.ClusterIP, "80")}
	h.status.Store(http.StatusOK)
	h.serve(t)
	return h
}

// serve starts a server for the endpoint (again, after one was closed) and routes to it.
func (h *healthEndpoint) serve(t *testing.T) {
	h.server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/ready" {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		w.WriteHeader(int(h.status.Load()))
	}))
	t.Cleanup(h.server.Close)
	clusterIPs.routes.Store(h.address, h.server.Listener.Addr().String())
}

// later moves the reconciler's clock past a condition's interval and makes it reconcile.
func later(t *testing.T, flow *subflowv1.SubscriptionFlow, d time.Duration) {
	t.Helper()
	clock.SetTime(clock.Now().Add(d))
	poke(t, flow)
}

func conditionStatusOf(f *subflowv1.SubscriptionFlow) subflowv1.PauseConditionStatus {
	if len(f.Status.PauseWhen) != 1 {
		return subflowv1.PauseConditionStatus{}
	}
	return f.Status.PauseWhen[0]
}

// The scenario on a real API server: the database's Deployment becomes unavailable,
// the flow pauses its consumers by itself and says why; the Deployment deleted meanwhile
// (onError Hold) keeps the pause; available again, the flow resumes once resumeAfter of health
// has passed, and what was produced meanwhile is delivered.
func TestFlowPausesItselfWhileItsDependencyIsDown(t *testing.T) {
	defer clock.SetTime(time.Now())
	ns := namespace(t, true)
	topic := "guarded-" + ns
	p := startPod(t, ns, "worker-0", topic, testToken)
	db := dependency(t, ns, "orders-db", corev1.ConditionTrue)
	flow := newFlow(ns, "guarded", topic, subflowv1.StateRunning)
	flow.Spec.PauseWhen = []subflowv1.PauseCondition{whileDown("orders-db")}
	create(t, flow)
	waitFlow(t, flow, "the condition read healthy", func(f *subflowv1.SubscriptionFlow) bool {
		st := conditionStatusOf(f)
		return !st.Holds && st.Seen == "Available=True" && f.Status.EffectiveState == subflowv1.StateRunning &&
			condition(f, subflowv1.ConditionAutoPaused) != nil && condition(f, subflowv1.ConditionAutoPaused).Status == metav1.ConditionFalse
	})

	setAvailable(t, db, corev1.ConditionFalse)
	later(t, flow, 11*time.Second)
	got := waitFlow(t, flow, "paused by the condition", func(f *subflowv1.SubscriptionFlow) bool {
		return f.Status.EffectiveState == subflowv1.StatePaused && f.Status.StateSource == subflowv1.SourceCondition &&
			isTrue(f, subflowv1.ConditionAutoPaused) && isTrue(f, subflowv1.ConditionPaused)
	})
	if msg := condition(got, subflowv1.ConditionAutoPaused).Message; !strings.Contains(msg, "condition orders-db-down holds: Available=False") {
		t.Errorf("AutoPaused says %q, want it to name the condition and what was seen", msg)
	}
	eventually(t, "the pod's consumer paused", func() bool { return p.Consumer.State() == protocol.Paused })
	waitEvent(t, ns, "guarded", "AutoPaused", 1)
	produce(t, topic, "during", 3)

	if err := k8s.Delete(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	later(t, flow, 11*time.Second)
	waitFlow(t, flow, "the missing Deployment read as an error that holds the pause", func(f *subflowv1.SubscriptionFlow) bool {
		st := conditionStatusOf(f)
		return st.Holds && strings.Contains(st.Error, "Deployment orders-db not found") && f.Status.EffectiveState == subflowv1.StatePaused
	})
	if n := totalReceived(p); n != 0 {
		t.Fatalf("the application received %d messages while its dependency was down", n)
	}

	dependency(t, ns, "orders-db", corev1.ConditionTrue)
	later(t, flow, 11*time.Second)
	waitFlow(t, flow, "the first healthy reading", func(f *subflowv1.SubscriptionFlow) bool {
		c := condition(f, subflowv1.ConditionAutoPaused)
		return c != nil && strings.Contains(c.Message, "resumes at") && conditionStatusOf(f).Seen == "Available=False"
	})
	if f := getFlow(t, flow); f.Status.EffectiveState != subflowv1.StatePaused {
		t.Fatalf("resumed on the first healthy reading: %s by %s, want Paused until resumeAfter passed", f.Status.EffectiveState, f.Status.StateSource)
	}
	later(t, flow, 11*time.Second)
	waitFlow(t, flow, "resumed after resumeAfter of health", func(f *subflowv1.SubscriptionFlow) bool {
		return f.Status.EffectiveState == subflowv1.StateRunning && !conditionStatusOf(f).Holds &&
			condition(f, subflowv1.ConditionAutoPaused).Status == metav1.ConditionFalse
	})
	waitEvent(t, ns, "guarded", "AutoResumed", 1)
	eventually(t, "the messages produced during the outage delivered", func() bool { return totalReceived(p) == 3 },
		func() string { return fmt.Sprintf("%d received", totalReceived(p)) })
}

// A probe of a real HTTP server behind a Service: a 503 pauses the flow, a server that is gone
// (no answer) keeps it paused as unhealthy, not as missing data; a healthy answer resumes it
// after resumeAfter, and everything produced meanwhile is delivered.
func TestFlowPausesItselfWhileAServiceFailsItsProbe(t *testing.T) {
	defer clock.SetTime(time.Now())
	ns := namespace(t, true)
	topic := "probed-" + ns
	p := startPod(t, ns, "worker-0", topic, testToken)
	payments := serviceWithHealth(t, ns, "payments")
	flow := newFlow(ns, "probed", topic, subflowv1.StateRunning)
	flow.Spec.PauseWhen = []subflowv1.PauseCondition{{Name: "payments-unready", ResumeAfter: &metav1.Duration{Duration: 10 * time.Second},
		HTTP: &subflowv1.HTTPSource{Service: subflowv1.HTTPServiceReference{Name: "payments", Port: intstr.FromString("http"), Path: "/ready"}}}}
	create(t, flow)
	waitFlow(t, flow, "the probe read healthy", func(f *subflowv1.SubscriptionFlow) bool {
		st := conditionStatusOf(f)
		return !st.Holds && st.Seen == "HTTP 200" && f.Status.EffectiveState == subflowv1.StateRunning
	})

	payments.status.Store(http.StatusServiceUnavailable)
	later(t, flow, 11*time.Second)
	got := waitFlow(t, flow, "paused by the probe", func(f *subflowv1.SubscriptionFlow) bool {
		return f.Status.EffectiveState == subflowv1.StatePaused && f.Status.StateSource == subflowv1.SourceCondition && isTrue(f, subflowv1.ConditionPaused)
	})
	if msg := condition(got, subflowv1.ConditionAutoPaused).Message; !strings.Contains(msg, "condition payments-unready holds: HTTP 503") {
		t.Errorf("AutoPaused says %q, want it to name the condition and the answer", msg)
	}
	eventually(t, "the pod's consumer paused", func() bool { return p.Consumer.State() == protocol.Paused })
	produce(t, topic, "during", 3)

	payments.server.Close() // the dependency's pods are gone: nobody answers
	later(t, flow, 11*time.Second)
	// Status keeps the reading that decided; the latest is in the metrics: read now, no status
	// code, no error counted.
	eventually(t, "the probe read with no answer", func() bool {
		return flowSeries(t, "subflow_pause_condition_last_evaluation_timestamp_seconds", ns, "probed")[""] == float64(clock.Now().Unix()) &&
			flowSeries(t, "subflow_pause_condition_value", ns, "probed")[""] == 0
	})
	if st := conditionStatusOf(getFlow(t, flow)); !st.Holds || st.Error != "" || len(flowSeries(t, "subflow_pause_condition_errors_total", ns, "probed")) != 0 {
		t.Fatalf("no answer read as %+v, want it holding as unhealthy (not an error onError decides)", st)
	}
	if n := totalReceived(p); n != 0 {
		t.Fatalf("the application received %d messages while its dependency failed its probe", n)
	}

	payments.status.Store(http.StatusOK)
	payments.serve(t)
	later(t, flow, 11*time.Second)
	waitFlow(t, flow, "the first healthy reading", func(f *subflowv1.SubscriptionFlow) bool {
		c := condition(f, subflowv1.ConditionAutoPaused)
		return c != nil && strings.Contains(c.Message, "resumes at")
	})
	later(t, flow, 11*time.Second)
	waitFlow(t, flow, "resumed after resumeAfter of health", func(f *subflowv1.SubscriptionFlow) bool {
		return f.Status.EffectiveState == subflowv1.StateRunning && !conditionStatusOf(f).Holds
	})
	eventually(t, "the messages produced meanwhile delivered", func() bool { return totalReceived(p) == 3 },
		func() string { return fmt.Sprintf("%d received", totalReceived(p)) })
}

// An override still wins over a condition, and a Stopped flow stays Stopped while a condition
// holds; AutoPaused says the condition holds and what decides instead.
func TestOverrideAndStoppedWinOverACondition(t *testing.T) {
	defer clock.SetTime(time.Now())
	ns := namespace(t, true)
	dependency(t, ns, "orders-db", corev1.ConditionFalse)
	flow := newFlow(ns, "overridden", "overridden-"+ns, subflowv1.StateRunning)
	flow.Annotations = map[string]string{subflowv1.OverrideStateAnnotation: "Running"}
	flow.Spec.PauseWhen = []subflowv1.PauseCondition{whileDown("orders-db")}
	create(t, flow)
	got := waitFlow(t, flow, "the override decides", func(f *subflowv1.SubscriptionFlow) bool {
		return conditionStatusOf(f).Holds && f.Status.EffectiveState == subflowv1.StateRunning && f.Status.StateSource == subflowv1.SourceOverride
	})
	if msg := condition(got, subflowv1.ConditionAutoPaused).Message; !strings.Contains(msg, "the flow is Running by Override, which wins") {
		t.Errorf("AutoPaused says %q, want it to say the override wins", msg)
	}
	patchFlow(t, flow, `{"metadata":{"annotations":{"subflow.dev/override-state":null}},"spec":{"state":"Stopped"}}`)
	waitFlow(t, flow, "Stopped beats the condition's Paused", func(f *subflowv1.SubscriptionFlow) bool {
		return f.Status.EffectiveState == subflowv1.StateStopped && f.Status.StateSource == subflowv1.SourceSpec && conditionStatusOf(f).Holds
	})
	patchFlow(t, flow, `{"spec":{"pauseWhen":null,"state":"Running"}}`)
	waitFlow(t, flow, "no condition, no AutoPaused", func(f *subflowv1.SubscriptionFlow) bool {
		return f.Status.EffectiveState == subflowv1.StateRunning && len(f.Status.PauseWhen) == 0 && condition(f, subflowv1.ConditionAutoPaused) == nil
	})
}

// The watermark case: a low-priority subscription gives way while a high-priority one on the
// same topic lags. The pod's agent reads the other subscription's backlog from the broker's
// admin API and answers with it; past the threshold the flow pauses, and once the other
// subscription has caught up (at or below resumeBelow for resumeAfter) it runs again, with
// nothing delivered meanwhile and nothing lost.
func TestFlowGivesWayWhileAnotherSubscriptionLags(t *testing.T) {
	// The agent stamps its figures with the wall clock, and the controller judges their age by
	// its own: here both follow the wall clock, and the controller reads every second itself.
	realTime(t)
	ns := namespace(t, true)
	topic := "shared-" + ns
	fast := subscribe(t, topic, "orders-fast") // the high-priority subscription, not consuming yet
	p := startPodWith(t, ns, podsim.Options{Name: "worker-0", Token: testToken, Topic: topic, BacklogRefresh: 100 * time.Millisecond})
	flow := newFlow(ns, "low-priority", topic, subflowv1.StateRunning)
	flow.Spec.PauseWhen = []subflowv1.PauseCondition{{Name: "fast-lags", Interval: &metav1.Duration{Duration: time.Second},
		ResumeAfter: &metav1.Duration{Duration: 10 * time.Second},
		Backlog:     &subflowv1.BacklogSource{Subscription: "orders-fast", Above: 5, ResumeBelow: new(int64(1))}}}
	create(t, flow)
	step := func(what string, cond func(*subflowv1.SubscriptionFlow) bool) *subflowv1.SubscriptionFlow {
		t.Helper()
		var got *subflowv1.SubscriptionFlow
		eventually(t, what, func() bool { got = getFlow(t, flow); return cond(got) },
			func() string { return fmt.Sprintf("status %+v %+v", got.Status.PauseWhen, got.Status.Conditions) })
		return got
	}
	step("the other subscription read empty", func(f *subflowv1.SubscriptionFlow) bool {
		st := conditionStatusOf(f)
		return !st.Holds && st.Seen == "0 messages wait" && st.Error == "" && f.Status.EffectiveState == subflowv1.StateRunning
	})

	produce(t, topic, "burst", 10) // the worker takes them; orders-fast lags by 10
	got := step("paused while orders-fast lags", func(f *subflowv1.SubscriptionFlow) bool {
		return f.Status.EffectiveState == subflowv1.StatePaused && f.Status.StateSource == subflowv1.SourceCondition &&
			isTrue(f, subflowv1.ConditionAutoPaused)
	})
	if msg := condition(got, subflowv1.ConditionAutoPaused).Message; !strings.Contains(msg, "condition fast-lags holds: 10 messages wait") {
		t.Errorf("AutoPaused says %q, want it to name the condition and the backlog seen", msg)
	}
	eventually(t, "the pod's consumer paused", func() bool { return p.Consumer.State() == protocol.Paused })
	received := totalReceived(p)
	produce(t, topic, "during", 3)

	drain(t, fast, 13) // orders-fast catches up
	step("the first reading at or below resumeBelow", func(f *subflowv1.SubscriptionFlow) bool {
		c := condition(f, subflowv1.ConditionAutoPaused)
		return c != nil && strings.Contains(c.Message, "resumes at")
	})
	if n := totalReceived(p); n != received {
		t.Fatalf("the application received %d messages while orders-fast lagged", n-received)
	}
	step("resumed after resumeAfter of a caught-up orders-fast", func(f *subflowv1.SubscriptionFlow) bool {
		return f.Status.EffectiveState == subflowv1.StateRunning && !conditionStatusOf(f).Holds
	})
	waitEvent(t, ns, "low-priority", "AutoResumed", 1)
	eventually(t, "every message delivered", func() bool { return totalReceived(p) == 13 },
		func() string { return fmt.Sprintf("%d received", totalReceived(p)) })
}

// subscribe creates a durable subscription with a consumer of its own on the suite's broker.
func subscribe(t *testing.T, topic, subscription string) pulsar.Consumer {
	t.Helper()
	c, err := pulsar.NewClient(pulsar.ClientOptions{URL: broker.ServiceURL(), Logger: nopLogger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	consumer, err := c.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: subscription, Type: pulsar.Shared})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(consumer.Close)
	return consumer
}

// drain receives and acknowledges n messages.
func drain(t *testing.T, c pulsar.Consumer, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range n {
		msg, err := c.Receive(ctx)
		if err != nil {
			t.Fatalf("draining %s: %v", c.Subscription(), err)
		}
		if err := c.Ack(msg); err != nil {
			t.Fatal(err)
		}
	}
}

// A flow's conditions are read together, not one after the other: three probes of Services
// whose server answers only once all three are waiting get their answers (one after the other,
// each would wait alone, give up after 4 s and answer 503, pausing the flow - and the reconcile
// would take the sum of the reads).
func TestAFlowsConditionsAreReadTogether(t *testing.T) {
	defer clock.SetTime(time.Now())
	ns := namespace(t, true)
	var arrived atomic.Int32
	all := make(chan struct{})
	var once sync.Once
	barrier := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if arrived.Add(1) >= 3 {
			once.Do(func() { close(all) })
		}
		select {
		case <-all:
			w.WriteHeader(http.StatusOK)
		case <-time.After(4 * time.Second):
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(barrier.Close)
	flow := newFlow(ns, "together", "together-"+ns, subflowv1.StateRunning)
	for _, name := range []string{"a", "b", "c"} {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name}, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
		create(t, svc)
		clusterIPs.routes.Store(net.JoinHostPort(svc.Spec.ClusterIP, "80"), barrier.Listener.Addr().String())
		flow.Spec.PauseWhen = append(flow.Spec.PauseWhen, subflowv1.PauseCondition{Name: name + "-unready",
			HTTP: &subflowv1.HTTPSource{Service: subflowv1.HTTPServiceReference{Name: name, Port: intstr.FromString("http")},
				Timeout: &metav1.Duration{Duration: 5 * time.Second}}})
	}
	create(t, flow)
	got := waitFlow(t, flow, "every condition read", func(f *subflowv1.SubscriptionFlow) bool {
		if len(f.Status.PauseWhen) != 3 {
			return false
		}
		for _, st := range f.Status.PauseWhen {
			if st.Seen == "" {
				return false
			}
		}
		return true
	})
	for _, st := range got.Status.PauseWhen {
		if st.Seen != "HTTP 200" || st.Holds {
			t.Errorf("condition %s read %q (holds %v), want HTTP 200: the probes were not sent together", st.Name, st.Seen, st.Holds)
		}
	}
	if got.Status.EffectiveState != subflowv1.StateRunning {
		t.Errorf("the flow is %s by %s, want Running", got.Status.EffectiveState, got.Status.StateSource)
	}
}
