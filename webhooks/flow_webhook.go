package webhooks

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	promql "github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// A typo in an incident pause must not pass silently, yet a controller that is down must never
// stop an engineer from pausing: failurePolicy Ignore. Without the webhook the controller's
// InvalidSpec report stays the safety net. The API server calls it only when the annotations
// change (matchConditions), so a spec.state pause, a finalizer or a label never waits on a
// controller that hangs.
// The same holds for spec.pauseWhen's PromQL queries, which no schema can parse: the call is
// also made when spec.pauseWhen changes.
// +kubebuilder:webhook:path=/validate-subflow-dev-v1alpha1-subscriptionflow,mutating=false,failurePolicy=ignore,sideEffects=None,groups=subflow.dev,resources=subscriptionflows,verbs=create;update,versions=v1alpha1,name=flows.subflow.dev,admissionReviewVersions=v1,timeoutSeconds=5,patch=`{"matchConditions":[{"name":"annotations-or-conditions-changed","expression":"request.operation == 'CREATE' || !has(object.metadata.annotations) || !has(oldObject.metadata.annotations) || object.metadata.annotations != oldObject.metadata.annotations || (has(object.spec.pauseWhen) && (!has(oldObject.spec.pauseWhen) || object.spec.pauseWhen != oldObject.spec.pauseWhen))"}]}`

// FlowValidator refuses override annotations the controller could not apply, and
// spec.pauseWhen queries that are not PromQL.
type FlowValidator struct {
	// Now tells the time, for the warning about an override that has already ended.
	Now func() time.Time
}

var knownAnnotations = []string{subflowv1.OverrideStateAnnotation, subflowv1.OverrideUntilAnnotation, subflowv1.OverrideReasonAnnotation}

// ValidateCreate checks every subflow.dev annotation of a new flow.
func (v *FlowValidator) ValidateCreate(_ context.Context, flow *subflowv1.SubscriptionFlow) (admission.Warnings, error) {
	warnings, err := v.validate(nil, flow.Annotations)
	return warnings, errors.Join(err, validQueries(nil, flow.Spec.PauseWhen))
}

// ValidateUpdate checks only the annotations the update changes: a value stored before the
// webhook existed must not block unrelated updates, such as the controller removing its
// finalizer; the controller keeps reporting it.
func (v *FlowValidator) ValidateUpdate(_ context.Context, old, flow *subflowv1.SubscriptionFlow) (admission.Warnings, error) {
	warnings, err := v.validate(old.Annotations, flow.Annotations)
	return warnings, errors.Join(err, validQueries(old.Spec.PauseWhen, flow.Spec.PauseWhen))
}

// validQueries parses, with Prometheus's own parser, the PromQL of each condition that is new
// or changed (a query stored before would not block unrelated updates: the controller reports
// it as the condition's error).
func validQueries(old, conditions []subflowv1.PauseCondition) error {
	var errs []string
	for i, c := range conditions {
		if c.Prometheus == nil {
			continue
		}
		unchanged := slices.ContainsFunc(old, func(o subflowv1.PauseCondition) bool {
			return o.Prometheus != nil && o.Prometheus.Query == c.Prometheus.Query
		})
		if unchanged {
			continue
		}
		if _, err := promql.NewParser(promql.Options{}).ParseExpr(c.Prometheus.Query); err != nil {
			errs = append(errs, fmt.Sprintf("spec.pauseWhen[%d].prometheus.query is not PromQL: %v", i, err))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return errors.New(strings.Join(errs, "; "))
}

// ValidateDelete allows every deletion.
func (v *FlowValidator) ValidateDelete(context.Context, *subflowv1.SubscriptionFlow) (admission.Warnings, error) {
	return nil, nil
}

func (v *FlowValidator) validate(old, annotations map[string]string) (admission.Warnings, error) {
	changed := func(key string) bool {
		value, ok := annotations[key]
		oldValue, oldOK := old[key]
		return ok && (!oldOK || value != oldValue)
	}
	var errs []string
	var warnings admission.Warnings
	state, hasState := annotations[subflowv1.OverrideStateAnnotation]
	if changed(subflowv1.OverrideStateAnnotation) && state != "" {
		if _, err := subflowv1.ParseOverrideState(state); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if until := annotations[subflowv1.OverrideUntilAnnotation]; changed(subflowv1.OverrideUntilAnnotation) && until != "" {
		end, err := subflowv1.ParseOverrideUntil(until)
		switch {
		case err != nil:
			errs = append(errs, err.Error())
		case !hasState || state == "":
			warnings = append(warnings, fmt.Sprintf("annotation %s has no effect without %s", subflowv1.OverrideUntilAnnotation, subflowv1.OverrideStateAnnotation))
		case !end.After(v.now()):
			// Refusing would break re-applying an old manifest; the controller ignores it and says so.
			warnings = append(warnings, fmt.Sprintf("annotation %s=%s has already passed: the override is ignored", subflowv1.OverrideUntilAnnotation, until))
		}
	}
	for _, key := range slices.Sorted(maps.Keys(annotations)) {
		if strings.HasPrefix(key, "subflow.dev/") && changed(key) && !slices.Contains(knownAnnotations, key) {
			warnings = append(warnings, fmt.Sprintf("annotation %s is not one subflow reads (%s)", key, strings.Join(knownAnnotations, ", ")))
		}
	}
	if len(errs) > 0 {
		return warnings, errors.New(strings.Join(errs, "; "))
	}
	return warnings, nil
}

func (v *FlowValidator) now() time.Time {
	if v.Now == nil {
		return time.Now()
	}
	return v.Now()
}
