package pausewhen

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ObjectCondition is a condition of an object in the flow's own namespace: the dependency is
// unhealthy while the condition's status is Status (a Deployment's Available False, a database
// cluster's Ready False).
type ObjectCondition struct {
	APIVersion, Kind, Namespace, Name string
	ConditionType, Status             string
}

// Key names what is read, so that flows asking the same share one read.
func (c ObjectCondition) Key() string {
	return fmt.Sprintf("object %s %s %s/%s %s", c.APIVersion, c.Kind, c.Namespace, c.Name, c.ConditionType)
}

// Read gets the object (through r, which may be a cache) and judges its condition. An object
// or a condition that is not there is Unknown: OnError decides.
func (c ObjectCondition) Read(ctx context.Context, r client.Reader, now time.Time) Reading {
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(schema.FromAPIVersionAndKind(c.APIVersion, c.Kind))
	if err := r.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: c.Name}, obj); err != nil {
		if apierrors.IsNotFound(err) {
			err = fmt.Errorf("%s %s not found", c.Kind, c.Name)
		}
		return unknown(err, now)
	}
	conditions, _, err := unstructured.NestedSlice(obj.Object, "status", "conditions")
	if err != nil {
		return unknown(fmt.Errorf("%s %s: status.conditions: %w", c.Kind, c.Name, err), now)
	}
	for _, item := range conditions {
		cond, ok := item.(map[string]any)
		if !ok || cond["type"] != c.ConditionType {
			continue
		}
		status, _ := cond["status"].(string)
		r := Reading{Verdict: Healthy, Seen: c.ConditionType + "=" + status, At: now}
		if status == c.Status {
			r.Verdict = Unhealthy
		}
		return r
	}
	return unknown(fmt.Errorf("%s %s has no condition %s", c.Kind, c.Name, c.ConditionType), now)
}

// Query is a PromQL instant query against the Prometheus the controller is configured with
// (never an address from a flow: a tenant cannot point the controller at a host of its
// choosing). It must return one sample; Thresholds judge it.
type Query struct {
	PromQL     string
	Thresholds Thresholds
}

// Key names what is read; flows asking the same query with other thresholds share the read.
func (q Query) Key() string { return "promql " + q.PromQL }

// Prometheus reads instant queries from one Prometheus server's HTTP API.
type Prometheus struct{ api promv1.API }

// NewPrometheus is a client of the Prometheus at address (http://host:port).
func NewPrometheus(address string) (*Prometheus, error) {
	c, err := promapi.NewClient(promapi.Config{Address: address})
	if err != nil {
		return nil, err
	}
	return &Prometheus{api: promv1.NewAPI(c)}, nil
}

// Value runs the query at now and returns its one sample. No sample (the series is absent, or
// stale), more than one, or a NaN is an error: a missing value is not a healthy one.
func (p *Prometheus) Value(ctx context.Context, promql string, now time.Time) (float64, error) {
	v, _, _, err := p.api.Query(ctx, promql, now)
	if err != nil {
		return 0, fmt.Errorf("query %q: %w", promql, err)
	}
	switch v := v.(type) {
	case model.Vector:
		if len(v) != 1 {
			return 0, fmt.Errorf("query %q returned %d series, want 1", promql, len(v))
		}
		return float64(v[0].Value), nil
	case *model.Scalar:
		return float64(v.Value), nil
	}
	return 0, fmt.Errorf("query %q returned a %s, want a vector of one series or a scalar", promql, v.Type())
}

// Read judges the query's value by its thresholds.
func (q Query) Read(ctx context.Context, p *Prometheus, now time.Time) Reading {
	if p == nil {
		return unknown(errors.New("the controller has no Prometheus configured (--prometheus-url)"), now)
	}
	value, err := p.Value(ctx, q.PromQL, now)
	if err != nil {
		return unknown(err, now)
	}
	r := Reading{Verdict: q.Thresholds.Judge(value), Seen: strconv.FormatFloat(value, 'g', -1, 64), Value: value, At: now}
	if r.Verdict == Unknown {
		r.Err = fmt.Errorf("query %q returned %v", q.PromQL, value)
	}
	return r
}

func unknown(err error, now time.Time) Reading {
	return Reading{Verdict: Unknown, Err: err, At: now}
}
