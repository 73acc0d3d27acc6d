package pausewhen

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

const clusterIP = "10.0.0.42"

// proberTo dials every address at the cluster IP to the test server, as kube-proxy would, and
// counts the connections to other addresses (there must be none).
func proberTo(t *testing.T, server *httptest.Server) (*Prober, *atomic.Int32) {
	t.Helper()
	elsewhere := &atomic.Int32{}
	target := server.Listener.Addr().String()
	return NewProber(func(ctx context.Context, network, address string) (net.Conn, error) {
		if !strings.HasPrefix(address, clusterIP+":") {
			elsewhere.Add(1)
			return nil, &net.OpError{Op: "dial", Net: network, Err: net.UnknownNetworkError("not the cluster IP")}
		}
		return (&net.Dialer{}).DialContext(ctx, network, target)
	}), elsewhere
}

func serviceReader(services ...*corev1.Service) client.Reader {
	objs := make([]client.Object, len(services))
	for i, s := range services {
		objs[i] = s
	}
	return fake.NewClientBuilder().WithObjects(objs...).Build()
}

func service(name string, mutate func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name},
		Spec: corev1.ServiceSpec{ClusterIP: clusterIP, Ports: []corev1.ServicePort{{Name: "http", Port: 8080}}}}
	if mutate != nil {
		mutate(s)
	}
	return s
}

func probe(name string, port intstr.IntOrString) Probe {
	return Probe{Namespace: "shop", Service: name, Port: port, Path: "/healthz", Timeout: time.Second, Healthy: DefaultHealthy}
}

// A Service's answer is judged by its status code, as a kubelet's probe judges it; the path and
// the port (by number or by name) are the ones asked for.
func TestProbeJudgesTheServicesAnswer(t *testing.T) {
	var status atomic.Int32
	status.Store(http.StatusOK)
	var paths atomic.Value
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths.Store(r.URL.RequestURI())
		w.WriteHeader(int(status.Load()))
	}))
	defer server.Close()
	pr, elsewhere := proberTo(t, server)
	r := serviceReader(service("payments", nil))
	now := time.Now()

	for _, tc := range []struct {
		port   intstr.IntOrString
		status int
		want   Verdict
		seen   string
	}{
		{intstr.FromInt32(8080), http.StatusOK, Healthy, "HTTP 200"},
		{intstr.FromString("http"), http.StatusNoContent, Healthy, "HTTP 204"},
		{intstr.FromInt32(8080), http.StatusServiceUnavailable, Unhealthy, "HTTP 503"},
		{intstr.FromInt32(8080), http.StatusNotFound, Unhealthy, "HTTP 404"},
	} {
		status.Store(int32(tc.status))
		got := probe("payments", tc.port).Read(context.Background(), r, pr, now)
		if got.Verdict != tc.want || got.Seen != tc.seen || got.Err != nil {
			t.Errorf("port %s answering %d: %s %q (err %v), want %s %q", tc.port.String(), tc.status, got.Verdict, got.Seen, got.Err, tc.want, tc.seen)
		}
		if p, _ := paths.Load().(string); p != "/healthz" {
			t.Errorf("probed %q, want /healthz", p)
		}
	}
	// Another flow's range judges the same answer its own way.
	status.Store(http.StatusServiceUnavailable)
	shared := probe("payments", intstr.FromInt32(8080)).Read(context.Background(), r, pr, now)
	if got := (StatusRange{Min: 200, Max: 503}).Judge(shared); got.Verdict != Healthy {
		t.Errorf("a 503 judged by 200-503: %s, want Healthy", got.Verdict)
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("%d connections went elsewhere than the Service's cluster IP", n)
	}
}

// A dependency that does not answer in time is unhealthy (the probe's own verdict, not missing
// data): a database whose pods are gone leaves its Service without endpoints.
func TestProbeWithoutAnAnswerIsUnhealthy(t *testing.T) {
	release := make(chan struct{})
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer server.Close()
	defer close(release)
	pr, _ := proberTo(t, server)
	p := probe("payments", intstr.FromInt32(8080))
	p.Timeout = 100 * time.Millisecond
	got := p.Read(context.Background(), serviceReader(service("payments", nil)), pr, time.Now())
	if got.Verdict != Unhealthy || got.Err != nil || !strings.Contains(got.Seen, "no answer: timed out") {
		t.Errorf("a hanging Service: %s %q (err %v), want Unhealthy, no answer: timed out", got.Verdict, got.Seen, got.Err)
	}

	closed := httptest.NewServer(http.NotFoundHandler())
	pr, _ = proberTo(t, closed)
	closed.Close()
	got = probe("payments", intstr.FromInt32(8080)).Read(context.Background(), serviceReader(service("payments", nil)), pr, time.Now())
	if got.Verdict != Unhealthy || !strings.Contains(got.Seen, "connection refused") {
		t.Errorf("a Service nobody listens behind: %s %q (err %v), want Unhealthy, connection refused", got.Verdict, got.Seen, got.Err)
	}
}

// A redirect is not followed - it could name any host - but judged as the answer it is; a large
// body is not read past a few KiB.
func TestProbeFollowsNoRedirect(t *testing.T) {
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			w.WriteHeader(http.StatusOK)
			for range 1024 {
				if _, err := w.Write(make([]byte, 64<<10)); err != nil {
					return // the probe closed the connection: it read no more
				}
			}
			return
		}
		http.Redirect(w, r, "http://169.254.169.254/latest/meta-data/", http.StatusFound)
	}))
	defer server.Close()
	pr, elsewhere := proberTo(t, server)
	r := serviceReader(service("payments", nil))
	got := probe("payments", intstr.FromInt32(8080)).Read(context.Background(), r, pr, time.Now())
	if got.Seen != "HTTP 302" || got.Verdict != Healthy {
		t.Errorf("a redirect: %s %q, want HTTP 302 judged Healthy (200-399) without following it", got.Verdict, got.Seen)
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("the redirect was followed: %d connections elsewhere", n)
	}
	big := probe("payments", intstr.FromInt32(8080))
	big.Path = "/big"
	if got := big.Read(context.Background(), r, pr, time.Now()); got.Verdict != Healthy {
		t.Errorf("a 64 MiB answer: %s %q (err %v), want Healthy", got.Verdict, got.Seen, got.Err)
	}
}

// What the controller cannot probe is missing data, left to onError: a Service that is not there,
// an ExternalName (it names any host: the controller calls only cluster IPs), a headless
// Service, a port the Service does not have.
func TestProbeOfWhatCannotBeProbedIsUnknown(t *testing.T) {
	server := httptest.NewServer(http.NotFoundHandler())
	defer server.Close()
	pr, elsewhere := proberTo(t, server)
	r := serviceReader(
		service("external", func(s *corev1.Service) {
			s.Spec = corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "metadata.example"}
		}),
		service("headless", func(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone }),
		service("payments", nil))
	for _, tc := range []struct {
		probe Probe
		err   string
	}{
		{probe("missing", intstr.FromInt32(8080)), "Service missing not found"},
		{probe("external", intstr.FromInt32(8080)), "is an ExternalName"},
		{probe("headless", intstr.FromInt32(8080)), "has no cluster IP (headless)"},
		{probe("payments", intstr.FromInt32(9090)), "has no port 9090"},
		{probe("payments", intstr.FromString("grpc")), "has no port grpc"},
	} {
		got := tc.probe.Read(context.Background(), r, pr, time.Now())
		if got.Verdict != Unknown || got.Err == nil || !strings.Contains(got.Err.Error(), tc.err) {
			t.Errorf("%s: %s (err %v), want Unknown with %q", tc.probe.Key(), got.Verdict, got.Err, tc.err)
		}
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("%d connections were made for Services that cannot be probed", n)
	}
}
