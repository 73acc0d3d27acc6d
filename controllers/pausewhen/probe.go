package pausewhen

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Probe is an HTTP GET of a Service in the flow's namespace, at its cluster IP: the dependency
// is unhealthy while it answers outside Healthy or not at all within Timeout, as a kubelet's
// probe judges. The controller calls only a Service's cluster IP, never a host a flow names: an
// ExternalName Service, which names any host, is refused.
type Probe struct {
	Namespace, Service string
	Port               intstr.IntOrString
	Path               string
	HTTPS              bool
	Timeout            time.Duration
	Healthy            StatusRange
}

// StatusRange is a range of HTTP status codes, both ends included.
type StatusRange struct{ Min, Max int }

// DefaultHealthy is the range a kubelet's probe takes as success.
var DefaultHealthy = StatusRange{Min: 200, Max: 399}

// Key names what is read; flows probing the same with other healthy ranges share the answer.
func (p Probe) Key() string {
	scheme := "http"
	if p.HTTPS {
		scheme = "https"
	}
	return fmt.Sprintf("probe %s %s/%s:%s%s %s", scheme, p.Namespace, p.Service, p.Port.String(), p.Path, p.Timeout)
}

// Prober sends the probes' requests (NewProber makes one).
type Prober struct{ plain, insecure *http.Client }

// maxProbeBody is what is read of an answer before it is closed: only the status counts.
const maxProbeBody = 4 << 10

// Read gets the Service (through r), sends the GET and judges the answer. A Service that is not
// there, has no cluster IP or has no such port is Unknown (onError decides); no answer in time
// is Unhealthy: the dependency did not answer.
func (p Probe) Read(ctx context.Context, r client.Reader, pr *Prober, now time.Time) Reading {
	address, err := p.address(ctx, r)
	if err != nil {
		return unknown(err, now)
	}
	ctx, cancel := context.WithTimeout(ctx, p.Timeout)
	defer cancel()
	scheme := "http"
	if p.HTTPS {
		scheme = "https"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+address+p.Path, nil)
	if err != nil {
		return unknown(fmt.Errorf("probe of Service %s: %w", p.Service, err), now)
	}
	req.Header.Set("User-Agent", "subflow-controller pause condition probe")
	resp, err := pr.client(p.HTTPS).Do(req)
	if err != nil {
		return Reading{Verdict: Unhealthy, Seen: "no answer: " + clipText(noAnswer(err), 200), At: now}
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxProbeBody))
	_ = resp.Body.Close()
	return p.Healthy.Judge(Reading{Seen: "HTTP " + strconv.Itoa(resp.StatusCode), Value: float64(resp.StatusCode), At: now})
}

// Judge says what a probe's answer (its status code in Value; 0 when there was none) means
// under the range: flows sharing one answer judge it by their own ranges.
func (s StatusRange) Judge(r Reading) Reading {
	if r.Err != nil || r.Verdict == Unknown {
		return r
	}
	code := int(r.Value)
	if code != 0 && code >= s.Min && code <= s.Max {
		r.Verdict = Healthy
	} else {
		r.Verdict = Unhealthy
	}
	return r
}

// address is the Service's cluster IP and the port's number.
func (p Probe) address(ctx context.Context, r client.Reader) (string, error) {
	svc := &corev1.Service{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: p.Service}, svc); err != nil {
		if apierrors.IsNotFound(err) {
			return "", fmt.Errorf("Service %s not found", p.Service)
		}
		return "", fmt.Errorf("Service %s: %w", p.Service, err)
	}
	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		return "", fmt.Errorf("Service %s is an ExternalName: the controller probes only cluster IPs", p.Service)
	case svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone:
		return "", fmt.Errorf("Service %s has no cluster IP (headless): name a Service with one", p.Service)
	}
	for _, port := range svc.Spec.Ports {
		if (p.Port.Type == intstr.Int && port.Port == p.Port.IntVal) || (p.Port.Type == intstr.String && port.Name == p.Port.StrVal) {
			return net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(port.Port))), nil
		}
	}
	return "", fmt.Errorf("Service %s has no port %s", p.Service, p.Port.String())
}

func (pr *Prober) client(insecure bool) *http.Client {
	if insecure {
		return pr.insecure
	}
	return pr.plain
}

// NewProber makes the clients: redirects are not followed (a redirect could name any host), and
// HTTPS is not verified, as a kubelet's probes do not verify it. dial connects to a Service's
// cluster IP and port (a net.Dialer when nil); a test on an API server without kube-proxy maps
// cluster IPs to where its servers listen.
func NewProber(dial func(ctx context.Context, network, address string) (net.Conn, error)) *Prober {
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	mk := func(tlsConfig *tls.Config) *http.Client {
		return &http.Client{
			Transport: &http.Transport{DialContext: dial, TLSClientConfig: tlsConfig, MaxIdleConnsPerHost: 1,
				IdleConnTimeout: time.Minute, ResponseHeaderTimeout: 5 * time.Second, MaxResponseHeaderBytes: 16 << 10},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	return &Prober{plain: mk(nil), insecure: mk(&tls.Config{InsecureSkipVerify: true})} //nolint:gosec // as a kubelet's probe
}

// noAnswer says why a request got no answer, without the URL the error repeats.
func noAnswer(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return "timed out"
	}
	var urlErr interface{ Unwrap() error }
	if errors.As(err, &urlErr) {
		if inner := urlErr.Unwrap(); inner != nil {
			return inner.Error()
		}
	}
	return err.Error()
}

func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
